// qgemm check: is a backend's quantized GEMM within what the formats allow?
//
//   qgemm check --scheme S --m M --n N --k K [--backend auto|cpu|gpu] [--seed X] [--json]
//               [--a-pad P] [--a-offset O] [--c-pad P] [--c-offset O]
//   qgemm check --moe --scheme S --m TOKENS --k HIDDEN --n INTER --experts E --top-k T
//               [--glu silu|gelu|clamped-swiglu] [--bias] [--backend ...] [--seed X] [--json]
//
// --moe checks a whole routed expert layer (Engine::moe: gate_up [2·INTER, HIDDEN] and down
// [HIDDEN, INTER] per expert, S's 16-bit activations and output) on random weights, hidden
// states and routings, element by element against reference::moe_layer
// (tools/harness/check/moe_check.hpp).
//
// Random inputs (a fresh seed unless --seed; the seed is printed so a failure can be rerun),
// quantized per S, multiplied by the backend; the error against the exact product of the
// unquantized inputs and against the CPU reference, each with the tolerance the formats allow
// (tools/harness/check/check.hpp derives them). Exit status: 0 within tolerance, 1 outside it, 2 bad
// arguments, 3 the backend asked for is not available (e.g. --backend gpu with no GPU).
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "check/backend.hpp"
#include "check/check.hpp"
#include "check/moe_check.hpp"
#include "command.hpp"
#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::cli {
namespace {

struct CheckOptions {
  std::string scheme;
  std::int64_t m = 0, n = 0, k = 0;
  std::string backend = "auto";
  std::optional<std::uint64_t> seed;
  bool json = false;
  check::MatrixPlacement placement;
  bool moe = false;
  int experts = 8, top_k = 2;
  std::string glu = "silu";
  bool bias = false;
  std::string hidden_type = "bf16";
};

GluActivation parse_glu(const std::string& text) {
  for (GluKind kind : {GluKind::Silu, GluKind::Gelu, GluKind::ClampedSwiglu})
    if (text == glu_kind_name(kind)) return GluActivation{kind};
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("--glu '{}' (rule: silu, gelu or clamped-swiglu)", text));
}

int run_moe(const CheckOptions& options, check::BackendSelection& selection, std::uint64_t seed) {
  check::MoeCase c;
  c.scheme = parse_scheme(options.scheme);
  c.tokens = options.m;
  c.hidden = options.k;
  c.inter = options.n;
  c.experts = options.experts;
  c.top_k = options.top_k;
  c.glu = parse_glu(options.glu);
  c.bias = options.bias;
  c.quantized_from = parse_format(options.hidden_type);
  const check::MoeCheckResult r = check::run_moe_check(c, *selection.backend, seed);
  if (options.json) {
    fmt::print("{}\n", check::to_json(r));
  } else {
    fmt::print("qgemm check --moe  {}\n", check::describe(c));
    fmt::print("  backend      {} ({})\n", r.backend, selection.reason);
    fmt::print("  seed         {}  (rerun: --seed {})\n", r.seed, r.seed);
    fmt::print("  error        {:.3e} relative; worst element {:.2f} of its bound; {} outside, "
               "{} not finite\n",
               r.relative, r.worst, r.outside, r.non_finite);
    fmt::print("  time         {:.3f} ms (one layer, uploads and first-call compiles included)\n",
               r.time_ms);
    fmt::print("{}\n", r.pass ? "PASS" : "FAIL: elements outside their bounds");
  }
  return r.pass ? kExitOk : kExitFailed;
}

