#include "dispatch/cublaslt_family.hpp"

#include <fmt/format.h>

#include "dispatch/select.hpp"

namespace qgemm::dispatch {

std::optional<runtime::Fp8ScaleModes> cublaslt_modes(const Scheme& scheme, std::string* why_not) {
  return runtime::fp8_scale_modes(scheme, why_not);
}

runtime::Fp8MatmulShape cublaslt_shape(const GemmProblem& p, std::int64_t m,
                                       const runtime::Fp8ScaleModes& modes, jit::Arch arch) {
  runtime::Fp8MatmulShape shape;
  shape.m = m;
  shape.n = p.n;
  shape.k = p.k;
  shape.a_format = p.scheme.activation.format;
  shape.w_format = p.scheme.weight.format;
  shape.a_scale = modes.activation;
  shape.w_scale = modes.weight;
  shape.c_format = p.scheme.output;
  shape.ldc = p.ldc ? p.ldc : p.n;
  // Block-scaled kernels promote the accumulation to fp32; the others accumulate fast, as
  // serving engines run FP8 (the bench's cublaslt-fp8 baseline does too).
  shape.fast_accumulation = modes.activation != runtime::Fp8ScaleMode::Block1x128;
  shape.alignment = 16;
  shape.compute_capability = jit::compute_capability(arch);
  return shape;
}

std::string cublaslt_unsupported_reason(const GemmProblem& p, std::int64_t m,
                                        const WeightFacts& weight, jit::Arch arch) {
  std::string why;
  const auto modes = cublaslt_modes(p.scheme, &why);
  if (!modes) return why;
  why = runtime::fp8_matmul_unsupported_reason(cublaslt_shape(p, m, *modes, arch));
  if (!why.empty()) return why;
  if (!weight.canonical || weight.fp8_weight_mode != modes->weight)
    return fmt::format("the weight was not prepared with {} scales for cuBLASLt (prepare it with "
                       "this activation quantization)",
                       runtime::fp8_scale_mode_name(modes->weight));
  if (p.m_max > p.m) return "cuBLASLt's descriptors hold M: it serves plans of one exact M";
  if (p.bias) return "the bias is not wired into the cuBLASLt FP8 call";
  if (p.c_alignment < 16)
    return fmt::format("C is {}-byte aligned (rule: cuBLASLt's FP8 kernels write C from a 16-byte "
                       "aligned address)",
                       p.c_alignment);
  if (p.prequantized && !cublaslt_reads_code_scales(p.scheme.activation, modes->activation) &&
      !transposes_code_scales(p.scheme.activation, modes->activation))
    return fmt::format("pre-quantized codes carry their scales in the canonical layout, not "
                       "cuBLASLt's {} layout (pass bf16/fp16 activations)",
                       runtime::fp8_scale_mode_name(modes->activation));
  return {};
}

bool cublaslt_reads_code_scales(const ActivationQuant& quant, runtime::Fp8ScaleMode mode) {
  // The canonical grid of per-token scales is [rows]; of a static scale, [0].
  return mode == runtime::Fp8ScaleMode::OuterVector ||
         (mode == runtime::Fp8ScaleMode::Tensor && quant.scaling == ActivationScaling::StaticTensor);
}

bool transposes_code_scales(const ActivationQuant& quant, runtime::Fp8ScaleMode mode) {
  return mode == runtime::Fp8ScaleMode::Block1x128 &&
         quant.scaling == ActivationScaling::DynamicGroup &&
         quant.group == runtime::kFp8ScaleBlock && quant.scale_format == formats::fp32;
}

}  // namespace qgemm::dispatch
