// The CPU reference: the oracle of every test and the backend when there is no GPU.
//
// It dequantizes the same packed operands exactly and accumulates in double. It shares no code
// with any GPU path. Correct, not fast (multithreaded over rows so that tests stay quick).
#pragma once

#include <cstdint>
#include <vector>

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

}  // namespace qgemm::reference
