#include "dispatch/candidate_launch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "jit/catalog.hpp"
#include "qgemm/error.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm::dispatch {

std::vector<jit::KernelSpec> CandidateLaunch::specs() const {
  std::vector<jit::KernelSpec> all;
  for (const auto* spec : {&absmax, &prepare, &gemm, &dequantize, &finish})
    if (*spec) all.push_back(**spec);
  return all;
}

std::string CandidateLaunch::text() const {
  std::string text;
  for (const jit::KernelSpec& spec : specs())
    text += (text.empty() ? "" : " + ") + jit::to_string(spec);
  switch (path) {
    case Path::MmaStreamed:
    case Path::MmaTiled:
      text += fmt::format(" splits={}", mma.splits);
      if (mma.grouped) text += fmt::format(" token_block={}", mma.rows);
      break;
    case Path::Wgmma:
      text += fmt::format(" grid={} splits={}", wgmma.grid, wgmma.splits);
      break;
    case Path::Qdq:
      text += fmt::format(" + cuBLAS ({} chunk{} of {} rows{})", qdq.chunks, qdq.chunks > 1 ? "s" : "",
                          qdq.chunk_n, qdq.finish ? ", fp32 sums" : "");
      break;
    case Path::CublasLtFp8: text += (text.empty() ? "" : " + ") + std::string("cuBLASLt FP8"); break;
  }
  return text;
}

CandidateLaunch candidate_launch(const GemmProblem& p, std::int64_t m, const Verdict& verdict,
                                 const WeightFacts& weight, const GpuLimits& gpu,
                                 double static_activation_scale) {
  if (!verdict.rejected.empty())
    throw Error(ErrorCode::Internal,
                fmt::format("candidate_launch: '{}' was rejected: {}", verdict.candidate->name,
                            verdict.rejected));
  CandidateLaunch launch;
  launch.path = verdict.candidate->path;
  launch.config = verdict.candidate->config;
  launch.operand = verdict.operand;
  const jit::Arch arch = gpu.arch;
  const ActivationQuant& quant = p.scheme.activation;
  if (quant.is_quantized() && launch.path != Path::CublasLtFp8) {
    launch.row_factors = jit::activation_row_factor(quant);
    if (p.prequantized) {
      launch.prep = ActivationPrep::Expand;
      launch.prepare = jit::expand_activation_spec(quant, launch.operand, arch);
    } else {
      launch.prep = ActivationPrep::Quantize;
      const jit::ActivationEmit emit = launch.operand.storage_bytes() == 1
                                           ? jit::ActivationEmit::Operand8
                                           : jit::ActivationEmit::Operand;
      launch.prepare = jit::quantize_activation_spec(quant, p.input, emit, launch.operand, arch);
      if (runtime::needs_tensor_absmax(quant, static_activation_scale))
        launch.absmax = jit::tensor_absmax_spec(p.input, arch);
    }
  }
  switch (launch.path) {
    case Path::MmaStreamed:
    case Path::MmaTiled: {
      // The streamed kernel reads either order (its spec names which).
      const layout::MmaWeight& prepared = *weight.for_mma_sync(launch.path);
      // Grouped (MoE): m is the routed slots; the kernel walks the routing's token blocks.
      launch.mma = p.experts > 0 ? grouped_mma_launch(*launch.config, m, p.experts, p.route_block,
                                                      prepared, gpu)
                                 : mma_launch(*launch.config, m, prepared, gpu);
      launch.gemm = mma_spec(*launch.config, launch.mma, prepared, launch.operand, p.scheme.output,
                             arch, p.glu);
      break;
    }
    case Path::Wgmma:
      launch.wgmma_config = verdict.candidate->wgmma;
      launch.wgmma = p.experts > 0
                         ? grouped_wgmma_launch(*launch.wgmma_config, m, p.experts,
                                                p.route_block, *weight.wgmma, launch.operand, gpu)
                         : wgmma_launch(*launch.wgmma_config, m, *weight.wgmma, launch.operand, gpu);
      launch.group_scales =
          launch.wgmma_config->tile.eight_bit && wgmma_fp8_activation_groups(quant);
      launch.gemm = wgmma_spec(*launch.wgmma_config, launch.wgmma, *weight.wgmma, launch.operand,
                               p.scheme.output, arch, launch.group_scales, p.experts > 0, p.glu);
      break;
    case Path::Qdq:
      launch.qdq = qdq_launch(p, m, weight);
      if (launch.row_factors && qdq_folds_row_factors(p)) {
        launch.fold_row_factors = true;
        launch.row_factors = false;
      }
      launch.dequantize = qdq_dequantize_spec(weight, launch.operand, arch);
      if (launch.qdq.finish) launch.finish = finish_gemm_spec(p.scheme.output, arch);
      break;
    case Path::CublasLtFp8:
      if (quant.is_quantized() && !p.prequantized) {
        launch.prep = ActivationPrep::Quantize;
        launch.prepare = jit::quantize_activation_spec(quant, p.input, jit::ActivationEmit::Codes,
                                                       formats::bf16, arch);
        if (runtime::needs_tensor_absmax(quant, static_activation_scale))
          launch.absmax = jit::tensor_absmax_spec(p.input, arch);
      }
      break;
  }
  return launch;
}

