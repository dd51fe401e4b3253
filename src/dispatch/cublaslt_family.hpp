// cuBLASLt FP8 ("cublaslt-fp8"): for weights stored as 8-bit floats against 8-bit float
// activations, cuBLASLt's FP8 GEMM on the stored codes, with the scheme's scales as its scale
// modes (src/runtime/cublaslt.hpp runs it):
//
//   activations          weights              cuBLASLt scale modes (A = activations here)
//   per tensor           per tensor           SCALAR_32F × SCALAR_32F
//   per token / tensor   per channel / tensor OUTER_VEC_32F × OUTER_VEC_32F (a tensor scale
//                                             repeated along the vector)
//   1×128 groups         128×128 blocks       VEC128_32F × BLK128x128_32F (SM90+; accumulation
//                                             promoted to fp32: cuBLASLt offers no fast mode)
//
// The global scale is cuBLASLt's alpha. These rules need no GPU: `qgemm explain` applies them;
// on a GPU a plan also asks cuBLASLt for an algorithm and rejects the candidate when it has none.
#pragma once

#include <cstdint>
#include <string>

#include "jit/kernel_spec.hpp"
#include "qgemm/plan.hpp"

namespace qgemm::dispatch {

struct WeightFacts;

enum class CublasLtScaling { Tensor, Outer, Block };
const char* cublaslt_scaling_name(CublasLtScaling scaling);  // "per-tensor scales", ...
// The scale modes of a scheme that passes cublaslt_unsupported_reason.
CublasLtScaling cublaslt_scaling(const Scheme& scheme);

// Empty when cuBLASLt FP8 can multiply this weight's stored codes on `arch`; else why not.
std::string cublaslt_weight_unsupported_reason(const WeightQuant& weight, jit::Arch arch);
// Empty when it serves the problem at M rows; else why not.
std::string cublaslt_unsupported_reason(const GemmProblem& problem, std::int64_t m,
                                        const WeightFacts& weight, jit::Arch arch);

}  // namespace qgemm::dispatch