void print_text_report(const check::CheckResult& r, const std::string& backend_reason) {
  const std::string preset = r.scheme.name.empty() ? "" : r.scheme.name + " = ";
  fmt::print("qgemm check  {}{}\n", preset, to_string(r.scheme));
  fmt::print("  shape        m = {}, n = {}, k = {}\n", r.m, r.n, r.k);
  fmt::print("  backend      {} ({})\n", r.backend, backend_reason);
  fmt::print("  seed         {}  (rerun: --seed {})\n", r.seed, r.seed);
  if (!r.placement.is_default())
    fmt::print("  placement    A: row stride K + {}, {} elements in; C: row stride N + {}, {} "
               "elements in\n",
               r.placement.a_pad, r.placement.a_offset, r.placement.c_pad, r.placement.c_offset);
  fmt::print("  vs exact     error {:.3e}   tolerance {:.3e}\n", r.error_vs_exact,
             r.tolerance_vs_exact);
  fmt::print(
      "               (bounds: weight {:.2e}, activation {:.2e}, output {:.2e}; rho {:.2f}, "
      "safety x{:.2f})\n",
      r.budget.weight, r.budget.activation, r.budget.output, r.budget.norm_ratio,
      r.budget.safety_factor);
  fmt::print("  vs reference error {:.3e}   tolerance {:.3e}\n", r.error_vs_reference,
             r.tolerance_vs_reference);
  fmt::print("  time         {:.3f} ms   {:.2f} GFLOP/s\n", r.time_ms, r.gflops);
  if (r.outside_writes > 0)
    fmt::print("  outside C    {} elements around C were written\n", r.outside_writes);
  fmt::print("{}\n", r.pass                  ? "PASS"
                     : r.outside_writes > 0 ? "FAIL: wrote outside C"
                                            : "FAIL: outside tolerance");
}

int run(const CheckOptions& options) {
  const Scheme scheme = parse_scheme(options.scheme);
  const check::BackendChoice choice = check::parse_backend_choice(options.backend);
  check::BackendSelection selection;
  try {
    selection = check::select_backend(choice);
  } catch (const Error& error) {
    return report_error("check", error);  // NoDevice: no usable GPU for --backend gpu
  }
  const std::uint64_t seed = options.seed.value_or(check::fresh_seed());
  if (options.moe) return run_moe(options, selection, seed);
  const check::CheckResult result =
      check::run_check(scheme, options.m, options.n, options.k, *selection.backend, seed,
                       options.placement);
  if (options.json) {
    fmt::print("{}\n", check::to_json(result));
  } else {
    print_text_report(result, selection.reason);
  }
  return result.pass ? kExitOk : kExitFailed;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* command = app.add_subcommand(
      "check",
      "Run a quantized GEMM on random inputs and check its error against the tolerance "
      "the formats allow (exit 0 only within tolerance)");
  command->add_option("--scheme", options->scheme, "Preset name or compact text form")->required();
  command->add_option("--m", options->m, "Rows of A (tokens)")->required();
  command->add_option("--n", options->n, "Rows of W (output features)")->required();
  command->add_option("--k", options->k, "Shared dimension (input features)")->required();
  command->add_option("--backend", options->backend, "auto | cpu | gpu")->capture_default_str();
  command->add_option("--seed", options->seed, "Random seed (default: a fresh one, printed)");
  command->add_flag("--json", options->json, "Print one JSON object instead of text");
  command->add_flag("--moe", options->moe,
                    "Check a routed expert layer: --m tokens, --k hidden, --n intermediate");
  command->add_option("--experts", options->experts, "--moe: experts")->capture_default_str();
  command->add_option("--top-k", options->top_k, "--moe: experts per token")
      ->capture_default_str();
  command->add_option("--glu", options->glu, "--moe: silu | gelu | clamped-swiglu")
      ->capture_default_str();
  command->add_flag("--bias", options->bias, "--moe: both GEMMs add a bias per expert");
  command->add_option("--hidden-type", options->hidden_type,
                      "--moe, a scheme quantizing activations: the hidden states' type, which "
                      "the layer quantizes them from (bf16 | fp16)")
      ->capture_default_str();
  command->add_option("--a-pad", options->placement.a_pad,
                      "GPU: A's rows this many elements longer than K (16-bit activations)");
  command->add_option("--a-offset", options->placement.a_offset,
                      "GPU: A this many elements past an aligned start (16-bit activations)");
  command->add_option("--c-pad", options->placement.c_pad,
                      "GPU: C's rows this many elements longer than N");
  command->add_option("--c-offset", options->placement.c_offset,
                      "GPU: C this many elements past an aligned start");
  command->callback([options, &status] { status = run(*options); });
});

}  // namespace
}  // namespace qgemm::cli
