// KernelSpec text form, validation errors, the packed format constant, source generation and
// the ptxas report parser. No NVRTC here (test_jit_cache.cpp compiles).
#include <gtest/gtest.h>

#include <string>

#include "../../kernels/util/format_code.cuh"
#include "jit/catalog.hpp"
#include "jit/compiler.hpp"
#include "jit/kernel_spec.hpp"
#include "jit/source.hpp"
#include "qgemm/error.hpp"
#include "quant/quantize_on_device.hpp"

namespace qgemm::jit {
namespace {

// The message of the Error `action` throws (fails the test when it throws nothing else).
template <typename Action>
std::string error_message(Action action, ErrorCode expected_code = ErrorCode::InvalidArgument) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), expected_code) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "no qgemm::Error thrown";
  return "";
}

TEST(JitSpec, TextFormIsReadableAndExact) {
  WeightQuant quant;
  quant.format = formats::uint4;
  quant.scale_format = formats::bf16;
  quant.zero_point = ZeroPoint::Midpoint;
  const KernelSpec spec = dequantize_weight_spec(quant, formats::bf16, Arch::sm_90a);
  EXPECT_EQ(to_string(spec),
            "dequantize_weight<weight=uint4,scale=bf16,zero=mid,out=bf16>[threads=256,smem=0]"
            "@sm_90a");
}

TEST(JitSpec, EveryCatalogSpecRoundTripsThroughText) {
  for (Arch arch : all_archs()) {
    for (const KernelSpec& spec : catalog_specs(arch)) {
      const std::string text = to_string(spec);
      const KernelSpec parsed = parse_kernel_spec(text);
      EXPECT_EQ(parsed, spec) << text;
      EXPECT_EQ(to_string(parsed), text);
      EXPECT_EQ(spec_hash(parsed), spec_hash(spec)) << text;
    }
  }
}

TEST(JitSpec, DistinctSpecsHashDistinctly) {
  const auto specs = catalog_specs(Arch::sm_80);
  const auto other_arch = catalog_specs(Arch::sm_90a);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_FALSE(spec_hash(specs[i]) == spec_hash(other_arch[i])) << to_string(specs[i]);
    for (std::size_t j = i + 1; j < specs.size(); ++j) {
      EXPECT_FALSE(spec_hash(specs[i]) == spec_hash(specs[j]))
          << to_string(specs[i]) << " vs " << to_string(specs[j]);
    }
  }
}

TEST(JitSpec, ArchNames) {
  EXPECT_EQ(parse_arch("sm_90a"), Arch::sm_90a);
  EXPECT_EQ(parse_arch("SM90A"), Arch::sm_90a);
  EXPECT_EQ(parse_arch("120a"), Arch::sm_120a);
  EXPECT_EQ(arch_name(Arch::sm_100a), "sm_100a");
  EXPECT_EQ(arch_for_device(9, 0), Arch::sm_90a);
  EXPECT_EQ(arch_for_device(8, 7), Arch::sm_86);
  EXPECT_EQ(arch_for_device(8, 9), Arch::sm_89);
  EXPECT_NE(error_message([] { parse_arch("sm_61"); }).find("sm_61"), std::string::npos);
  EXPECT_NE(error_message([] { arch_for_device(6, 1); }, ErrorCode::Unsupported).find("6.1"),
            std::string::npos);
}

