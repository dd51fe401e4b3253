// Engine: device context, prepared weights, plans and the run path.
//
//   prepare_weight  canonical packed weight ──► the layouts the selector can use for it (the mma
//                   layout, repacked on the GPU; the canonical codes for cuBLASLt FP8 and for
//                   weights the mma layout cannot hold)
//   plan            problem ──► per M bucket: dispatch::select ──► a PlanStep with its kernels
//                   compiled and loaded, its launch geometry and scratch layout fixed; the
//                   stream's workspace sized
//   run             pick the step of M, fill argument structs, launch: no allocation, sync,
//                   string building or compile
//   gemm            the problem of a call ──► the weight's cached plan (made on first use) ──► run
#include "qgemm/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>

#include "api/engine_impl.hpp"
#include "api/plan_data.hpp"
#include "dispatch/candidate_launch.hpp"
#include "common/log.hpp"
#include "dispatch/cublaslt_family.hpp"
#include "dispatch/tuned_config.hpp"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/dequant_cublas_args.cuh"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "jit/hash.hpp"
#include "jit/prewarm.hpp"
#include "jit/print_configs.hpp"
#include "layout/mma_repack_gpu.hpp"
#include "quant/quantize_on_device.hpp"
#include "qgemm/error.hpp"
#include "runtime/cublas.hpp"
#include "runtime/cublaslt.hpp"
#include "dispatch/cublaslt_family.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/mma_dequantize_launch.hpp"
#include "runtime/moe.hpp"
#include "runtime/tensor_map.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm {

using detail::aligned;
using detail::at;
using detail::kAlign;

std::int64_t QuantWeight::n() const { return impl_->n; }
std::int64_t QuantWeight::k() const { return impl_->k; }
const WeightQuant& QuantWeight::quant() const { return impl_->quant; }
const ActivationQuant& QuantWeight::activation() const { return impl_->activation; }
std::size_t QuantWeight::device_bytes() const { return impl_->bytes(); }
int QuantWeight::experts() const { return impl_->experts; }
ExpertRole QuantWeight::role() const {
  return impl_->glu_inter > 0 ? ExpertRole::GateUp : ExpertRole::Plain;
}

KernelCacheCounts kernel_cache_counts() {
  const jit::KernelCache& cache = jit::KernelCache::global();
  return {cache.compile_count(), cache.disk_hit_count()};
}

GemmProblem gemm_problem(const QuantWeight& weight, std::int64_t m, const Format& input,
                         const Format& output) {
  if (!weight)
    throw Error(ErrorCode::InvalidArgument, "gemm_problem: weight is empty (prepare_weight first)");
  GemmProblem problem;
  problem.m = m;
  problem.n = weight.n();
  problem.k = weight.k();
  problem.scheme.weight = weight.quant();
  problem.scheme.activation = weight.activation();
  // Grouped kernels take 16-bit rows: an expert set's quantization is its entry points'.
  if (weight.experts() > 0) problem.scheme.activation = ActivationQuant{};
  if (!problem.scheme.activation.is_quantized()) problem.scheme.activation.format = input;
  problem.scheme.output = output;
  problem.input = input;
  problem.experts = weight.experts();
  return problem;
}

namespace {

// cuBLAS's workspace on Hopper (its documentation recommends 32 MiB); set per call so that
// every stream has its own and calls stay graph-capturable.
constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;

// The largest power of two (≤ 16) dividing the address and the row stride in bytes.
int alignment_of(const void* data, std::int64_t stride_bytes) {
  const auto bits = reinterpret_cast<std::uintptr_t>(data) | static_cast<std::uintptr_t>(stride_bytes) | 16u;
  return static_cast<int>(bits & (~bits + 1));
}

// Where a quantize or expand kernel's `args` write the GEMM's operand: 8-bit codes or 16-bit
// values (by the operand's type), and the rows' factors.
template <typename Args>
void write_operand_to(Args& args, void* operand, const Format& type, std::int64_t ldo,
                      float* row_factors) {
  if (type.storage_bytes() == 1) {
    args.operand8 = static_cast<unsigned char*>(operand);
  } else {
    args.operand = static_cast<unsigned short*>(operand);
  }
  args.ldo = ldo;
  args.row_factors = row_factors;
}

void check_matrix(const DeviceMatrix& m, const char* name, std::int64_t rows, std::int64_t cols) {
  auto fail = [&](const std::string& rule) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("gemm: {} {}", name, rule));
  };
  if (!m.data) fail("is null");
  if (m.rows != rows || m.cols != cols)
    fail(fmt::format("is {}x{}, expected {}x{}", m.rows, m.cols, rows, cols));
  if (m.stride < m.cols) fail(fmt::format("stride {} is below its {} columns", m.stride, m.cols));
}

void check_rows_in(const GemmProblem& p, std::int64_t m) {
  if (m < p.m || m > p.max_rows())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} rows; the plan serves M in [{}, {}]", m, p.m,
                            p.max_rows()));
}

}  // namespace


Engine::Engine(int device) : impl_(std::make_unique<Impl>()) {
  const int count = runtime::device_count();
  if (device < 0 || device >= count)
    throw Error(
        ErrorCode::NoDevice,
        fmt::format("engine: device {} does not exist ({} CUDA devices visible)", device, count));
  impl_->device = device;
  impl_->context = runtime::use_primary_context(device);
  impl_->info = runtime::device_info(device);
  impl_->gpu = dispatch::GpuLimits::of_device(impl_->info);
  impl_->rates = dispatch::GpuRates::of(impl_->gpu);
  impl_->arch = impl_->gpu.arch;
}

Engine::~Engine() = default;

int Engine::device() const { return impl_->device; }
int Engine::sm_count() const { return impl_->info.sm_count; }

QuantWeight Engine::prepare_weight(const PackedWeight& weight, const ActivationQuant& activation,
                                   double static_activation_scale, std::int64_t max_rows) {
  impl_->make_current();
  check_packed_weight(weight, "prepare_weight");
  return impl_->prepare_canonical(weight, quant_detail::upload_packed_weight(weight), activation,
                                  static_activation_scale, max_rows);
}

QuantWeight Engine::prepare_weight(const DeviceMatrix& weight, const WeightQuant& quant,
                                   const ActivationQuant& activation,
                                   double static_activation_scale, std::int64_t max_rows,
                                   void* stream) {
  impl_->make_current();
  quant_detail::DeviceQuantizedWeight canonical = quant_detail::quantize_weight_on_device(
      weight, quant, impl_->arch, static_cast<CUstream>(stream), quant_detail::HostScales::Leave);
  const PackedWeight meta = canonical.meta;
  return impl_->prepare_canonical(meta, std::move(canonical), activation,
                                  static_activation_scale, max_rows);
}

