// Schemes: presets, the compact text form, validation messages and scale grids.
#include <gtest/gtest.h>

#include <string>

#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm {
namespace {

// Expects parse_scheme(text) to throw an Error whose message contains every one of `fragments`.
void expect_rejected(const std::string& text, std::initializer_list<std::string> fragments) {
  try {
    parse_scheme(text);
    ADD_FAILURE() << "scheme '" << text << "' was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
          << "message '" << error.what() << "' lacks '" << fragment << "'";
  }
}

TEST(Scheme, EveryIssueNamedPresetExists) {
  for (const char* name :
       {"w4a16", "w4a16-zp", "w2a16", "w3a16", "w8a16", "gptq-w4a16-g128", "awq-w4a16-g128",
        "w4a8-fp8", "w8a8-fp8", "fp8-block", "w8a8-int8", "mxfp4-a16", "mxfp4-a8", "mxfp8-mxfp4",
        "nvfp4-a16", "nvfp4", "bitnet"}) {
    SCOPED_TRACE(name);
    Scheme scheme = parse_scheme(name);
    EXPECT_EQ(scheme.name, name);
  }
}

TEST(Scheme, PresetsMeanWhatTheirNamesSay) {
  Scheme w4 = parse_scheme("w4a16");
  EXPECT_EQ(w4.weight.format, formats::uint4);
  EXPECT_EQ(w4.weight.granularity, WeightGranularity::Group);
  EXPECT_EQ(w4.weight.group, 128);
  EXPECT_EQ(w4.weight.scale_format, formats::bf16);
  EXPECT_EQ(w4.weight.zero_point, ZeroPoint::Midpoint);
  EXPECT_FALSE(w4.activation.is_quantized());

  Scheme block = parse_scheme("fp8-block");
  EXPECT_EQ(block.weight.format, formats::e4m3);
  EXPECT_EQ(block.weight.granularity, WeightGranularity::Block);
  EXPECT_EQ(block.weight.block_n, 128);
  EXPECT_EQ(block.weight.block_k, 128);
  EXPECT_EQ(block.activation.scaling, ActivationScaling::DynamicGroup);
  EXPECT_EQ(block.activation.group, 128);

  Scheme nv = parse_scheme("nvfp4");
  EXPECT_EQ(nv.weight.format, formats::e2m1);
  EXPECT_EQ(nv.weight.group, 16);
  EXPECT_EQ(nv.weight.scale_format, formats::ue4m3);
  EXPECT_TRUE(nv.weight.global_scale);
  EXPECT_EQ(nv.activation.scaling, ActivationScaling::NV);
  EXPECT_EQ(nv.activation.scale_format, formats::ue4m3);

  Scheme mx = parse_scheme("mxfp8-mxfp4");
  EXPECT_EQ(mx.weight.scale_format, formats::e8m0);
  EXPECT_EQ(mx.activation.format, formats::e4m3);
  EXPECT_EQ(mx.activation.scaling, ActivationScaling::MX);
  EXPECT_EQ(mx.activation.scale_format, formats::e8m0);
  EXPECT_EQ(mx.activation.group, 32);

  Scheme bitnet = parse_scheme("bitnet");
  EXPECT_EQ(bitnet.weight.format, formats::ternary());
  EXPECT_EQ(bitnet.activation.format, formats::int8);
}

TEST(Scheme, TextFormRoundTripsForEveryPreset) {
  for (const auto& preset : presets()) {
    SCOPED_TRACE(preset.name);
    std::string text = to_string(preset.scheme);
    Scheme again = parse_scheme(text);
    EXPECT_EQ(again, preset.scheme);
    EXPECT_TRUE(again.name.empty());
    EXPECT_EQ(to_string(again), text);
  }
}

// Found by fuzzing (tests/fuzz/fuzz_scheme.cpp, issue #19): "a=e2m1:nv:t" kept nv's group of
// 16 under static per-tensor scaling, so it printed as "a=e2m1:t:s=fp32" yet compared unequal
// to what that text parses to (parse_scheme(to_string(s)) == s broke).
TEST(Scheme, ALaterScalingReplacesAnEarlierOnesGroup) {
  for (const char* text : {"w=e4m3;a=e2m1:nv:t", "w=e4m3;a=e2m1:mx:tok", "w=e4m3;a=e4m3:g64:t",
                           "w=e4m3;a=int8:g32:tok", "w=e4m3;a=e2m1:g64:nv", "w=e4m3;a=e4m3:nv:mx"}) {
    SCOPED_TRACE(text);
    const Scheme scheme = parse_scheme(text);
    const Scheme again = parse_scheme(to_string(scheme));
    EXPECT_TRUE(again == scheme) << to_string(scheme);
    EXPECT_EQ(to_string(again), to_string(scheme));
  }
  EXPECT_TRUE(parse_scheme("w=e4m3;a=e2m1:nv:t") == parse_scheme("w=e4m3;a=e2m1:t"));
  EXPECT_EQ(parse_scheme("w=e4m3;a=e4m3:g64:tok").activation.group, 0);
}

TEST(Scheme, TextFormReadsEveryField) {
  Scheme s = parse_scheme(" w=uint3:b64x32:s=fp16:zp=float ; a=int8:g64 ; o=fp32 ");
  EXPECT_EQ(s.weight.format, formats::uint_(3));
  EXPECT_EQ(s.weight.granularity, WeightGranularity::Block);
  EXPECT_EQ(s.weight.block_n, 64);
  EXPECT_EQ(s.weight.block_k, 32);
  EXPECT_EQ(s.weight.scale_format, formats::fp16);
  EXPECT_EQ(s.weight.zero_point, ZeroPoint::Float);
  EXPECT_EQ(s.activation.format, formats::int8);
  EXPECT_EQ(s.activation.scaling, ActivationScaling::DynamicGroup);
  EXPECT_EQ(s.activation.group, 64);
  EXPECT_EQ(s.output, formats::fp32);

  Scheme defaults = parse_scheme("w=int4;a=e4m3");
  EXPECT_EQ(defaults.weight.group, 128);
  EXPECT_EQ(defaults.weight.scale_format, formats::bf16);
  EXPECT_EQ(defaults.activation.scaling, ActivationScaling::DynamicToken);
  EXPECT_EQ(defaults.activation.scale_format, formats::fp32);
  EXPECT_EQ(defaults.output, formats::bf16);

  Scheme generic = parse_scheme("w=fp6_e3m2:ch:s=fp32;a=fp16;o=fp16");
  EXPECT_EQ(generic.weight.format, formats::e3m2);
}

TEST(Scheme, ValidationNamesFieldValueAndRule) {
  expect_rejected("w5a16", {"w5a16", "preset"});
  expect_rejected("w=fp16;a=bf16", {"weight format fp16", "at most 8"});
  expect_rejected("w=int4:zp=int;a=bf16", {"zero point 'int'", "unsigned integer", "int4"});
  expect_rejected("w=e2m1:g32:s=e8m0:zp=float;a=bf16", {"float zero point", "e2m1"});
  expect_rejected("w=uint4:s=int8;a=bf16", {"scale format int8"});
  expect_rejected("w=uint4;a=e4m3:nv", {"NV activation", "e2m1"});
  expect_rejected("w=uint4;a=int8:mx:s=fp32", {"MX activation", "e8m0"});
  expect_rejected("w=uint4;a=uint8", {"activation format uint8"});
  expect_rejected("w=uint4;a=fp32", {"unquantized activation format fp32"});
  expect_rejected("w=uint4;a=bf16;o=e4m3", {"output format e4m3"});
  expect_rejected("w=uint4:g0;a=bf16", {"weight group", "'0'", "positive"});
  expect_rejected("w=uint4:gx;a=bf16", {"weight option 'gx'"});
  expect_rejected("w=uint4:zp=both;a=bf16", {"zero point 'both'"});
  expect_rejected("a=bf16", {"weight part"});
  expect_rejected("w=uint4;x=1", {"part 'x=1'"});
  expect_rejected("w=nope4;a=bf16", {"format 'nope4'"});
}

TEST(Scheme, ShapeRules) {
  Scheme w4 = parse_scheme("w4a16");
  EXPECT_NO_THROW(validate_shape(w4, 1, 640, 1024));
  // Groups that do not divide K are served with a shorter last group (issue #14, item 5), for
  // weights and every activation grouping alike.
  EXPECT_NO_THROW(validate_shape(w4, 7, 640, 2880));
  EXPECT_NO_THROW(validate_shape(w4, 1, 640, 1000));
  EXPECT_NO_THROW(validate_shape(w4, 1, 640, 1));  // one group shorter than G
  EXPECT_NO_THROW(validate_shape(parse_scheme("fp8-block"), 3, 5472, 2880));  // 1x128 groups
  EXPECT_NO_THROW(validate_shape(parse_scheme("nvfp4"), 3, 64, 24));          // 1x16, weight g16
  EXPECT_NO_THROW(validate_shape(parse_scheme("mxfp8-mxfp4"), 3, 64, 2896));  // 1x32
  EXPECT_NO_THROW(validate_shape(parse_scheme("w=e4m3:ch:s=fp32;a=int8:g48;o=bf16"), 2, 8, 50));
  // What remains an error: sizes below 1, named with the shape.
  try {
    validate_shape(w4, 0, 640, 1024);
    ADD_FAILURE() << "M = 0 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("M=0"), std::string::npos) << error.what();
  }
  EXPECT_THROW(validate_shape(w4, 4, 0, 1024), Error);
  EXPECT_THROW(validate_shape(w4, 4, 64, 0), Error);
  EXPECT_THROW(validate_shape(w4, 4, 64, -128), Error);
}

// A scheme that contradicts itself is still refused, whatever K is: partial groups did not
// loosen validate().
TEST(Scheme, SelfContradictorySchemesStillFail) {
  expect_rejected("w=e2m1:g32:s=e8m0;a=e4m3:mx:s=fp32", {"MX activation scaling", "e8m0"});
  expect_rejected("w=e4m3:g128:s=bf16:zp=int;a=bf16", {"zero point 'int'", "e4m3"});
  expect_rejected("w=uint4:g0;a=bf16", {"weight group '0'"});
  expect_rejected("w=uint4:g128;a=e2m1:nv:s=e8m0", {"NV activation scaling"});
  Scheme bad_group = parse_scheme("w4a16");
  bad_group.weight.group = 0;
  EXPECT_THROW(validate(bad_group), Error);
  Scheme bad_mx = parse_scheme("mxfp8-mxfp4");
  bad_mx.activation.group = 48;  // MX is 1x32 by definition
  EXPECT_THROW(validate(bad_mx), Error);
}

TEST(Scheme, ScaleGrids) {
  WeightQuant block = parse_scheme("fp8-block").weight;
  ScaleGrid grid = weight_scale_grid(block, 300, 260);
  EXPECT_EQ(grid.rows, 3);  // ceil(300 / 128)
  EXPECT_EQ(grid.cols, 3);  // ceil(260 / 128)
  EXPECT_EQ(grid.rows_per, 128);

  ScaleGrid group = weight_scale_grid(parse_scheme("w4a16").weight, 10, 512);
  EXPECT_EQ(group.rows, 10);
  EXPECT_EQ(group.cols, 4);
  EXPECT_EQ(group.cols_per, 128);
  // Partial last groups: ceil(K / G) columns (2880 = 22.5 x 128; 2896 = 90.5 x 32).
  EXPECT_EQ(weight_scale_grid(parse_scheme("w4a16").weight, 10, 2880).cols, 23);
  EXPECT_EQ(weight_scale_grid(parse_scheme("w4a16").weight, 10, 2880).cols_per, 128);
  EXPECT_EQ(weight_scale_grid(parse_scheme("mxfp4-a16").weight, 3, 2896).cols, 91);
  EXPECT_EQ(weight_scale_grid(parse_scheme("nvfp4").weight, 3, 2904).cols, 182);  // 181.5
  EXPECT_EQ(weight_scale_grid(parse_scheme("w4a16").weight, 10, 1).cols, 1);
  EXPECT_EQ(weight_scale_grid(parse_scheme("w4a16").weight, 10, 129).count(), 20);

  ScaleGrid channel = weight_scale_grid(parse_scheme("w8a8-int8").weight, 7, 33);
  EXPECT_EQ(channel.count(), 7);
  EXPECT_EQ(weight_scale_grid(parse_scheme("bitnet").weight, 7, 33).count(), 1);

  ScaleGrid nv = activation_scale_grid(parse_scheme("nvfp4").activation, 5, 64);
  EXPECT_EQ(nv.rows, 5);
  EXPECT_EQ(nv.cols, 4);
  EXPECT_EQ(activation_scale_grid(parse_scheme("nvfp4").activation, 5, 2904).cols, 182);
  EXPECT_EQ(activation_scale_grid(parse_scheme("fp8-block").activation, 5, 2880).cols, 23);
  EXPECT_EQ(activation_scale_grid(parse_scheme("mxfp8-mxfp4").activation, 5, 2896).count(), 5 * 91);
  EXPECT_EQ(activation_scale_grid(parse_scheme("w8a8-fp8").activation, 5, 64).count(), 5);
  EXPECT_EQ(activation_scale_grid(parse_scheme("w4a16").activation, 5, 64).count(), 0);
}

}  // namespace
}  // namespace qgemm
