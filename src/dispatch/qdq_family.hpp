// Dequantize + cuBLAS ("qdq"): the obvious alternative to a fused kernel, and the candidate that
// serves every weight. The weight is dequantized to the GEMM's 16-bit operand type chunk by
// chunk of N rows into scratch, and cuBLAS multiplies each chunk:
//
//   A (16-bit; quantized activations: their 16-bit operand, the per-row factor folded in)
//   for each chunk of N:   dequantize   weight rows ──► W16[chunk][K]
//                          cuBLAS       C[:, chunk] = A · W16ᵀ · alpha      (alpha: the global
//                                       scale, and the activations' tensor scale)
//                          finish       only where cuBLAS cannot write C itself: a bias, or an
//                                       output type other than the operand's and fp32 — cuBLAS
//                                       then writes fp32 sums that finish_gemm converts
//
// The weight is read in the mma layout where it has one (kernels/gemm/dequant_cublas.cuh), else
// in its canonical form (kernels/util/dequantize.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/plan.hpp"

namespace qgemm::dispatch {

struct WeightFacts;

struct QdqLaunch {
  std::int64_t chunk_n = 0;  // weight rows dequantized per cuBLAS call
  int chunks = 1;
  bool finish = false;  // cuBLAS writes fp32 sums, finish_gemm writes C
};

QdqLaunch qdq_launch(const GemmProblem& problem, std::int64_t m, const WeightFacts& weight);

// The 16-bit type A and the dequantized weight meet in: A's own type, or for quantized activations
// the output's 16-bit type where the values are exact there (so that cuBLAS writes C itself),
// else bf16.
Format qdq_operand(const GemmProblem& problem);

// Whether the activation quantizer multiplies the per-row factors of quantized activations into
// the 16-bit operand for this path, so that cuBLAS writes C directly: for a bf16 output, where
// that rounding (2^-9 relative) is the output's own. For fp16 (whose range could not hold every
// folded value) and fp32 outputs the operands stay exact and the finish applies the factors.
bool qdq_folds_row_factors(const GemmProblem& problem);

// The prepared weight dequantize + cuBLAS reads (mma_dequantize.cuh reads either order): the
// mma layout, else none where the canonical codes are on the device (their own dequantizer),
// else the wgmma order.
const layout::MmaWeight* qdq_prepared_weight(const WeightFacts& weight);

// The row stride of the dequantized 16-bit weight: K rounded up to 8 from the mma layout (whole
// 16-byte stores, kernels/gemm/mma_dequantize_shape.cuh), K from the canonical form.
std::int64_t qdq_weight_ld(const WeightFacts& weight);

// The dequantization kernel of the weight into `operand` (bf16 / fp16).
jit::KernelSpec qdq_dequantize_spec(const WeightFacts& weight, const Format& operand,
                                    jit::Arch arch);
// fp32 sums (· row factor, + bias) → C in `output`.
jit::KernelSpec finish_gemm_spec(const Format& output, jit::Arch arch);

}  // namespace qgemm::dispatch