PackedWeight Engine::quantize_weight(const DeviceMatrix& weight, const WeightQuant& quant,
                                     void* stream) {
  impl_->make_current();
  return quant_detail::downloaded(quant_detail::quantize_weight_on_device(
      weight, quant, impl_->arch, static_cast<CUstream>(stream)));
}

Engine::QuantizedOnDevice Engine::quantize_and_prepare_weight(const DeviceMatrix& weight,
                                                              const WeightQuant& quant,
                                                              const ActivationQuant& activation,
                                                              double static_activation_scale,
                                                              std::int64_t max_rows, void* stream) {
  impl_->make_current();
  quant_detail::DeviceQuantizedWeight canonical = quant_detail::quantize_weight_on_device(
      weight, quant, impl_->arch, static_cast<CUstream>(stream));
  QuantizedOnDevice out;
  // The packing comes down before the preparation takes the device arrays.
  out.packed = quant_detail::downloaded(canonical);
  out.prepared = impl_->prepare_canonical(out.packed, std::move(canonical), activation,
                                          static_activation_scale, max_rows);
  return out;
}

QuantWeight Engine::Impl::prepare_canonical(const PackedWeight& weight,
                                            quant_detail::DeviceQuantizedWeight canonical,
                                            const ActivationQuant& activation,
                                            double static_activation_scale,
                                            std::int64_t max_rows) {
  require(max_rows >= 1, "prepare_weight: max_rows must be at least 1 ({} given)", max_rows);
  auto prepared = new_prepared(weight);
  if (activation.is_quantized()) {
    Scheme scheme;
    scheme.weight = weight.quant;
    scheme.activation = activation;
    validate(scheme);  // names the activation field and rule
    validate_shape(scheme, 1, weight.n, weight.k);
    require(std::isfinite(static_activation_scale),
            "prepare_weight: static_activation_scale = {} (rule: finite; > 0 a "
            "calibrated scale, <= 0 each call's tensor absmax)",
            static_activation_scale);
    prepared->activation = activation;
    prepared->static_activation_scale =
        activation.scaling == ActivationScaling::StaticTensor ? static_activation_scale : 0.0;
  }

  // Which layouts (dispatch::kept_layouts): those the selector runs some M up to max_rows on,
  // judged with the scheme the weight was prepared for.
  GemmProblem probe;
  probe.n = weight.n;
  probe.k = weight.k;
  probe.scheme.weight = weight.quant;
  probe.scheme.activation = prepared->activation;
  const dispatch::WeightFacts of_scheme =
      dispatch::WeightFacts::of_scheme(probe.scheme, weight.n, weight.k, arch);
  // With the measured table the plans follow, so that a tuned winner finds its layout.
  std::shared_ptr<const dispatch::TuningTable> table;
  const dispatch::KeptLayouts kept =
      dispatch::kept_layouts(probe, of_scheme, max_rows, selection_context(probe, table));
  dispatch::WeightFacts facts = dispatch::keep_layouts(of_scheme, kept);
  const bool want_mma = kept.mma, want_wgmma = kept.wgmma, want_canonical = kept.canonical;
  log(LogLevel::Info, "prepare_weight {} {}x{}: {}", weight.quant.format.name(), weight.n,
      weight.k,
      fmt::format("{}{}{}", want_mma ? "mma layout " : "", want_wgmma ? "wgmma order " : "",
                  want_canonical ? "canonical codes" : ""));

  // The layouts are made on the device from the canonical arrays there (gemm/mma_repack.cuh;
  // its host twin layout::repack_for_mma is what the tests compare it with).
  const layout::CanonicalOnDevice source{canonical.codes.address(), canonical.scales.address(),
                                         canonical.zeros.address()};
  if (want_mma) {
    layout::MmaDeviceWeight device =
        layout::repack_for_mma_on_device(weight, source, arch, nullptr);
    facts.mma = device.meta;  // with the scale flags of the actual scales
    prepared->words = std::move(device.words);
    prepared->scales = std::move(device.scales);
    prepared->zeros = std::move(device.zeros);
  }
  if (want_wgmma) {
    layout::MmaDeviceWeight device = layout::repack_for_mma_on_device(
        weight, source, arch, nullptr, layout::FragmentOrder::Wgmma);
    facts.wgmma = device.meta;
    prepared->wgmma_words = std::move(device.words);
    prepared->wgmma_scales = std::move(device.scales);
    prepared->wgmma_zeros = std::move(device.zeros);
  }
  if (want_canonical) {
    PackedWeight& shape = prepared->canonical_shape;
    shape.quant = weight.quant;
    shape.n = weight.n;
    shape.k = weight.k;
    shape.global_scale = weight.global_scale;
    prepared->codes = std::move(canonical.codes);
    prepared->canonical_scales = std::move(canonical.scales);
    prepared->canonical_zeros = std::move(canonical.zeros);
    if (facts.fp8_weight_mode) {
      // cuBLASLt's weight scales, from the scales on the host. A weight quantized on the
      // device left them there (few: one per channel or 128 x 128 block) and has no host codes,
      // so its metadata is copied to take them; a host weight's (codes and all) is not.
      const PackedWeight* with_scales = &weight;
      PackedWeight meta;
      if (weight.scales.empty()) {
        meta = weight;
        meta.scales =
            prepared->canonical_scales.to_vector<std::uint8_t>(prepared->canonical_scales.bytes());
        with_scales = &meta;
      }
      prepared->fp8_scales = runtime::DeviceBuffer::from(
          runtime::fp8_weight_scales(*with_scales, *facts.fp8_weight_mode));
    }
  }
  prepared->facts = std::move(facts);
  QuantWeight out;
  out.impl_ = std::move(prepared);
  return out;
}