TEST(JitSpec, BadSpecsGiveClearErrors) {
  const std::string good = "repack_weight<bits=4>[threads=256,smem=0]@sm_80";
  EXPECT_NO_THROW(parse_kernel_spec(good));
  struct Case {
    std::string text;
    std::string must_mention;
  };
  const Case cases[] = {
      {"gemm_wgmma<bits=4>[threads=256,smem=0]@sm_80", "gemm_wgmma"},
      {"repack_weight<bits=4>[threads=256,smem=0]@sm_61", "sm_61"},
      {"repack_weight<bits=4>[threads=256,smem=0]", "@arch"},
      {"repack_weight<bits=four>[threads=256,smem=0]@sm_80", "four"},
      {"repack_weight<bits=9>[threads=256,smem=0]@sm_80", "bits = 9"},
      {"repack_weight<width=4>[threads=256,smem=0]@sm_80", "width"},
      {"repack_weight<>[threads=256,smem=0]@sm_80", "0 parameters"},
      {"repack_weight<bits=4>[threads=100,smem=0]@sm_80", "threads = 100"},
      {"repack_weight<bits=4>[threads=256,smem=300000]@sm_80", "smem = 300000"},
      {"repack_weight<bits=4>[blocks=2]@sm_80", "blocks"},
      {"dequantize_weight<weight=uint4,scale=bf16,zero=maybe,out=bf16>[threads=256,smem=0]@sm_80",
       "maybe"},
      {"dequantize_weight<weight=uint4,scale=bf16,zero=mid,out=fp32>[threads=256,smem=0]@sm_80",
       "fp32"},
      {"dequantize_weight<weight=uint44,scale=bf16,zero=mid,out=bf16>[threads=256,smem=0]@sm_80",
       "uint44"},
      {"dequantize_weight<scale=bf16,weight=uint4,zero=mid,out=bf16>[threads=256,smem=0]@sm_80",
       "expected 'weight'"},
      {"quantize_activation<code=int2,scaling=token,scale=fp32,in=bf16,emit=codes,operand=bf16>"
       "[threads=256,smem=0]@sm_80",
       "4 or 8 bits"},
  };
  for (const Case& c : cases) {
    const std::string message = error_message([&] { parse_kernel_spec(c.text); });
    EXPECT_NE(message.find(c.must_mention), std::string::npos)
        << "spec: " << c.text << "\nmessage: " << message;
  }
}

// The GPU weight quantizer takes every preset's weight quantization; what it cannot compute
// (no mantissa to round into, float zeros in e8m0) its spec rejects and its caller sends to the
// host quantizer, naming why.
TEST(JitSpec, QuantizeWeightTakesThePresetsAndNamesWhatItCannot) {
  for (const Preset& preset : presets()) {
    const WeightQuant& quant = preset.scheme.weight;
    EXPECT_FALSE(quant_detail::device_quantizer_gap(quant).has_value()) << preset.name;
    for (const char* step : {"stats", "cells", "codes"})
      EXPECT_NO_THROW(quantize_weight_spec(quant, formats::bf16, step, Arch::sm_90a))
          << preset.name;
  }
  // What the quantizer cannot take: its gap names it, and the spec of `step` refuses it.
  auto expect_refused = [](const WeightQuant& quant, const char* gap, const char* step,
                           const char* rule) {
    SCOPED_TRACE(rule);
    EXPECT_NE(quant_detail::device_quantizer_gap(quant).value_or("").find(gap),
              std::string::npos);
    EXPECT_NE(error_message([&] {
                quantize_weight_spec(quant, formats::bf16, step, Arch::sm_90a);
              }).find(rule),
              std::string::npos);
  };
  WeightQuant exponent_only;
  exponent_only.format = formats::e8m0;
  exponent_only.scale_format = formats::fp32;
  expect_refused(exponent_only, "no mantissa", "codes", "a float format with a mantissa");
  WeightQuant float_zero_e8m0;
  float_zero_e8m0.format = formats::uint4;
  float_zero_e8m0.scale_format = formats::e8m0;
  float_zero_e8m0.zero_point = ZeroPoint::Float;
  expect_refused(float_zero_e8m0, "e8m0", "cells",
                 "float zero points need a scale format with a mantissa");
  WeightQuant fp8;
  fp8.format = formats::e4m3;
  fp8.scale_format = formats::fp32;
  EXPECT_NE(error_message([&] {
              quantize_weight_spec(fp8, formats::int8, "stats", Arch::sm_90a);
            }).find("weight input"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              quantize_weight_spec(fp8, formats::bf16, "pack", Arch::sm_90a);
            }).find("stats|cells|codes"),
            std::string::npos);
}

