// cuBLASLt FP8 ("cublaslt-fp8"): for weights stored as 8-bit floats against 8-bit float
// activations, cuBLASLt's FP8 GEMM on the stored codes, with the scheme's scales as its scale
// modes. src/runtime/cublaslt.hpp runs it and states cuBLASLt's rules (the scale-mode pairs,
// alignment, compute capability); this file adds what the selector knows besides:
//
//   - the weight's cuBLASLt scales were prepared for the problem's scale modes
//   - cuBLASLt's descriptors hold M, N and C's row stride: a plan takes it for one exact M
//   - no bias (its epilogue is not wired)
//   - pre-quantized codes: their canonical scales are cuBLASLt's as they are (per token, static),
//     or g128 fp32 scales that one transpose per call turns into its 1x128 layout
//
// The global scale is cuBLASLt's alpha. Nothing here needs a GPU (`qgemm explain` applies it);
// on a GPU a plan also asks cuBLASLt for an algorithm and rejects the candidate when it has none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "jit/kernel_spec.hpp"
#include "qgemm/plan.hpp"
#include "runtime/cublaslt.hpp"

namespace qgemm::dispatch {

struct WeightFacts;

// The scale modes `scheme` runs with through cuBLASLt, or nullopt with the reason.
std::optional<runtime::Fp8ScaleModes> cublaslt_modes(const Scheme& scheme,
                                                     std::string* why_not = nullptr);

// The shape of cuBLASLt's call for M rows of `problem` on `arch` (modes: cublaslt_modes).
runtime::Fp8MatmulShape cublaslt_shape(const GemmProblem& problem, std::int64_t m,
                                       const runtime::Fp8ScaleModes& modes, jit::Arch arch);

// Empty when cuBLASLt FP8 serves the problem at M rows; else why not.
std::string cublaslt_unsupported_reason(const GemmProblem& problem, std::int64_t m,
                                        const WeightFacts& weight, jit::Arch arch);

// Pre-quantized codes' canonical scales (include/qgemm/quant.hpp) as cuBLASLt reads them in
// `mode`, as they are; or after Block1x128ScaleTranspose (g128 fp32 scales into 1x128 blocks).
bool cublaslt_reads_code_scales(const ActivationQuant& quant, runtime::Fp8ScaleMode mode);
bool transposes_code_scales(const ActivationQuant& quant, runtime::Fp8ScaleMode mode);

}  // namespace qgemm::dispatch