detail::PlanStep Engine::Impl::make_step(const GemmProblem& p, std::int64_t low,
                                         std::int64_t high, const dispatch::Verdict& verdict,
                                         const detail::PreparedWeight& weight) {
  detail::PlanStep step;
  step.m_low = low;
  step.m_high = high;
  step.launch = dispatch::candidate_launch(p, high, verdict, weight.facts, gpu,
                                           weight.static_activation_scale);
  const dispatch::CandidateLaunch& launch = step.launch;
  const std::int64_t k = p.k;
  detail::ScratchLayout& s = step.scratch;
  std::size_t used = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t offset = used;
    used += aligned(bytes);
    return offset;
  };
  if (launch.prep != dispatch::ActivationPrep::None && launch.path != dispatch::Path::CublasLtFp8) {
    // The rows the operand holds: M, or a grouped GEMM's routed capacity for `high` slots (the
    // gathered rows, padding included, are quantized whole).
    std::int64_t rows = high;
    if (p.experts > 0) {
      MoeRoutingShape routed;
      routed.tokens = high;
      routed.global_experts = routed.local_experts = p.experts;
      routed.block = p.route_block > 0 ? p.route_block : step.grouped_tile();
      rows = moe_routing_capacity(routed);
    }
    // 16-byte aligned rows; 8-bit codes in whole runs of 16 (their K order permutes inside them).
    const std::int64_t per_chunk = 16 / launch.operand.storage_bytes();
    step.ldo = (k + per_chunk - 1) / per_chunk * per_chunk;
    s.operand = take(static_cast<std::size_t>(rows * step.ldo * launch.operand.storage_bytes()));
    s.row_factors = take(static_cast<std::size_t>(rows) * sizeof(float));
    s.absmax = take(sizeof(float));
    // The quantizer writes the group scales of the codes (canonical: ceil(K / G) a row);
    // pre-quantized codes bring theirs.
    if (launch.group_scales && launch.prep == dispatch::ActivationPrep::Quantize)
      s.group_scales = take(static_cast<std::size_t>(
          rows * ((k + p.scheme.activation.group - 1) / p.scheme.activation.group) *
          sizeof(float)));
  }
  switch (launch.path) {
    case dispatch::Path::MmaStreamed:
    case dispatch::Path::MmaTiled:
      step.zeroed_bytes = dispatch::mma_zeroed_bytes(*launch.config, launch.mma, high,
                                                     *weight.facts.in_order(launch.mma.order));
      break;
    case dispatch::Path::Wgmma:
      step.zeroed_bytes =
          dispatch::wgmma_zeroed_bytes(*launch.wgmma_config, launch.wgmma, *weight.facts.wgmma);
      break;
    case dispatch::Path::Qdq:
      s.weight_chunk = take(static_cast<std::size_t>(
                                launch.qdq.chunk_n * dispatch::qdq_weight_ld(weight.facts)) *
                            2);
      if (launch.qdq.finish)
        s.chunk_sums =
            take(static_cast<std::size_t>(high * launch.qdq.chunk_n) * sizeof(float));
      s.blas = take(kBlasWorkspaceBytes);
      break;
    case dispatch::Path::CublasLtFp8: {
      const runtime::Fp8ScaleModes modes = *dispatch::cublaslt_modes(p.scheme);
      const runtime::Fp8MatmulShape shape = dispatch::cublaslt_shape(p, high, modes, arch);
      make_current();
      auto matmul = std::make_shared<detail::Fp8Step>();
      matmul->matmul.emplace(runtime::Fp8Matmul::prepare(cublaslt(), shape));  // Unsupported: no algorithm
      step.fp8 = std::move(matmul);
      const auto code_scales_bytes = [&] {
        return static_cast<std::size_t>(runtime::fp8_scale_layout(modes.activation, high, k).count) *
               sizeof(float);
      };
      if (launch.prep == dispatch::ActivationPrep::Quantize) {
        s.codes = take(static_cast<std::size_t>(high * k));
        s.code_scales = take(code_scales_bytes());
        s.absmax = take(sizeof(float));
      } else if (dispatch::transposes_code_scales(p.scheme.activation, modes.activation)) {
        step.fp8->code_scales.emplace(
            runtime::Block1x128ScaleTranspose::prepare(cublaslt(), high, k));
        s.code_scales = take(code_scales_bytes());
      }
      s.blas = take(step.fp8->matmul->workspace_bytes());
      break;
    }
  }
  s.bytes = used;
  auto load = [&](const std::optional<jit::KernelSpec>& spec) {
    return spec ? kernel(*spec) : runtime::LoadedKernel{};
  };
  step.prepare = load(launch.prepare);
  step.absmax = load(launch.absmax);
  step.gemm = load(launch.gemm);
  step.dequantize = load(launch.dequantize);
  step.finish = load(launch.finish);
  return step;
}

namespace {

void check_problem_against(const GemmProblem& p, const detail::PreparedWeight& w) {
  validate(p);
  if (p.n != w.n || p.k != w.k)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm problem: N = {}, K = {} but the weight is {}x{}", p.n, p.k, w.n,
                            w.k));
  if (p.experts != w.experts)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm problem: experts = {} but the weight has {} (rule: 0 for a "
                            "dense weight, else the expert count of prepare_experts)",
                            p.experts, w.experts));
  if (!(p.scheme.weight == w.quant))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm problem: the scheme's weight quantization differs from the "
                            "prepared weight's ({})",
                            to_string(Scheme{"", w.quant, {}, formats::bf16})));
  if (p.glu.has_value() != (w.glu_inter > 0))
    throw Error(ErrorCode::InvalidArgument,
                w.glu_inter > 0
                    ? "gemm problem: the experts were prepared with role gate_up (gate and up "
                      "rows interleaved for Engine::moe's fused GLU) and serve Engine::moe only "
                      "(rule: prepare_experts with ExpertRole::Plain for moe_gemm and "
                      "moe_gemm_grouped)"
                    : "gemm problem: glu is set, but the experts were not prepared with role "
                      "gate_up (rule: a fused GLU needs gate and up rows interleaved)");
}

}  // namespace

GemmPlan Engine::Impl::make_plan(const GemmProblem& problem,
                                 const detail::PreparedWeight& weight) {
  check_problem_against(problem, weight);
  auto data = std::make_shared<detail::PlanData>();
  data->problem = problem;
  data->engine = this;
  data->weight = &weight;
  std::shared_ptr<const dispatch::TuningTable> table;
  dispatch::SelectionContext context = selection_context(problem, table);
  std::string description = fmt::format(
      "GemmPlan {} M {}..{} N {} K {} ({} in{}, {} out{}) on {}", to_string(problem.scheme),
      problem.m, problem.max_rows(), problem.n, problem.k, problem.input.name(),
      problem.prequantized ? " pre-quantized" : "", problem.scheme.output.name(),
      problem.bias ? ", bias" : "", jit::arch_name(arch));
  for (const auto& [low, high] : dispatch::m_buckets(problem)) {
    // A grouped GEMM's config is ranked as the dense GEMM it costs (dispatch::grouped_view).
    const std::optional<dispatch::GroupedView> grouped =
        problem.experts > 0 ? std::optional(dispatch::grouped_view(problem, weight.facts, high))
                            : std::nullopt;
    const GemmProblem& judged = grouped ? grouped->problem : problem;
    const dispatch::WeightFacts& judged_facts = grouped ? grouped->weight : weight.facts;
    const std::int64_t judged_m = grouped ? grouped->m : high;
    dispatch::Selection selection = dispatch::select(judged, judged_m, judged_facts, context);
    detail::PlanStep step;
    for (;;) {
      try {
        step = make_step(problem, low, high, selection.chosen(), weight);
        break;
      } catch (const Error& error) {
        // cuBLASLt's heuristic has the last word on its candidate: without an algorithm, the
        // next best serves (unless the caller forced it).
        const dispatch::Candidate& chosen = *selection.chosen().candidate;
        if (error.code() != ErrorCode::Unsupported || chosen.path != dispatch::Path::CublasLtFp8 ||
            !problem.candidate.empty())
          throw;
        log(LogLevel::Info, "plan: {} refused M = {}: {}", chosen.name, high, error.what());
        context.refused[chosen.name] = error.what();
        selection = dispatch::select(judged, judged_m, judged_facts, context);
      }
    }
    GemmPlan::Choice choice;
    choice.m_low = low;
    choice.m_high = high;
    choice.candidate = selection.chosen().candidate->name;
    choice.kernel = step.launch.text();
    choice.predicted_us = selection.winner_us;
    choice.reason = selection.reason;
    choice.operand = selection.chosen().operand;
    if (problem.experts > 0)
      choice.route_block = problem.route_block > 0 ? problem.route_block : step.grouped_tile();
    description += fmt::format("\n  M {}..{}: {}, {:.1f} µs ({})\n    {}", low, high,
                               choice.candidate, choice.predicted_us, choice.reason, choice.kernel);
    log(LogLevel::Info, "plan: {} M {}..{} N {} K {}: {} ({})", to_string(problem.scheme), low,
        high, problem.n, problem.k, choice.candidate, choice.reason);
    data->scratch_bytes = std::max(data->scratch_bytes, step.scratch.bytes);
    data->zeroed_bytes = std::max(data->zeroed_bytes, aligned(step.zeroed_bytes));
    data->steps.push_back(std::move(step));
    data->choices.push_back(std::move(choice));
  }
  description += fmt::format("\n  workspace {} + {} bytes (scratch + split-K)", data->scratch_bytes,
                             data->zeroed_bytes);
  data->description = description;
  data->key = jit::Hasher128().add(description).finish().low;
  if (jit::print_configs_enabled()) std::fprintf(stderr, "[qgemm plan] %s\n", description.c_str());
  GemmPlan plan;
  plan.data_ = std::move(data);
  return plan;
}

