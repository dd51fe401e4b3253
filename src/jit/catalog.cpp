#include "jit/catalog.hpp"

#include <fmt/format.h>

#include "qgemm/error.hpp"

namespace qgemm::jit {
namespace {

constexpr int kUtilityThreads = 256;

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

}  // namespace

KernelSpec dequantize_weight_spec(const WeightQuant& weight, const Format& output, Arch arch) {
  KernelSpec spec;
  spec.family = "dequantize_weight";
  spec.arch = arch;
  spec.launch = {kUtilityThreads, 0};
  spec.params = {SpecParam::number_format("weight", weight.format),
                 SpecParam::number_format("scale", weight.scale_format),
                 SpecParam::chosen("zero", zero_point_choice(weight.zero_point)),
                 SpecParam::chosen("out", half_type_choice(output, "dequantize output"))};
  validate(spec);
  return spec;
}

KernelSpec quantize_activation_spec(const Format& code, const Format& input, Arch arch) {
  KernelSpec spec;
  spec.family = "quantize_activation";
  spec.arch = arch;
  spec.launch = {kUtilityThreads, 0};
  spec.params = {SpecParam::number_format("code", code),
                 SpecParam::chosen("in", half_type_choice(input, "activation input"))};
  validate(spec);
  return spec;
}

KernelSpec repack_weight_spec(int bits, Arch arch) {
  KernelSpec spec;
  spec.family = "repack_weight";
  spec.arch = arch;
  spec.launch = {kUtilityThreads, 0};
  spec.params = {SpecParam::integer("bits", bits)};
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
  }
  for (const Format& code : {formats::e4m3, formats::int8}) {
    specs.push_back(quantize_activation_spec(code, formats::bf16, arch));
  }
  for (int bits : {2, 3, 4, 8}) specs.push_back(repack_weight_spec(bits, arch));
  return specs;
}

}  // namespace qgemm::jit