TEST(JitSpec, FormatConstantRoundTripsEveryNamedFormat) {
  for (const Format& format : named_formats()) {
    const auto code = kernels::FormatCode::unpack(packed_format_code(format));
    EXPECT_EQ(code.kind, static_cast<int>(format.kind)) << format.name();
    EXPECT_EQ(code.is_signed, format.is_signed) << format.name();
    EXPECT_EQ(code.bits, format.bits) << format.name();
    EXPECT_EQ(code.exponent_bits, format.exponent_bits) << format.name();
    EXPECT_EQ(code.mantissa_bits, format.mantissa_bits) << format.name();
    EXPECT_EQ(code.specials, static_cast<int>(format.specials)) << format.name();
    EXPECT_EQ(code.bias, format.bias) << format.name();
    EXPECT_EQ(code.min_int, format.min_int) << format.name();
    EXPECT_EQ(code.max_int, format.max_int) << format.name();
  }
  // Ternary differs from int2 only in min_int: the constant must tell them apart.
  EXPECT_NE(packed_format_code(formats::ternary()), packed_format_code(formats::int_(2)));
}

TEST(JitSource, IsAShortInstantiationOfTheFamilyHeader) {
  const KernelSpec spec = quantize_activation_spec(parse_scheme("w8a8-fp8").activation,
                                                   formats::bf16, ActivationEmit::Codes,
                                                   formats::bf16, Arch::sm_90a);
  const GeneratedSource source = generate_source(spec);
  EXPECT_NE(source.code.find("#include \"util/quantize_activation.cuh\""), std::string::npos);
  EXPECT_NE(
      source.code.find("template __global__ void qgemm::kernels::quantize_activation_kernel<"),
      std::string::npos);
  EXPECT_NE(source.code.find(to_string(spec)), std::string::npos);  // the spec, for humans
  EXPECT_NE(source.code.find("/* code=e4m3 */"), std::string::npos);
  int lines = 0;
  for (char c : source.code) lines += c == '\n';
  EXPECT_LT(lines, 20) << source.code;
  EXPECT_EQ(source.name_expression.find("/*"), std::string::npos) << source.name_expression;
  EXPECT_EQ(source.name_expression.rfind("qgemm::kernels::quantize_activation_kernel<", 0), 0u);
}

TEST(JitCompilerOptions, PerArchAndPerFamily) {
  const auto options = compile_options(repack_weight_spec(4, Arch::sm_100a), CompileOptions{});
  EXPECT_EQ(options.front(), "--gpu-architecture=sm_100a");
  EXPECT_NE(std::find(options.begin(), options.end(), "-std=c++17"), options.end());
  EXPECT_NE(std::find(options.begin(), options.end(), "--ptxas-options=-v"), options.end());
  // The utility kernels need IEEE division (they must match the host quantizer).
  EXPECT_EQ(std::find(options.begin(), options.end(), "--use_fast_math"), options.end());
  CompileOptions with_line_info;
  with_line_info.line_info = true;
  const auto more = compile_options(repack_weight_spec(4, Arch::sm_100a), with_line_info);
  EXPECT_NE(std::find(more.begin(), more.end(), "-lineinfo"), more.end());
}

TEST(JitPtxasReport, ParsesTheEntryOfTheGivenSymbol) {
  // Two entries in one log: the parser must take the numbers of the one asked for.
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '_Z5firstv' for 'sm_90a'\n"
      "ptxas info    : Function properties for _Z5firstv\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function '_Z6secondv' for 'sm_90a'\n"
      "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
      "between start and end of the pipeline stage in the function '_Z6secondv'\n"
      "ptxas info    : Function properties for _Z6secondv\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 23 registers, used 0 barriers, 372 bytes cmem[0]\n";
  const ResourceUsage first = parse_ptxas_report(log, "_Z5firstv");
  EXPECT_EQ(first.registers, 168);
  EXPECT_EQ(first.stack_frame_bytes, 8);
  EXPECT_EQ(first.spill_store_bytes, 4);
  EXPECT_EQ(first.spill_load_bytes, 12);
  EXPECT_EQ(first.spill_bytes(), 16);
  EXPECT_EQ(first.static_smem_bytes, 4096);
  EXPECT_EQ(first.wgmma_serializations, 0);
  const ResourceUsage second = parse_ptxas_report(log, "_Z6secondv");
  EXPECT_EQ(second.registers, 23);
  EXPECT_EQ(second.spill_bytes(), 0);
  EXPECT_EQ(second.static_smem_bytes, 0);
  EXPECT_EQ(second.wgmma_serializations, 1);  // the note names it
  EXPECT_EQ(parse_ptxas_report(log, "_Z5absentv").registers, -1);
}

}  // namespace
}  // namespace qgemm::jit