GemmPlan Engine::plan(const GemmProblem& problem, const QuantWeight& weight, void* stream) {
  const detail::PreparedWeight& w = impl_->prepared(weight);
  GemmPlan plan = impl_->make_plan(problem, w);
  impl_->ensure_workspace(stream, *plan.data_);
  return plan;
}

GemmPlan Engine::warm_up(const GemmProblem& problem, const QuantWeight& weight, void* stream,
                         bool progress) {
  const detail::PreparedWeight& w = impl_->prepared(weight);
  check_problem_against(problem, w);
  // Every kernel the buckets select (plan()'s) and each M selects (gemm() plans each M on its
  // own), compiled in parallel first; plan() then only loads them.
  std::shared_ptr<const dispatch::TuningTable> table;
  const dispatch::SelectionContext context = impl_->selection_context(problem, table);
  const std::vector<jit::KernelSpec> specs =
      dispatch::problem_specs(problem, w.facts, context, w.static_activation_scale, true);
  const auto results = jit::prewarm(
      jit::KernelCache::global(), specs, 0,
      progress ? std::function<void(std::size_t, std::size_t)>(jit::print_progress_bar) : nullptr);
  for (const jit::PrewarmResult& result : results)
    if (!result.error.empty())
      throw Error(ErrorCode::CompileFailed,
                  fmt::format("warm_up: {}: {}", jit::to_string(result.spec), result.error));
  return plan(problem, weight, stream);
}

void Engine::dequantize(const QuantWeight& weight, const DeviceMatrix& out, void* stream) {
  const detail::PreparedWeight& w = impl_->prepared(weight);
  check_matrix(out, "dequantize: out", w.n, w.k);
  if (!(out.dtype == formats::bf16 || out.dtype == formats::fp16))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("dequantize: out is {} (rule: bf16 or fp16)", out.dtype.name()));
  // The prepared layouts' kernel stores whole 16-byte pieces; the canonical one dense rows.
  const bool dense = !dispatch::qdq_prepared_weight(w.facts);
  if (dense ? out.stride != w.k : out.stride % 8 != 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("dequantize: out's stride {} (rule: {})", out.stride,
                            dense ? fmt::format("K = {} for a weight kept canonical", w.k)
                                  : std::string("a multiple of 8 elements")));
  const std::int64_t ld = out.stride;
  if (!dense && w.global_scale != 1.0)
    throw Error(ErrorCode::Unsupported,
                "dequantize: the prepared layouts leave the global scale to the GEMM (NVFP4): "
                "not applied here");
  const jit::KernelSpec spec = dispatch::qdq_dequantize_spec(w.facts, out.dtype, impl_->arch);
  const runtime::LoadedKernel kernel = impl_->kernel(spec);
  impl_->make_current();
  impl_->launch_dequantize(w, kernel, spec, 0, w.n, static_cast<unsigned short*>(out.data), ld,
                           static_cast<CUstream>(stream));
}

void Engine::run(const GemmPlan& plan, const DeviceMatrix& a, const QuantWeight& weight,
                 const DeviceMatrix& c, void* stream, const float* bias,
                 const Workspace& workspace) {
  const GemmProblem& p = plan.problem();
  if (p.prequantized)
    throw Error(ErrorCode::InvalidArgument,
                "gemm run: the plan takes pre-quantized codes (a DeviceActivation), not a matrix");
  const detail::PreparedWeight& w = impl_->prepared(weight);
  if (a.rows == 0 && c.rows == 0) return;  // an empty batch: nothing to compute
  impl_->run(*plan.data_, w, &a, nullptr, c, stream, bias, workspace);
}

void Engine::run(const GemmPlan& plan, const DeviceActivation& a, const QuantWeight& weight,
                 const DeviceMatrix& c, void* stream, const float* bias,
                 const Workspace& workspace) {
  const GemmProblem& p = plan.problem();
  if (!p.prequantized)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: the plan takes {} activations as a matrix, not "
                            "pre-quantized codes",
                            p.input.name()));
  const detail::PreparedWeight& w = impl_->prepared(weight);
  if (a.rows == 0 && c.rows == 0) return;  // an empty batch: nothing to compute
  impl_->run(*plan.data_, w, nullptr, &a, c, stream, bias, workspace);
}

void Engine::Impl::run(const detail::PlanData& plan, const detail::PreparedWeight& weight,
                       const DeviceMatrix* a, const DeviceActivation* codes,
                       const DeviceMatrix& c, void* stream, const float* bias,
                       const Workspace& workspace) {
  if (plan.problem.experts > 0)
    throw Error(ErrorCode::InvalidArgument,
                "gemm run: the plan is a grouped (MoE) GEMM's (rule: run it with Engine::moe_gemm)");
  if (workspace.data) {
    if (workspace.bytes < plan.scratch_bytes + plan.zeroed_bytes ||
        reinterpret_cast<std::uintptr_t>(workspace.data) % kAlign != 0)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: the Workspace holds {} bytes at {} (rule: at least the "
                              "plan's {}, 256-byte aligned)",
                              workspace.bytes, workspace.data, plan.scratch_bytes + plan.zeroed_bytes));
    // The split-K region sits at the end: a buffer shared by plans keeps its zeros there.
    run_in(plan, weight, a, codes, c, stream, bias,
           {workspace.data, static_cast<char*>(workspace.data) +
                                (workspace.bytes - plan.zeroed_bytes) / kAlign * kAlign},
           nullptr);
  } else {
    StreamSlot slot = stream_workspace(stream, plan.scratch_bytes, plan.zeroed_bytes);
    run_in(plan, weight, a, codes, c, stream, bias, {slot.scratch, slot.zeroed}, nullptr);
  }
}

