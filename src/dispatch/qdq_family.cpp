#include "dispatch/qdq_family.hpp"

#include <algorithm>

#include "dispatch/select.hpp"
#include "gemm/mma_dequantize_shape.cuh"
#include "jit/catalog.hpp"

namespace qgemm::dispatch {

bool qdq_folds_row_factors(const GemmProblem& p) { return p.scheme.output == formats::bf16; }

Format qdq_operand(const GemmProblem& p) {
  const ActivationQuant& quant = p.scheme.activation;
  if (!quant.is_quantized()) return p.input;
  // Every quantized activation value is exact in bf16 (codes of ≤ 8 significant bits, times a
  // power of two or a ue4m3 cell scale), or rounded once anyway (group scales, folded row
  // factors); fp16 only where the output is fp16 and fp16 holds the values too.
  const Format exact = jit::activation_operand_format(quant);
  return p.scheme.output == formats::fp16 && exact == formats::fp16 ? formats::fp16
                                                                      : formats::bf16;
}

QdqLaunch qdq_launch(const GemmProblem& p, std::int64_t m, const WeightFacts& weight) {
  // Chunks of whole 64-row slices (and whole scale rows of a block grid) that keep the 16-bit
  // weight chunk under 64 MiB and, where C needs fp32 sums first, those under 128 MiB: bounded
  // scratch, and each cuBLAS call still a large GEMM (8192 rows of a K = 4096 weight).
  constexpr std::int64_t kWeightBytes = std::int64_t{64} << 20, kSumBytes = std::int64_t{128} << 20;
  QdqLaunch launch;
  const Format& output = p.scheme.output;
  const Format operand = qdq_operand(p);
  // cuBLAS writes C itself unless a bias, an output type it cannot write from this operand, or
  // the activations' per-row factors (dispatch::qdq_folds_row_factors) ask for the finish.
  const bool row_factors = p.scheme.activation.is_quantized() &&
                           jit::activation_row_factor(p.scheme.activation) &&
                           !qdq_folds_row_factors(p);
  launch.finish = p.bias || row_factors || !(output == operand || output == formats::fp32);
  std::int64_t rows = kWeightBytes / (2 * p.k);
  if (launch.finish) rows = std::min(rows, kSumBytes / (4 * m));
  std::int64_t unit = 64;
  const ScaleGrid grid = weight_scale_grid(weight.quant, p.n, p.k);
  while (unit % grid.rows_per != 0) unit += 64;  // block grids: chunks start on scale rows
  const std::int64_t n_padded = (p.n + 63) / 64 * 64;
  launch.chunk_n = std::clamp<std::int64_t>(rows / unit * unit, unit, (n_padded + unit - 1) / unit * unit);
  launch.chunks = static_cast<int>((p.n + launch.chunk_n - 1) / launch.chunk_n);
  return launch;
}

const layout::MmaWeight* qdq_prepared_weight(const WeightFacts& weight) {
  if (weight.mma) return &*weight.mma;
  if (weight.canonical) return nullptr;
  return weight.wgmma ? &*weight.wgmma : nullptr;
}

std::int64_t qdq_weight_ld(const WeightFacts& weight) {
  return qdq_prepared_weight(weight) ? kernels::MmaDequantizeShape::ld_out(weight.k) : weight.k;
}

jit::KernelSpec qdq_dequantize_spec(const WeightFacts& weight, const Format& operand,
                                    jit::Arch arch) {
  if (const layout::MmaWeight* prepared = qdq_prepared_weight(weight))
    return jit::mma_dequantize_spec(*prepared, operand, arch);
  return jit::dequantize_weight_spec(weight.quant, operand, arch);
}

jit::KernelSpec finish_gemm_spec(const Format& output, jit::Arch arch) {
  jit::KernelSpec spec;
  spec.family = "finish_gemm";
  spec.arch = arch;
  spec.params = {jit::SpecParam::chosen("out", output.name())};
  spec.launch.threads_per_block = 256;
  spec.launch.dynamic_smem_bytes = 0;
  return spec;
}

}  // namespace qgemm::dispatch