std::vector<jit::KernelSpec> problem_specs(const GemmProblem& problem, const WeightFacts& weight,
                                           const SelectionContext& context,
                                           double static_activation_scale, bool every_m) {
  std::vector<jit::KernelSpec> specs;
  // `judged` at M = `high`: the problem itself for its buckets; for each M a problem of that M
  // alone, as Engine::gemm plans it (what a candidate serves can depend on the range: cuBLASLt
  // FP8 plans one M).
  auto add = [&](const GemmProblem& judged, std::int64_t high) {
    // A grouped GEMM is judged as the dense GEMM it costs, without the (dense) tuning table, as
    // the Engine's plan judges it.
    const Selection selection =
        judged.experts > 0
            ? [&] {
                const GroupedView view = grouped_view(judged, weight, high);
                SelectionContext grouped_context = context;
                grouped_context.table = nullptr;
                return select(view.problem, view.m, view.weight, grouped_context);
              }()
            : select(judged, high, weight, context);
    for (jit::KernelSpec& spec : candidate_launch(judged, high, selection.chosen(), weight,
                                                  context.gpu, static_activation_scale)
                                     .specs())
      if (std::find(specs.begin(), specs.end(), spec) == specs.end())
        specs.push_back(std::move(spec));
  };
  for (const auto& bucket : m_buckets(problem)) add(problem, bucket.second);
  if (every_m) {
    GemmProblem exact = problem;
    exact.m_max = 0;
    for (exact.m = problem.m; exact.m <= problem.max_rows(); ++exact.m) add(exact, exact.m);
  }
  return specs;
}

std::vector<jit::KernelSpec> kernel_catalog(const GpuLimits& gpu) {
  std::vector<jit::KernelSpec> specs = jit::catalog_specs(gpu.arch);
  SelectionContext context;
  context.gpu = gpu;
  context.rates = GpuRates::of(gpu);
  for (const Preset& preset : presets()) {
    GemmProblem problem;
    problem.scheme = preset.scheme;
    problem.m = 1;
    problem.m_max = 8192;
    problem.n = problem.k = 4096;
    problem.input = preset.scheme.activation.is_quantized() ? formats::bf16
                                                            : preset.scheme.activation.format;
    // A target a preset cannot run on (bf16 on sm_75) leaves it out.
    try {
      // The layouts prepare_weight would keep for the range (on SM90 the decode kernel then
      // reads the wgmma order).
      const WeightFacts of_scheme = WeightFacts::of_scheme(problem.scheme, 4096, 4096, gpu.arch);
      const WeightFacts weight = keep_layouts(
          of_scheme, kept_layouts(problem, of_scheme, problem.max_rows(), context));
      for (jit::KernelSpec& spec : problem_specs(problem, weight, context))
        if (std::find(specs.begin(), specs.end(), spec) == specs.end())
          specs.push_back(std::move(spec));
    } catch (const Error& error) {
      if (error.code() != ErrorCode::Unsupported) throw;
    }
  }
  return specs;
}

}  // namespace qgemm::dispatch