void Engine::Impl::run_in(const detail::PlanData& plan, const detail::PreparedWeight& weight,
                          const DeviceMatrix* a, const DeviceActivation* codes,
                          const DeviceMatrix& c, void* stream, const float* bias, RunMemory memory,
                          const runtime::MoeGroupedBlocks* grouped) {
  const GemmProblem& p = plan.problem;
  if (plan.engine != this)
    throw Error(ErrorCode::InvalidArgument, "gemm run: the plan was made by another Engine");
  if (plan.weight != &weight)
    throw Error(ErrorCode::InvalidArgument,
                "gemm run: the plan was made for another prepared weight");
  const std::int64_t m = a ? a->rows : codes->rows;
  // A grouped run's plan step is chosen by its slots (the rows its caller routed or grouped).
  const std::int64_t step_m = grouped ? grouped->slots : m;
  check_rows_in(p, step_m);
  if (a) {
    check_matrix(*a, "A", m, p.k);
    if (!(a->dtype == p.input))
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: A is {}, the plan takes {}", a->dtype.name(),
                              p.input.name()));
    const int alignment = alignment_of(a->data, a->stride * a->dtype.storage_bytes());
    if (alignment < p.a_alignment)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: A's rows are {}-byte aligned, the plan assumed {} (rule: "
                              "plan with a_alignment = {})",
                              alignment, p.a_alignment, alignment));
  } else {
    if (!(codes->quant == p.scheme.activation))
      throw Error(ErrorCode::InvalidArgument,
                  "gemm run: the DeviceActivation's quantization differs from the plan's");
    if (codes->cols != p.k)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: A has {} columns, the weight's K is {}", codes->cols, p.k));
    if (!codes->codes || !codes->scales)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: A's {} is null", codes->codes ? "scales" : "codes"));
    if (!(std::isfinite(codes->tensor_scale) && codes->tensor_scale > 0))
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: A's tensor_scale = {} (rule: positive and finite)",
                              codes->tensor_scale));
  }
  check_matrix(c, "C", m, p.glu ? p.n / 2 : p.n);  // a fused GLU's C: I = N / 2 columns
  if (p.glu && !grouped)
    throw Error(ErrorCode::InvalidArgument,
                "gemm run: the plan fuses a GLU (rule: Engine::moe runs such plans)");
  if (!(c.dtype == p.scheme.output))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: C is {}, the plan writes {}", c.dtype.name(),
                            p.scheme.output.name()));
  // Any row stride and element alignment of C is served (the kernels store a pair of 16-bit
  // values at once only where its address allows; cuBLASLt FP8 is chosen only for a C of
  // 16-byte alignment, below).
  const int c_alignment = alignment_of(c.data, 0);
  if (c_alignment < c.dtype.storage_bytes())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: C at {} (rule: aligned to its {}-byte elements)",
                            fmt::ptr(c.data), c.dtype.storage_bytes()));
  if ((bias != nullptr) != p.bias)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: {} (rule: as the plan's problem.bias = {})",
                            bias ? "a bias was given" : "no bias was given", p.bias));

  const detail::PlanStep* step = &plan.step_for(step_m);
  if (grouped) {
    // Rows grouped in place: a table made for the step's kernel tile. The indexed layout: the
    // plan's routing block, and rows for every position of its capacity.
    const bool in_place = grouped->row_blocks != nullptr;
    const int route_block = in_place || p.route_block == 0 ? step->grouped_tile() : p.route_block;
    if (grouped->route_block != route_block)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("moe_gemm: the routing's block is {}, the plan's is {} at {} slots "
                              "(rule: route with GemmPlan::Choice::route_block, or plan with "
                              "problem.route_block)",
                              grouped->route_block, route_block, step_m));
    if (grouped->experts != weight.experts)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("moe_gemm: the routing has {} local experts, the weight {} (rule: "
                              "equal)",
                              grouped->experts, weight.experts));
    if (!in_place && m < grouped->positions)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("moe_gemm: the rows are {} (rule: at least the routing's capacity "
                              "{})",
                              m, grouped->positions));
    if (!grouped->block_experts || !grouped->routed_total)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("moe_gemm: the routing's {} is null",
                              grouped->block_experts ? "offsets" : "block_experts"));
  }

  void* scratch = memory.scratch;
  void* zeroed = memory.zeroed;
  make_current();
  const auto cu_stream = static_cast<CUstream>(stream);
  const ActivationQuant& quant = p.scheme.activation;

  const dispatch::CandidateLaunch& chosen = step->launch;
  if (chosen.path == dispatch::Path::CublasLtFp8 && c_alignment < p.c_alignment)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: C is {}-byte aligned, the plan assumed {} for cuBLASLt FP8 "
                            "(rule: plan with c_alignment = {})",
                            c_alignment, p.c_alignment, c_alignment));
  if (codes && chosen.group_scales && reinterpret_cast<std::uintptr_t>(codes->scales) % 4 != 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: A's scales at {} (rule: 4-byte aligned fp32 group scales, "
                            "which the FP8 wgmma kernel reads as they are)",
                            codes->scales));
  if (chosen.path == dispatch::Path::CublasLtFp8) {
    run_fp8(plan, *step, weight, a, codes, c, stream, scratch);
    return;
  }

  // A → the GEMM's operand.
  DeviceMatrix operand = a ? *a : DeviceMatrix{};
  float* row_factors = nullptr;
  const float* group_scales = nullptr;  // the operand codes' 1x128 group scales (FP8 wgmma)
  if (chosen.prep != dispatch::ActivationPrep::None) {
    void* operand_data = at<void>(scratch, step->scratch.operand);
    row_factors = at<float>(scratch, step->scratch.row_factors);
    operand = {operand_data, m, p.k, step->ldo, chosen.operand};
    if (chosen.prep == dispatch::ActivationPrep::Quantize) {
      kernels::QuantizeActivationArgs args = runtime::quantize_activation_args(
          quant, m, p.k, reinterpret_cast<CUdeviceptr>(a->data), a->stride,
          weight.static_activation_scale);
      write_operand_to(args, operand_data, chosen.operand, step->ldo, row_factors);
      args.fold_row_factors = chosen.fold_row_factors;
      if (chosen.group_scales) {
        // Canonical [m][cells] fp32 (quantize_activation_args' strides), beside the codes.
        args.scales = at<unsigned char>(scratch, step->scratch.group_scales);
        group_scales = reinterpret_cast<const float*>(args.scales);
      }
      if (step->absmax.function)
        runtime::launch_tensor_absmax_for(step->absmax, args,
                                          at<float>(scratch, step->scratch.absmax), cu_stream);
      runtime::launch_quantize_activation(step->prepare, args, cu_stream);
    } else {
      kernels::ExpandActivationArgs args{};
      args.codes = static_cast<const unsigned char*>(codes->codes);
      args.scales = static_cast<const unsigned char*>(codes->scales);
      args.tensor_scale = static_cast<float>(codes->tensor_scale);
      write_operand_to(args, operand_data, chosen.operand, step->ldo, row_factors);
      args.fold_row_factors = chosen.fold_row_factors;
      args.m = m;
      args.k = p.k;
      args.group = quant.group > 0 ? quant.group : p.k;
      runtime::launch_expand_activation(step->prepare, args, cu_stream);
      // The codes' canonical fp32 group scales, read by the GEMM as they are.
      if (chosen.group_scales) group_scales = static_cast<const float*>(codes->scales);
    }
    if (!chosen.row_factors) row_factors = nullptr;
  }

  switch (chosen.path) {
    case dispatch::Path::Qdq:
      run_qdq(*step, weight, operand, c, stream, bias, scratch, row_factors);
      return;
    case dispatch::Path::Wgmma:
      run_wgmma(*step, weight, operand, c, cu_stream, bias, row_factors, group_scales, zeroed,
                grouped);
      return;
    case dispatch::Path::CublasLtFp8:
    case dispatch::Path::MmaStreamed:
    case dispatch::Path::MmaTiled: break;
  }
  const dispatch::MmaLaunch& launch = chosen.mma;
  // The tiled kernel reads the mma layout, the streamed one whichever order its launch names.
  const layout::MmaWeight& w = *weight.facts.in_order(launch.order);
  const auto arrays = weight.in_order(launch.order);
  kernels::DenseGemmParams params{};
  params.a = operand.data;
  params.b = arrays.words.as<const unsigned>();
  params.scales = arrays.scales.as<const float>();
  params.zeros = arrays.zeros.bytes() ? arrays.zeros.as<const float>() : nullptr;
  params.c = c.data;
  params.bias = bias;
  params.row_factors = row_factors;
  params.lda = operand.stride;
  params.ldc = c.stride;
  params.m = static_cast<int>(m);
  params.n = static_cast<int>(w.n);
  params.k = static_cast<int>(w.k);
  params.n_padded = static_cast<int>(w.n_padded);
  params.k_blocks = static_cast<int>(w.k_blocks);
  params.groups = w.groups;
  params.k_tiles = launch.k_tiles;
  params.tiles_per_split = launch.tiles_per_split;
  params.blocks_per_warp = launch.blocks_per_warp;
  params.global_scale = static_cast<float>(w.global_scale);
  unsigned grid_y = launch.grid_y(*chosen.config, m);
  if (grouped) {
    // Grouped decode: one grid row per token block of the positions (the device stops at the
    // routed total), each expert's weight a fixed stride from the last (prepare_experts).
    if (!launch.grouped || row_factors != nullptr)
      throw Error(ErrorCode::Internal,
                  "moe_gemm: a grouped plan step without a grouped launch, or with row factors");
    params.block_experts = grouped->block_experts;
    params.routed_total = grouped->routed_total;
    params.row_blocks = grouped->row_blocks;
    params.blocks_per_route = grouped->route_block / launch.rows;
    if (p.glu) {  // in fields the grouped kernel has no other use for (dense_gemm_params.cuh)
      params.glu_alpha = grouped->glu.alpha;
      params.glu_limit = grouped->glu.limit;
    }
    grid_y = launch.grid_y(*chosen.config, grouped->positions);
    if (grouped->positions % launch.rows != 0 || grouped->route_block % launch.rows != 0 ||
        grid_y > 65535)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("moe_gemm: a capacity of {} positions in routing blocks of {} "
                              "(rule: both multiples of the decode kernel's {} rows, at most "
                              "65535 token blocks)",
                              grouped->positions, grouped->route_block, launch.rows));
  }
  if (launch.splits > 1) {
    // [M][N] fp32 sums, then the per-tile counters (dispatch::mma_zeroed_bytes).
    params.workspace = static_cast<float*>(zeroed);
    params.counters =
        at<unsigned>(zeroed, aligned(static_cast<std::size_t>(m) * w.n * sizeof(float)));
  }
  runtime::launch_kernel(step->gemm, {launch.grid_x, grid_y, static_cast<unsigned>(launch.splits)},
                         params, cu_stream);
}

