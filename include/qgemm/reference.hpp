// The CPU reference: the oracle of every test and the backend when there is no GPU.
//
// It dequantizes the same packed operands exactly and accumulates in double. It shares no code
// with any GPU path. Correct, not fast (multithreaded over rows so that tests stay quick).
#pragma once

#include <cstdint>
#include <vector>

#include "qgemm/moe.hpp"
#include "qgemm/quant.hpp"

namespace qgemm::reference {

// C[m, n] = Σ_k a[m, k] · w[n, k] (+ bias[n]), double in, double out, row-major.
std::vector<double> matmul_nt(const double* a, const double* w, std::int64_t m, std::int64_t n,
                              std::int64_t k, const double* bias = nullptr);

// The quantized GEMM as the scheme defines it: dequantize both operands, multiply in double,
// add bias, and round once to the scheme's output format. `bias` may be null.
std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a, const PackedWeight& w,
                         const float* bias = nullptr);

// Mixture of experts. Token t goes to experts expert_ids[t·top_k + j] with router weights
// weights[t·top_k + j]; its output is Σ_j weight · expert(a_t).
//   plain      expert(x) = x · W_eᵀ                                  W_e: [n, k]
//   gate_up    expert(x) = silu(x · G_eᵀ) ⊙ (x · U_eᵀ)                W_e: [2n, k], G rows 0..n-1,
//                                                                        U rows n..2n-1
struct MoeRouting {
  std::int64_t tokens = 0;
  int top_k = 1;
  std::vector<std::int32_t> expert_ids;  // [tokens · top_k], each in [0, experts)
  std::vector<float> weights;            // [tokens · top_k]
};
enum class MoeActivation { None, SiluGlu };
// Output [tokens, n] rounded to the scheme's output format; rejects ids out of range.
std::vector<double> moe(const Scheme& scheme, const PackedActivation& a,
                        const std::vector<PackedWeight>& experts, const MoeRouting& routing,
                        MoeActivation activation = MoeActivation::None);

// A whole routed expert layer, as Engine::moe defines it. For each slot (token t, choice j)
// routed to expert e:
//   g = a_t · GU_eᵀ (+ gate_up_bias[e])         GU_e: [2I, H], gate rows 0..I-1, up rows I..2I-1
//       rounded to `intermediate` (the 16-bit rows the gate_up GEMM writes)
//   h = glu(g[0..I), g[I..2I)) rounded to `intermediate` (the down GEMM's 16-bit A)
//   y = h · D_eᵀ (+ down_bias[e])                D_e: [H, I]
// out_t = Σ_j weights[t·top_k + j] · y in choice order, rounded once to the scheme's output.
// Both expert lists are quantized as scheme.weight; biases are host fp32 [E, 2I] and [E, H] or
// null.
std::vector<double> moe_layer(const Scheme& scheme, const PackedActivation& a,
                              const std::vector<PackedWeight>& gate_up,
                              const std::vector<PackedWeight>& down, const MoeRouting& routing,
                              const GluActivation& activation, const Format& intermediate,
                              const float* gate_up_bias = nullptr,
                              const float* down_bias = nullptr);

}  // namespace qgemm::reference
