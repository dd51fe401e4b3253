// qgemm explain: what the selector would choose for a GEMM, and why — every candidate with its
// verdict (the reason it cannot serve, or its predicted time by parts) and the winner.
//
//   qgemm explain --scheme S --m M --n N --k K [--m-max M2] [--arch A] [--sms S] [--input T]
//                 [--prequantized] [--bias] [--a-alignment B] [--json]
//
// Needs no GPU: the weight is judged from the scheme alone (what prepare_weight would make of
// it), the rates are the cost model's for the target. On a machine with a GPU and no --arch,
// device 0's target, SM count and shared-memory limits are used, with the active tuning table
// (QGEMM_TUNING_TABLE) where it belongs to that machine. --json prints
//   {"candidates": [...], "winner": {"name", "path", "kernel", "predicted_us", "reason"}}
// for one M, or {"buckets": [that, ...]} with --m-max.
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "command.hpp"
#include "dispatch/candidate_launch.hpp"
#include "dispatch/select.hpp"
#include "qgemm/engine.hpp"
#include "dispatch/tuned_config.hpp"
#include "qgemm/error.hpp"
#include "runtime/driver.hpp"

namespace qgemm::cli {
namespace {

struct ExplainOptions {
  std::string scheme;
  std::int64_t m = 0, m_max = 0, n = 0, k = 0;
  std::string arch;
  int sms = 0;
  std::string input = "bf16";
  bool prequantized = false, bias = false, json = false;
  int a_alignment = 16;
  int c_alignment = 16;
  int experts = 0;  // > 0: a grouped (MoE) GEMM; --m counts the routed slots
};

int run(const ExplainOptions& options) {
  GemmProblem problem;
  problem.scheme = parse_scheme(options.scheme);
  problem.m = options.m;
  problem.m_max = options.m_max;
  problem.n = options.n;
  problem.k = options.k;
  problem.prequantized = options.prequantized;
  problem.input = options.prequantized ? problem.scheme.activation.format
                                       : parse_format(options.input);
  if (!problem.scheme.activation.is_quantized()) problem.scheme.activation.format = problem.input;
  problem.bias = options.bias;
  problem.a_alignment = options.a_alignment;
  problem.c_alignment = options.c_alignment;
  problem.experts = options.experts;
  validate(problem);

  // The target: --arch (and --sms), else device 0 when there is one, else the H200.
  dispatch::SelectionContext context;
  std::shared_ptr<const dispatch::TuningTable> table;
  std::string target;
  std::string why_no_gpu;
  if (options.arch.empty() && runtime::Driver::available(&why_no_gpu) &&
      runtime::device_count() > 0) {
    const runtime::DeviceInfo device = runtime::device_info(0);
    context.gpu = dispatch::GpuLimits::of_device(device);
    table = dispatch::applicable_tuning_table(device);
    target = fmt::format("device 0 ({}, {} SMs)", device.name, device.sm_count);
  } else {
    const jit::Arch arch = jit::parse_arch(options.arch.empty() ? "sm_90a" : options.arch);
    const int sms = options.sms > 0 ? options.sms : 132;
    context.gpu = dispatch::GpuLimits::of_arch(arch, sms);
    target = fmt::format("{} with {} SMs{}", jit::arch_name(arch), sms,
                         options.arch.empty() ? " (no GPU here: the H200's)" : "");
  }
  if (options.sms > 0) context.gpu.sm_count = options.sms;
  context.rates = dispatch::GpuRates::of(context.gpu);
  context.table = table.get();
  dispatch::WeightFacts weight =
      dispatch::WeightFacts::of_scheme(problem.scheme, problem.n, problem.k, context.gpu.arch);
  // The layouts a prepared weight holds: prepare_weight's with its default max_rows; experts
  // keep one order, as Engine::prepare_experts' auto layout (the wgmma order where the SM90
  // family takes the weight, else the mma layout).
  if (problem.experts == 0) {
    weight = dispatch::keep_layouts(
        weight, dispatch::kept_layouts(problem, weight, kPrepareMaxRows, context));
  } else {
    const auto order = weight.wgmma ? layout::FragmentOrder::Wgmma : layout::FragmentOrder::Mma;
    weight = dispatch::expert_facts(std::move(weight), order, std::nullopt,
                                    "experts keep one order (prepare_experts' auto layout)");
  }

  nlohmann::ordered_json buckets = nlohmann::ordered_json::array();
  if (!options.json)
    fmt::print("qgemm explain  {}  N = {}  K = {}  on {}\n", to_string(problem.scheme), problem.n,
               problem.k, target);
  if (problem.experts > 0) context.table = nullptr;  // the tables hold dense measurements
  for (const auto& [low, high] : dispatch::m_buckets(problem)) {
    // A grouped GEMM is ranked as the dense GEMM it costs (as Engine::plan does).
    const std::optional<dispatch::GroupedView> grouped =
        problem.experts > 0 ? std::optional(dispatch::grouped_view(problem, weight, high))
                            : std::nullopt;
    if (grouped && !options.json)
      fmt::print("\ngrouped: {} slots over {} experts, ranked as N = {} against M = {}\n", high,
                 problem.experts, grouped->problem.n, grouped->m);
    const dispatch::Selection selection =
        grouped ? dispatch::select(grouped->problem, grouped->m, grouped->weight, context)
                : dispatch::select(problem, high, weight, context);
    const dispatch::CandidateLaunch launch =
        dispatch::candidate_launch(problem, high, selection.chosen(), weight, context.gpu, 0.0);
    if (options.json) {
      nlohmann::ordered_json one = nlohmann::ordered_json::parse(dispatch::selection_json(selection));
      one["winner"]["kernel"] = launch.text();
      if (low != high) one["m_low"] = low;
      buckets.push_back(std::move(one));
    } else {
      if (low != high) fmt::print("\nM {}..{} (judged at its largest M)\n", low, high);
      fmt::print("\n{}  kernel: {}\n", dispatch::selection_text(selection), launch.text());
    }
  }
  if (options.json) {
    if (buckets.size() == 1) {
      fmt::print("{}\n", buckets[0].dump(2));
    } else {
      fmt::print("{}\n", nlohmann::ordered_json{{"buckets", buckets}}.dump(2));
    }
  }
  return kExitOk;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<ExplainOptions>();
  CLI::App* command = app.add_subcommand(
      "explain",
      "Show every candidate kernel for a GEMM with its verdict (why it cannot serve, or its "
      "predicted time) and the one the selector picks; needs no GPU");
  command->add_option("--scheme", options->scheme, "Preset name or compact text form")->required();
  command->add_option("--m", options->m, "Rows of A (tokens)")->required();
  command->add_option("--m-max", options->m_max, "Plan for every M in [m, m-max]");
  command->add_option("--n", options->n, "Output features (rows of W)")->required();
  command->add_option("--k", options->k, "Input features")->required();
  command->add_option("--arch", options->arch,
                      "Target (sm_80, sm_89, sm_90a, ...); default: device 0, else sm_90a");
  command->add_option("--sms", options->sms, "SM count of the target (default: its usual one)");
  command->add_option("--input", options->input, "A's type when not pre-quantized: bf16 or fp16");
  command->add_flag("--prequantized", options->prequantized,
                    "A comes as codes quantized beforehand (a DeviceActivation)");
  command->add_flag("--bias", options->bias, "The call adds a bias");
  command->add_option("--experts", options->experts,
                      "A grouped (MoE) GEMM over this many experts (--m: routed slots)");
  command->add_option("--a-alignment", options->a_alignment,
                      "Bytes (1-16, a power of two) dividing A's address and row stride");
  command->add_option("--c-alignment", options->c_alignment,
                      "Bytes (1-16, a power of two) dividing C's address");
  command->add_flag("--json", options->json, "Print JSON");
  command->callback([options, &status] {
    try {
      status = run(*options);
    } catch (const Error& error) {
      status = report_error("explain", error);
    }
  });
});

}  // namespace
}  // namespace qgemm::cli