// cuBLASLt FP8 on the weight's stored codes: A quantized on the GPU into codes and scales in
// cuBLASLt's layouts (or pre-quantized codes whose canonical layout is cuBLASLt's), then one
// cublasLtMatmul with the global scale as alpha.
void Engine::Impl::run_fp8(const detail::PlanData& plan, const detail::PlanStep& step,
                           const detail::PreparedWeight& weight, const DeviceMatrix* a,
                           const DeviceActivation* codes, const DeviceMatrix& c, void* stream,
                           void* scratch) {
  const GemmProblem& p = plan.problem;
  const std::int64_t m = a ? a->rows : codes->rows;
  const runtime::Fp8Matmul& prepared = *step.fp8->matmul;
  if (m != prepared.shape().m || c.stride != prepared.shape().ldc)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm run: cuBLASLt was prepared for M = {} and C rows {} apart, not "
                            "M = {} and {} (rule: plan this exact call)",
                            prepared.shape().m, prepared.shape().ldc, m, c.stride));
  const auto cu_stream = static_cast<CUstream>(stream);
  runtime::Fp8Matmul::Operands operands;
  if (a) {
    unsigned char* a_codes = at<unsigned char>(scratch, step.scratch.codes);
    float* a_scales = at<float>(scratch, step.scratch.code_scales);
    kernels::QuantizeActivationArgs args = runtime::fp8_quantize_activation_args(
        p.scheme.activation, prepared.shape().a_scale, m, p.k,
        reinterpret_cast<CUdeviceptr>(a->data), a->stride, weight.static_activation_scale);
    args.codes = a_codes;
    args.scales = reinterpret_cast<unsigned char*>(a_scales);
    if (step.absmax.function)
      runtime::launch_tensor_absmax_for(step.absmax, args,
                                        at<float>(scratch, step.scratch.absmax), cu_stream);
    runtime::launch_quantize_activation(step.prepare, args, cu_stream);
    operands.a = a_codes;
    operands.a_scales = a_scales;
  } else {
    operands.a = codes->codes;
    operands.a_scales = static_cast<const float*>(codes->scales);
    if (step.fp8->code_scales) {
      float* a_scales = at<float>(scratch, step.scratch.code_scales);
      step.fp8->code_scales->run(operands.a_scales, a_scales, cu_stream);
      operands.a_scales = a_scales;
    }
  }
  operands.w = weight.codes.as<const void>();
  operands.w_scales = weight.fp8_scales.as<const float>();
  operands.c = c.data;
  operands.alpha = static_cast<float>(weight.global_scale);
  std::lock_guard lock(step.fp8->mutex);
  step.fp8->matmul->run(operands, at<void>(scratch, step.scratch.blas),
                        step.fp8->matmul->workspace_bytes(), cu_stream);
}

