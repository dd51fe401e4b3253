#include "dispatch/cublaslt_family.hpp"

#include <fmt/format.h>

#include "dispatch/select.hpp"

namespace qgemm::dispatch {

namespace {

bool is_fp8(const Format& format) { return format == formats::e4m3 || format == formats::e5m2; }

}  // namespace

const char* cublaslt_scaling_name(CublasLtScaling scaling) {
  switch (scaling) {
    case CublasLtScaling::Tensor: return "per-tensor scales";
    case CublasLtScaling::Outer: return "per-row x per-column scales";
    case CublasLtScaling::Block: return "1x128 x 128x128 block scales";
  }
  return "?";
}

CublasLtScaling cublaslt_scaling(const Scheme& scheme) {
  if (scheme.weight.granularity == WeightGranularity::Block) return CublasLtScaling::Block;
  if (scheme.weight.granularity == WeightGranularity::PerTensor &&
      scheme.activation.scaling == ActivationScaling::StaticTensor)
    return CublasLtScaling::Tensor;
  return CublasLtScaling::Outer;
}

std::string cublaslt_weight_unsupported_reason(const WeightQuant& w, jit::Arch arch) {
  if (arch < jit::Arch::sm_89 || arch == jit::Arch::sm_120a)
    return fmt::format("cuBLASLt FP8 runs on SM89, SM90 and SM100 (not {})", jit::arch_name(arch));
  if (!is_fp8(w.format))
    return fmt::format("the weight's codes are {}, not e4m3/e5m2", w.format.name());
  if (w.zero_point != ZeroPoint::None) return "cuBLASLt FP8 takes no zero points";
  switch (w.granularity) {
    case WeightGranularity::PerTensor:
    case WeightGranularity::PerChannel: break;
    case WeightGranularity::Block:
      if (w.block_n == 128 && w.block_k == 128) break;
      [[fallthrough]];
    case WeightGranularity::Group:
      return "cuBLASLt FP8 scales weights per tensor, per channel or in 128x128 blocks";
  }
  return {};
}

std::string cublaslt_unsupported_reason(const GemmProblem& p, std::int64_t m,
                                        const WeightFacts& weight, jit::Arch arch) {
  if (std::string why = cublaslt_weight_unsupported_reason(weight.quant, arch); !why.empty())
    return why;
  if (!weight.canonical) return "the weight's canonical codes are not on the device";
  const ActivationQuant& a = p.scheme.activation;
  if (!a.is_quantized() || !is_fp8(a.format))
    return fmt::format("the activations are {}, not e4m3/e5m2 codes", a.format.name());
  if (a.format == formats::e5m2 && weight.quant.format == formats::e5m2)
    return "cuBLASLt FP8 does not multiply e5m2 by e5m2";
  const bool block_weight = weight.quant.granularity == WeightGranularity::Block;
  if (block_weight) {
    if (a.scaling != ActivationScaling::DynamicGroup || a.group != 128)
      return "128x128 weight blocks pair with 1x128 activation groups in cuBLASLt";
    if (arch < jit::Arch::sm_90a) return "cuBLASLt block scaling needs SM90 or later";
    // Measured on the H200 (CUDA 13.0): cuBLASLt offers no block-scaled algorithm below 16 rows.
    if (m < 16) return "cuBLASLt offers no 128-block scaled algorithm below M = 16";
  } else if (a.scaling != ActivationScaling::StaticTensor &&
             a.scaling != ActivationScaling::DynamicToken) {
    return "cuBLASLt FP8 scales activations per tensor or per token (with these weight scales)";
  }
  if (p.k % 16 != 0 || p.n % 16 != 0)
    return fmt::format("cuBLASLt FP8 needs N and K in multiples of 16 (N = {}, K = {})", p.n, p.k);
  if (p.bias) return "the bias is not wired into the cuBLASLt FP8 call";
  return {};
}

}  // namespace qgemm::dispatch
