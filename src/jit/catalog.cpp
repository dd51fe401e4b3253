#include "jit/catalog.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "gemm/mma_dequantize_shape.cuh"
#include "qgemm/error.hpp"

namespace qgemm::jit {
namespace {

constexpr int kUtilityThreads = 256;

// The validated spec of a utility kernel: no shared memory, one block shape per family.
KernelSpec utility_spec(std::string family, Arch arch, std::vector<SpecParam> params,
                        int threads = kUtilityThreads) {
  KernelSpec spec{std::move(family), std::move(params), arch, {threads, 0}};
  validate(spec);
  return spec;
}

std::string half_type_choice(const Format& format, const char* what) {
  if (format == formats::bf16) return "bf16";
  if (format == formats::fp16) return "fp16";
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{} = {} (rule: bf16 or fp16)", what, format.name()));
}

std::string zero_point_choice(ZeroPoint zero) {
  switch (zero) {
    case ZeroPoint::None: return "none";
    case ZeroPoint::Midpoint: return "mid";
    case ZeroPoint::Integer: return "int";
    case ZeroPoint::Float: return "float";
  }
  return "none";
}

// The `scaling` choice of the activation kernels (kernels::ActivationScalingCode).
std::string scaling_choice(const ActivationQuant& quant) {
  switch (quant.scaling) {
    case ActivationScaling::StaticTensor: return "static";
    case ActivationScaling::DynamicToken: return "token";
    case ActivationScaling::DynamicGroup: return "group";
    case ActivationScaling::MX: return "mx";
    case ActivationScaling::NV: return "nv";
    case ActivationScaling::None: break;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("activation quantization: {} activations are not quantized (rule: the "
                          "activation kernels take quantized activations)",
                          quant.format.name()));
}

}  // namespace

KernelSpec dequantize_weight_spec(const WeightQuant& weight, const Format& output, Arch arch) {
  return utility_spec("dequantize_weight", arch,
                      {SpecParam::number_format("weight", weight.format),
                       SpecParam::number_format("scale", weight.scale_format),
                       SpecParam::chosen("zero", zero_point_choice(weight.zero_point)),
                       SpecParam::chosen("out", half_type_choice(output, "dequantize output"))});
}

KernelSpec quantize_weight_spec(const WeightQuant& weight, const Format& input,
                                const std::string& step, Arch arch) {
  const std::string in = input == formats::fp32 ? "fp32" : half_type_choice(input, "weight input");
  return utility_spec("quantize_weight", arch,
                      {SpecParam::number_format("weight", weight.format),
                       SpecParam::number_format("scale", weight.scale_format),
                       SpecParam::chosen("zero", zero_point_choice(weight.zero_point)),
                       SpecParam::chosen("in", in), SpecParam::chosen("step", step)});
}

KernelSpec quantize_activation_spec(const ActivationQuant& quant, const Format& input,
                                    ActivationEmit emit, const Format& operand, Arch arch) {
  // One block per row of 256 threads: a decode call's few rows are spread over many threads (8
  // values each per 16-byte load), so each thread's loads are few and in flight together; 512
  // would cap a thread at 128 registers, which 8 codes in flight exceed (spills).
  return utility_spec("quantize_activation", arch,
                      {SpecParam::number_format("code", quant.format),
                       SpecParam::chosen("scaling", scaling_choice(quant)),
                       SpecParam::number_format("scale", quant.scale_format),
                       SpecParam::chosen("in", half_type_choice(input, "activation input")),
                       SpecParam::chosen("emit", emit == ActivationEmit::Codes     ? "codes"
                                                 : emit == ActivationEmit::Operand ? "operand"
                                                                                   : "operand8"),
                       SpecParam::chosen("operand", emit == ActivationEmit::Operand
                                                        ? half_type_choice(operand, "operand")
                                                        : "bf16")},
                      256);
}

namespace {

Format judge_operand_format(const ActivationQuant& quant) {
  const bool cell_scale_in_value = quant.scaling == ActivationScaling::NV;
  if (quant.scaling != ActivationScaling::StaticTensor &&
      quant.scaling != ActivationScaling::DynamicToken && !cell_scale_in_value)
    return formats::bf16;
  auto exact_in_fp16 = [](double value) { return round_to(formats::fp16, value) == value; };
  for (std::uint32_t code = 0; code < quant.format.code_count(); ++code) {
    if (!is_valid_code(quant.format, code)) continue;
    const double value = decode(quant.format, code);
    if (!std::isfinite(value)) continue;  // NaN codes never come out of the quantizer
    if (!cell_scale_in_value) {
      if (!exact_in_fp16(value)) return formats::bf16;
      continue;
    }
    for (std::uint32_t scale = 0; scale < quant.scale_format.code_count(); ++scale) {
      if (!is_valid_code(quant.scale_format, scale)) continue;
      const double product = value * decode(quant.scale_format, scale);
      if (std::isfinite(product) && !exact_in_fp16(product)) return formats::bf16;
    }
  }
  return formats::fp16;
}

}  // namespace

Format activation_operand_format(const ActivationQuant& quant) {
  // Every code (and NV scale) is judged: once per quantization per process.
  using Key = std::tuple<std::string, int, std::string>;
  static std::mutex mutex;
  static std::map<Key, Format> types;
  Key key{quant.format.name(), static_cast<int>(quant.scaling), quant.scale_format.name()};
  std::lock_guard lock(mutex);
  auto found = types.find(key);
  if (found == types.end())
    found = types.emplace(std::move(key), judge_operand_format(quant)).first;
  return found->second;
}

bool activation_row_factor(const ActivationQuant& quant) {
  return quant.scaling == ActivationScaling::StaticTensor ||
         quant.scaling == ActivationScaling::DynamicToken || quant.scaling == ActivationScaling::NV;
}

bool codes_are_operand8(const ActivationQuant& quant) {
  const bool row_scaled = quant.scaling == ActivationScaling::DynamicToken ||
                          quant.scaling == ActivationScaling::StaticTensor;
  return row_scaled && (quant.format == formats::int8 || quant.format == formats::e4m3);
}

KernelSpec expand_activation_spec(const ActivationQuant& quant, const Format& operand, Arch arch) {
  return utility_spec("expand_activation", arch,
                      {SpecParam::number_format("code", quant.format),
                       SpecParam::chosen("scaling", scaling_choice(quant)),
                       SpecParam::number_format("scale", quant.scale_format),
                       SpecParam::chosen("operand", operand.storage_bytes() == 1
                                                        ? "bytes"
                                                        : half_type_choice(operand, "operand"))});
}

KernelSpec moe_routing_spec(const std::string& step, Arch arch) {
  return utility_spec("moe_routing", arch, {SpecParam::chosen("step", step)},
                      kMoeRoutingThreads);
}

KernelSpec moe_group_ids_spec(Arch arch) {
  return utility_spec("moe_group_ids", arch, {}, kMoeRoutingThreads);
}

KernelSpec moe_row_blocks_spec(Arch arch) {
  return utility_spec("moe_row_blocks", arch, {}, kMoeRoutingThreads);
}

namespace {
std::string glue_type_choice(const Format& format, const char* what) {
  if (format == formats::fp32) return "fp32";
  return half_type_choice(format, what);
}
}  // namespace

KernelSpec moe_gather_spec(const Format& rows, Arch arch) {
  return utility_spec("moe_glue", arch,
                      {SpecParam::chosen("step", "gather"),
                       SpecParam::chosen("rows", half_type_choice(rows, "moe gather rows")),
                       SpecParam::chosen("out", "bf16")});
}

KernelSpec moe_combine_spec(const Format& rows, const Format& output, Arch arch) {
  return utility_spec("moe_glue", arch,
                      {SpecParam::chosen("step", "combine"),
                       SpecParam::chosen("rows", glue_type_choice(rows, "moe combine rows")),
                       SpecParam::chosen("out", glue_type_choice(output, "moe combine output"))});
}

KernelSpec moe_glu_spec(const Format& rows, const Format& output, Arch arch) {
  return utility_spec("moe_glue", arch,
                      {SpecParam::chosen("step", "glu"),
                       SpecParam::chosen("rows", glue_type_choice(rows, "moe glu rows")),
                       SpecParam::chosen("out", half_type_choice(output, "moe glu output"))});
}

KernelSpec tensor_absmax_spec(const Format& input, Arch arch) {
  return utility_spec("tensor_absmax", arch,
                      {SpecParam::chosen("in", half_type_choice(input, "absmax input"))});
}

KernelSpec repack_weight_spec(int bits, Arch arch) {
  return utility_spec("repack_weight", arch, {SpecParam::integer("bits", bits)});
}

KernelSpec mma_dequantize_spec(const layout::MmaWeight& weight, const Format& output, Arch arch) {
  using Shape = kernels::MmaDequantizeShape;
  const std::string out = half_type_choice(output, "mma_dequantize output");
  // The exact value in 16 bits where the decode kernel's unscaled dequantization makes one (not
  // with float zeros: u − zero is not exact there), times the scale in 16 bits where every scale
  // is exact in the output type; else fp32 math. Each rounds the value once.
  std::string value = "fp32", scale = "fp32";
  if (weight.zero_mode != layout::MmaZeroMode::Float) {
    if (auto unscaled = layout::unscaled_dequant(weight, output)) {
      value = *unscaled;
      const bool exact =
          output == formats::bf16 ? weight.scales_exact_in_bf16 : weight.scales_exact_in_fp16;
      if (exact) scale = "half";
    }
  }
  KernelSpec spec{
      "mma_dequantize",
      {SpecParam::number_format("weight", weight.format),
       SpecParam::chosen("zero", layout::mma_zero_mode_name(weight.zero_mode)),
       SpecParam::integer("group", weight.group_size), SpecParam::chosen("dequant", value),
       SpecParam::chosen("scale", scale), SpecParam::chosen("out", out),
       SpecParam::chosen("order", layout::fragment_order_name(weight.order))},
      arch,
      {Shape::kThreads, Shape::kSmemBytes}};
  validate(spec);
  return spec;
}

std::vector<KernelSpec> catalog_specs(Arch arch) {
  // The weight formats of the presets real checkpoints use, with their usual scales.
  struct WeightCase {
    Format format;
    Format scale;
    ZeroPoint zero;
  };
  const WeightCase weights[] = {
      {formats::uint4, formats::bf16, ZeroPoint::Midpoint},  // GPTQ symmetric
      {formats::uint4, formats::fp16, ZeroPoint::Integer},   // GPTQ/AWQ asymmetric
      {formats::int4, formats::bf16, ZeroPoint::None},
      {formats::int8, formats::fp32, ZeroPoint::None},       // W8A8 per channel
      {formats::e4m3, formats::fp32, ZeroPoint::None},       // FP8 block
      {formats::e2m1, formats::e8m0, ZeroPoint::None},       // MXFP4
      {formats::e2m1, formats::ue4m3, ZeroPoint::None},      // NVFP4
      {formats::ternary(), formats::bf16, ZeroPoint::None},  // ternary (BitNet)
  };
  std::vector<KernelSpec> specs;
  for (const auto& w : weights) {
    WeightQuant quant;
    quant.format = w.format;
    quant.scale_format = w.scale;
    quant.zero_point = w.zero;
    for (const Format& out : {formats::bf16, formats::fp16}) {
      specs.push_back(dequantize_weight_spec(quant, out, arch));
    }
    // Their quantization on the GPU from bf16 checkpoints' weights.
    for (const char* step : {"stats", "cells", "codes"})
      specs.push_back(quantize_weight_spec(quant, formats::bf16, step, arch));
  }
  // The activation quantizations of the presets, into the GEMM operand; int8 / e4m3 with one
  // scale per row also into the 8-bit mma's operand; 8-bit float codes with fp32 scales also
  // into codes, the operand of cuBLASLt FP8 (runtime/cublaslt.hpp: w8a8-fp8, fp8-block).
  for (const auto& preset : presets()) {
    const ActivationQuant& quant = preset.scheme.activation;
    if (!quant.is_quantized()) continue;
    std::vector<KernelSpec> wanted = {quantize_activation_spec(
        quant, formats::bf16, ActivationEmit::Operand, activation_operand_format(quant), arch)};
    if (codes_are_operand8(quant)) {
      wanted.push_back(quantize_activation_spec(quant, formats::bf16, ActivationEmit::Operand8,
                                                quant.format, arch));
      wanted.push_back(expand_activation_spec(quant, quant.format, arch));
    }
    const bool fp8_codes = (quant.format == formats::e4m3 || quant.format == formats::e5m2) &&
                           quant.scale_format == formats::fp32;
    if (fp8_codes)
      wanted.push_back(quantize_activation_spec(quant, formats::bf16, ActivationEmit::Codes,
                                                formats::bf16, arch));
    for (const KernelSpec& spec : wanted)
      if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
  }
  specs.push_back(tensor_absmax_spec(formats::bf16, arch));
  for (int bits : {2, 3, 4, 8}) specs.push_back(repack_weight_spec(bits, arch));
  for (const char* step : {"count", "offsets", "scatter", "small"})
    specs.push_back(moe_routing_spec(step, arch));
  specs.push_back(moe_group_ids_spec(arch));
  specs.push_back(moe_row_blocks_spec(arch));
  for (const Format& type : {formats::bf16, formats::fp16}) {
    specs.push_back(moe_gather_spec(type, arch));
    specs.push_back(moe_combine_spec(formats::fp32, type, arch));
    specs.push_back(moe_combine_spec(type, type, arch));
    specs.push_back(moe_glu_spec(type, type, arch));
  }
  return specs;
}

}  // namespace qgemm::jit