// Rows [n0, n0 + rows) of the weight dequantized into out[rows][ld] (16-bit), by the weight's
// dequantization kernel `kernel` of `spec` (dispatch::qdq_dequantize_spec): from the mma layout
// without the global scale (n0 a multiple of 64, ld dispatch::qdq_weight_ld), or from the
// canonical form with it (n0 on a scale row, ld = K).
void Engine::Impl::launch_dequantize(const detail::PreparedWeight& weight,
                                     const runtime::LoadedKernel& kernel,
                                     const jit::KernelSpec& spec, std::int64_t n0,
                                     std::int64_t rows, unsigned short* out, std::int64_t ld,
                                     CUstream stream) {
  if (!dispatch::qdq_prepared_weight(weight.facts)) {
    // Rows [n0, n0 + rows) of the canonical arrays, as a weight of `rows` rows.
    const PackedWeight& shape = weight.canonical_shape;
    const ScaleGrid grid = shape.scale_grid();
    PackedWeight part = shape;
    part.n = rows;
    const std::int64_t scale_row = n0 / grid.rows_per;
    const std::int64_t scale_bytes = shape.quant.scale_format.storage_bytes();
    const std::int64_t zero_row_bytes = shape.quant.zero_point == ZeroPoint::Integer
                                            ? (grid.cols * shape.quant.format.bits + 7) / 8
                                            : grid.cols * scale_bytes;
    const CUdeviceptr zeros = weight.canonical_zeros.bytes()
                                  ? weight.canonical_zeros.address() + scale_row * zero_row_bytes
                                  : 0;
    const kernels::DequantizeWeightArgs args = runtime::dequantize_weight_args(
        part, weight.codes.address() + n0 * shape.row_bytes(),
        weight.canonical_scales.address() + scale_row * grid.cols * scale_bytes, zeros,
        reinterpret_cast<CUdeviceptr>(out));
    runtime::launch_dequantize_weight(kernel, args, stream);
    return;
  }
  // Either fragment order (the spec names which).
  const layout::MmaWeight& w = *dispatch::qdq_prepared_weight(weight.facts);
  const auto arrays = weight.in_order(w.order);
  kernels::MmaDequantizeArgs d{};
  d.words = arrays.words.as<const unsigned>();
  d.scales = arrays.scales.as<const float>();
  d.zeros = arrays.zeros.bytes() ? arrays.zeros.as<const float>() : nullptr;
  d.out = out;
  d.n_begin = n0;
  d.rows = rows;
  d.k = w.k;
  d.ld_out = ld;
  d.k_blocks = w.k_blocks;
  d.n_padded = w.n_padded;
  runtime::launch_mma_dequantize(kernel, spec, d, info.sm_count, stream);
}

// The SM90 wgmma GEMM (kernels/gemm/sm90_wgmma.cuh): A's tensor map is encoded per call (its
// address changes; host work of about a microsecond), the rest comes from the plan.
void Engine::Impl::run_wgmma(const detail::PlanStep& step, const detail::PreparedWeight& weight,
                             const DeviceMatrix& a, const DeviceMatrix& c, CUstream stream,
                             const float* bias, const float* row_factors, const float* group_scales,
                             void* zeroed, const runtime::MoeGroupedBlocks* grouped) {
  const layout::MmaWeight& w = *weight.facts.wgmma;
  const dispatch::WgmmaLaunch& planned = step.launch.wgmma;
  const dispatch::WgmmaConfig& config = *step.launch.wgmma_config;
  kernels::WgmmaGemmParams params{};
  // 16-bit activations, or e4m3 codes in the 8-bit mma's K order for the FP8 configs. That order
  // permutes K inside runs of 16, so a code of k < K may sit at a position ≥ K in the last run:
  // the map spans the whole row of round_up(K, 16) positions (the stride), whose positions of no
  // k the quantizer and the expand kernel write as zero.
  const int element_bytes = static_cast<int>(a.dtype.storage_bytes());
  params.activations = runtime::activation_tensor_map(
      reinterpret_cast<CUdeviceptr>(a.data), a.rows, element_bytes == 1 ? a.stride : a.cols,
      a.stride, config.block_m(), element_bytes);
  params.w = weight.wgmma_words.as<const unsigned>();
  params.scales = weight.wgmma_scales.as<const float>();
  params.zeros = weight.wgmma_zeros.bytes() ? weight.wgmma_zeros.as<const float>() : nullptr;
  params.c = c.data;
  params.bias = bias;
  params.row_factors = row_factors;
  if (step.launch.group_scales) {
    params.act_scales = group_scales;
    params.act_scale_stride = (w.k + 127) / 128;
  }
  params.ldc = c.stride;
  params.m = static_cast<int>(a.rows);
  params.n = static_cast<int>(w.n);
  params.k = static_cast<int>(w.k);
  params.n_padded = static_cast<int>(w.n_padded);
  params.n_tiles = static_cast<int>(w.n_padded / 64);
  params.k_chunks = static_cast<int>(w.k_blocks / 4);
  params.groups = w.groups;
  params.n_blocks = planned.n_blocks;
  params.m_blocks = static_cast<int>((a.rows + config.block_m() - 1) / config.block_m());
  if (grouped) {
    // Grouped: the positions in token blocks (the device stops at its total), each expert's
    // weight a fixed stride from the last (prepare_experts).
    params.m_blocks = static_cast<int>(grouped->positions / config.block_m());
    params.block_experts = grouped->block_experts;
    params.routed_total = grouped->routed_total;
    params.row_blocks = grouped->row_blocks;
    params.blocks_per_route = grouped->route_block / config.block_m();
    params.glu_alpha = grouped->glu.alpha;
    params.glu_limit = grouped->glu.limit;
  }
  params.splits = planned.splits;
  params.chunks_per_split = planned.chunks_per_split;
  params.global_scale = static_cast<float>(w.global_scale);
  if (planned.splits > 1) {
    // The fp32 sums of every (token block, tile), then the counters (dispatch::wgmma_zeroed_bytes).
    params.workspace = static_cast<float*>(zeroed);
    params.counters = at<unsigned>(
        zeroed, dispatch::wgmma_counters_offset(config, params.m_blocks, w));
  }
  const std::int64_t units =
      static_cast<std::int64_t>(params.n_blocks) * params.m_blocks * params.splits;
  const auto grid = static_cast<unsigned>(std::min<std::int64_t>(units, gpu.sm_count));
  runtime::launch_kernel(step.gemm, {grid, 1, 1}, params, stream);
}

// C = A · Wᵀ chunk by chunk of N: dequantize the chunk's rows to the operand's type, multiply
// with cuBLAS (global scale as alpha) into C directly, or into fp32 sums that finish_gemm adds
// the row factors and bias to and converts.
void Engine::Impl::run_qdq(const detail::PlanStep& step, const detail::PreparedWeight& weight,
                           const DeviceMatrix& a, const DeviceMatrix& c, void* stream,
                           const float* bias, void* scratch, const float* row_factors) {
  const std::int64_t m = a.rows, n = weight.n, k = weight.k;
  const auto cu_stream = static_cast<CUstream>(stream);
  unsigned short* w16 = at<unsigned short>(scratch, step.scratch.weight_chunk);
  float* sums = at<float>(scratch, step.scratch.chunk_sums);
  void* blas_workspace = at<void>(scratch, step.scratch.blas);
  const dispatch::QdqLaunch& launch = step.launch.qdq;
  const std::int64_t ld = dispatch::qdq_weight_ld(weight.facts);
  auto grid_for = [](std::int64_t items) {
    return runtime::LaunchGrid{
        static_cast<unsigned>(std::clamp<std::int64_t>((items + 255) / 256, 1, 65536)), 1, 1};
  };
  for (std::int64_t n0 = 0; n0 < n; n0 += launch.chunk_n) {
    const std::int64_t rows = std::min(launch.chunk_n, n - n0);
    // The canonical dequantization applies the global scale itself; cuBLAS's alpha otherwise.
    const float alpha =
        dispatch::qdq_prepared_weight(weight.facts) ? static_cast<float>(weight.global_scale)
                                                    : 1.0f;
    launch_dequantize(weight, step.dequantize, *step.launch.dequantize, n0, rows, w16, ld, cu_stream);
    void* c_chunk = static_cast<unsigned char*>(c.data) + n0 * c.dtype.storage_bytes();
    {
      std::lock_guard lock(blas_mutex);
      runtime::Cublas& blas = cublas();
      if (!launch.finish) {
        blas.gemm_nt(stream, m, rows, k, alpha, a.data, a.stride, w16, ld, a.dtype, c_chunk,
                     c.stride, c.dtype, blas_workspace, kBlasWorkspaceBytes);
        continue;
      }
      blas.gemm_nt(stream, m, rows, k, alpha, a.data, a.stride, w16, ld, a.dtype, sums, rows,
                   formats::fp32, blas_workspace, kBlasWorkspaceBytes);
    }
    kernels::FinishGemmArgs f{};
    f.sums = sums;
    f.row_factors = row_factors;
    f.bias = bias;
    f.c = c_chunk;
    f.m = m;
    f.cols = rows;
    f.ldc = c.stride;
    f.n_begin = n0;
    runtime::launch_kernel(step.finish, grid_for(m * rows), f, cu_stream);
  }
}

namespace {

detail::PreparedWeight::PlanKey plan_key(const GemmProblem& p) {
  return {p.m,           p.input.name(), p.scheme.output.name(),
          p.candidate,   p.bias,         p.a_alignment,
          p.ldc,         p.c_alignment,  dispatch::tuning_table_generation()};
}

}  // namespace

GemmProblem gemm_problem(const QuantWeight& weight, const DeviceActivation& a,
                         const DeviceMatrix& c) {
  if (!weight)
    throw Error(ErrorCode::InvalidArgument, "gemm_problem: weight is empty (prepare_weight first)");
  GemmProblem problem;
  problem.m = a.rows;
  problem.n = weight.n();
  problem.k = weight.k();
  problem.scheme.weight = weight.quant();
  problem.scheme.activation = a.quant;
  problem.scheme.output = c.dtype;
  problem.input = a.quant.format;
  problem.prequantized = true;
  problem.ldc = c.stride;
  problem.c_alignment = alignment_of(c.data, 0);
  return problem;
}

void Engine::gemm(const DeviceMatrix& a, const QuantWeight& weight, const DeviceMatrix& c,
                  void* stream, const GemmOptions& options) {
  const detail::PreparedWeight& w = impl_->prepared(weight);
  if (a.rows < 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} rows (rule: M >= 0)", a.rows));
  if (a.rows == 0) {  // an empty batch: nothing to compute, C (0 rows) is not touched
    if (c.rows != 0)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm: A has 0 rows but C has {} (rule: as many as A)", c.rows));
    return;
  }
  if (!(a.dtype == formats::bf16 || a.dtype == formats::fp16))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: activation type {} is not bf16 or fp16 (quantized activations "
                            "come as a DeviceActivation)",
                            a.dtype.name()));
  GemmProblem problem = gemm_problem(weight, a.rows, a.dtype, c.dtype);
  problem.bias = options.bias != nullptr;
  problem.candidate = options.candidate;
  problem.a_alignment = alignment_of(a.data, a.stride * a.dtype.storage_bytes());
  problem.ldc = c.stride;
  problem.c_alignment = alignment_of(c.data, 0);
  const GemmPlan plan = w.plan_for(plan_key(problem), [&] {
    if (problem.a_alignment < 16 && !w.activation.is_quantized())
      log(LogLevel::Info, "gemm: A's rows are {}-byte aligned: the tensor-core kernels cannot "
          "copy them, dequantize + cuBLAS serves", problem.a_alignment);
    return impl_->make_plan(problem, w);
  });
  impl_->ensure_workspace(stream, *plan.data_);
  run(plan, a, weight, c, stream, options.bias);
}

void Engine::gemm(const DeviceActivation& a, const QuantWeight& weight, const DeviceMatrix& c,
                  void* stream, const GemmOptions& options) {
  const detail::PreparedWeight& w = impl_->prepared(weight);
  if (!a.quant.is_quantized())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: the DeviceActivation's format {} is not quantized (rule: pass "
                            "bf16/fp16 activations as a DeviceMatrix)",
                            a.quant.format.name()));
  if (a.rows < 0 || (a.rows == 0 && c.rows != 0))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} rows and C {} (rule: M >= 0, as many in both)",
                            a.rows, c.rows));
  if (a.rows == 0) return;  // an empty batch: nothing to compute
  GemmProblem problem = gemm_problem(weight, a, c);
  problem.bias = options.bias != nullptr;
  problem.candidate = options.candidate;
  if (a.cols != w.k)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} columns, the weight's K is {}", a.cols, w.k));
  detail::PreparedWeight::PlanKey key = plan_key(problem);
  key.input = "codes " + to_string(Scheme{"", {}, a.quant, formats::bf16});
  const GemmPlan plan = w.plan_for(key, [&] { return impl_->make_plan(problem, w); });
  impl_->ensure_workspace(stream, *plan.data_);
  run(plan, a, weight, c, stream, options.bias);
}

}  // namespace qgemm
