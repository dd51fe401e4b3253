// The GPU-free half of the cuBLASLt FP8 component (src/runtime/cublaslt.hpp): the shape filter
// the selector runs without a GPU, the scheme -> scale-mode mapping, the scale layouts and the
// host reorder of weight / activation scales into them, and the quantizer's arguments.
//
// Expected layouts are written out here from the header's table (index formulas, counts worked
// by hand), never read back from the code under test. Whether the table is what cuBLASLt reads
// is for the GPU test (tests/gpu/test_cublaslt_fp8.cpp) to decide.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "runtime/cublaslt.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm {
namespace {

using runtime::Fp8MatmulShape;
using runtime::Fp8ScaleMode;

struct SeededRandom {
  std::uint64_t seed = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  std::mt19937_64 engine{seed};
  std::string trace() const { return "seed " + std::to_string(seed); }
};

// Rows of very different magnitudes, so that every scale differs from its neighbours.
std::vector<float> random_matrix(std::mt19937_64& engine, std::int64_t rows, std::int64_t cols) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_sigma(-2.0f, 2.0f);
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float sigma = std::exp(log_sigma(engine));
    for (std::int64_t c = 0; c < cols; ++c) {
      float v = sigma * normal(engine);
      out[static_cast<std::size_t>(r * cols + c)] = v == 0.0f ? sigma : v;
    }
  }
  return out;
}

// The canonical fp32 scale of grid cell `index` (4 little-endian bytes).
float fp32_scale(const std::vector<std::uint8_t>& scales, std::int64_t index) {
  float value = 0.0f;
  std::memcpy(&value, scales.data() + index * 4, 4);
  return value;
}

template <class Action>
void expect_error(ErrorCode code, Action&& action, std::initializer_list<std::string> fragments) {
  try {
    action();
    ADD_FAILURE() << "no error was thrown";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
          << "message '" << error.what() << "' lacks '" << fragment << "'";
  }
}

// A shape cuBLASLt FP8 serves: any M, N and K multiples of 16 (K not of 128).
Fp8MatmulShape served_shape() {
  Fp8MatmulShape shape;
  shape.m = 7, shape.n = 640, shape.k = 2880;
  return shape;
}

void expect_reason(const Fp8MatmulShape& shape, const std::string& fragment) {
  const std::string why = runtime::fp8_matmul_unsupported_reason(shape);
  EXPECT_NE(why.find(fragment), std::string::npos)
      << "reason '" << why << "' lacks '" << fragment << "'";
  EXPECT_NE(why.find("rule"), std::string::npos) << why;
}

TEST(CublasLtFp8, ServedShapesHaveNoReason) {
  Fp8MatmulShape shape = served_shape();
  EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(shape), "");
  for (std::int64_t m : {1, 7, 16, 100, 256, 4096}) {
    shape.m = m;
    EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(shape), "") << "m = " << m;
  }
  shape.ldc = 648;  // 1296-byte rows of bf16
  shape.c_format = formats::fp16;
  shape.fast_accumulation = true;
  shape.a_format = formats::e5m2;
  shape.compute_capability = 89;
  EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(shape), "");

  // fp8-block on an H200: 1x128 × 128x128, K = 2816 (22 blocks), N = 720 (a partial block).
  Fp8MatmulShape block;
  block.m = 16, block.n = 720, block.k = 2816;
  block.a_scale = Fp8ScaleMode::Block1x128;
  block.w_scale = Fp8ScaleMode::Block128x128;
  block.compute_capability = 90;
  EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(block), "");
  block.w_scale = Fp8ScaleMode::Block1x128;
  block.c_format = formats::fp32;
  EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(block), "");
  // Below 16 tokens cuBLASLt has no block-scaled algorithm (H200, CUDA 13.0).
  block.m = 7;
  EXPECT_NE(runtime::fp8_matmul_unsupported_reason(block).find("m = 7"), std::string::npos);
  Fp8MatmulShape vector = served_shape();
  vector.a_scale = vector.w_scale = Fp8ScaleMode::OuterVector;
  vector.compute_capability = 90;
  EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(vector), "");
}

TEST(CublasLtFp8, EachRuleNamesTheArgumentAndItsValue) {
  auto with = [](auto change) {
    Fp8MatmulShape shape = served_shape();
    change(shape);
    return shape;
  };
  expect_reason(with([](auto& s) { s.m = 0; }), "m = 0");
  expect_reason(with([](auto& s) { s.k = std::int64_t{1} << 31; }), "k = 2147483648");
  expect_reason(with([](auto& s) { s.a_format = formats::int8; }), "activation codes int8");
  expect_reason(with([](auto& s) { s.w_format = formats::e3m4; }), "weight codes e3m4");
  expect_reason(with([](auto& s) { s.a_format = s.w_format = formats::e5m2; }), "e5m2 x e5m2");
  expect_reason(with([](auto& s) { s.c_format = formats::e4m3; }), "output e4m3");
  expect_reason(with([](auto& s) { s.k = 2888; }), "k = 2888");
  expect_reason(with([](auto& s) { s.n = 648; }), "n = 648");
  expect_reason(with([](auto& s) { s.ldc = 644; }), "ldc = 644");  // 1288-byte rows
  expect_reason(with([](auto& s) { s.ldc = 320; }), "ldc = 320");
  expect_reason(with([](auto& s) { s.alignment = 8; }), "alignment = 8");
  expect_reason(with([](auto& s) { s.alignment = 48; }), "alignment = 48");
  expect_reason(with([](auto& s) {
                  s.a_scale = Fp8ScaleMode::Block128x128;
                  s.w_scale = Fp8ScaleMode::Block128x128;
                }),
                "activation scales 128x128");
  expect_reason(with([](auto& s) { s.w_scale = Fp8ScaleMode::OuterVector; }),
                "scales tensor x outer-vector");
  expect_reason(with([](auto& s) { s.a_scale = Fp8ScaleMode::OuterVector; }),
                "scales outer-vector x tensor");
  expect_reason(with([](auto& s) {
                  s.a_scale = Fp8ScaleMode::OuterVector;
                  s.w_scale = Fp8ScaleMode::Block128x128;
                }),
                "scales outer-vector x 128x128");
  expect_reason(with([](auto& s) {
                  s.a_scale = Fp8ScaleMode::Block1x128;
                  s.w_scale = Fp8ScaleMode::OuterVector;
                }),
                "scales 1x128 x outer-vector");
  expect_reason(with([](auto& s) {
                  s.a_scale = Fp8ScaleMode::Block1x128;
                  s.w_scale = Fp8ScaleMode::Block128x128;
                  s.a_format = formats::e5m2;
                }),
                "e5m2 x e4m3 codes with block scales");
  expect_reason(with([](auto& s) {
                  s.a_scale = Fp8ScaleMode::Block1x128;
                  s.w_scale = Fp8ScaleMode::Block1x128;
                  s.fast_accumulation = true;
                }),
                "fast accumulation with block scales");
  expect_reason(with([](auto& s) { s.compute_capability = 86; }), "compute capability 8.6");
  expect_reason(with([](auto& s) {
                  s.a_scale = s.w_scale = Fp8ScaleMode::OuterVector;
                  s.compute_capability = 89;
                }),
                "outer-vector scales on compute capability 8.9");
  expect_reason(with([](auto& s) {
                  s.a_scale = Fp8ScaleMode::Block1x128;
                  s.w_scale = Fp8ScaleMode::Block128x128;
                  s.compute_capability = 100;
                }),
                "1x128 scales on compute capability 10.0");
}

struct ModesCase {
  const char* scheme;
  Fp8ScaleMode activation, weight;
};

TEST(CublasLtFp8, SchemesMapToServedScaleModes) {
  const ModesCase cases[] = {
      {"w8a8-fp8", Fp8ScaleMode::OuterVector, Fp8ScaleMode::OuterVector},
      {"fp8-block", Fp8ScaleMode::Block1x128, Fp8ScaleMode::Block128x128},
      {"w=e4m3:t:s=fp32;a=e4m3:t;o=bf16", Fp8ScaleMode::Tensor, Fp8ScaleMode::Tensor},
      {"w=e4m3:ch:s=fp32;a=e4m3:t;o=bf16", Fp8ScaleMode::OuterVector, Fp8ScaleMode::OuterVector},
      {"w=e5m2:t:s=fp32;a=e4m3:tok;o=fp16", Fp8ScaleMode::OuterVector, Fp8ScaleMode::OuterVector},
      {"w=e4m3:b128x128:s=fp32;a=e4m3:tok;o=bf16", Fp8ScaleMode::Block1x128,
       Fp8ScaleMode::Block128x128},
      {"w=e4m3:b128x128:s=bf16;a=e4m3:t;o=bf16", Fp8ScaleMode::Block1x128,
       Fp8ScaleMode::Block128x128},
      {"w=e4m3:g128:s=bf16;a=e4m3:g128;o=bf16", Fp8ScaleMode::Block1x128, Fp8ScaleMode::Block1x128},
      {"w=e4m3:ch:s=fp32;a=e4m3:g128;o=fp32", Fp8ScaleMode::Block1x128, Fp8ScaleMode::Block1x128},
      {"w=e4m3:g128:s=fp32;a=e4m3:tok;o=bf16", Fp8ScaleMode::Block1x128, Fp8ScaleMode::Block1x128},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.scheme);
    const Scheme scheme = parse_scheme(c.scheme);
    std::string why;
    const auto modes = runtime::fp8_scale_modes(scheme, &why);
    ASSERT_TRUE(modes.has_value()) << why;
    EXPECT_EQ(modes->activation, c.activation);
    EXPECT_EQ(modes->weight, c.weight);
    // Every mapped pair is one the filter lets through on an H200 (exact accumulation).
    Fp8MatmulShape shape;
    shape.m = 16, shape.n = 256, shape.k = 1024;
    shape.a_format = scheme.activation.format;
    shape.w_format = scheme.weight.format;
    shape.a_scale = modes->activation;
    shape.w_scale = modes->weight;
    shape.c_format = scheme.output;
    shape.compute_capability = 90;
    EXPECT_EQ(runtime::fp8_matmul_unsupported_reason(shape), "");
  }
}

TEST(CublasLtFp8, SchemesCuBlasLtCannotServeSayWhy) {
  const std::pair<const char*, const char*> cases[] = {
      {"w4a16", "weight codes uint4"},
      {"w4a8-fp8", "weight codes int4"},
      {"w=e4m3:ch:s=fp32;a=bf16;o=bf16", "activations bf16"},
      {"w8a8-int8", "weight codes int8"},
      {"w=e4m3:g64:s=fp32;a=e4m3:tok;o=bf16", "weight groups of 64"},
      {"w=e4m3:b64x128:s=fp32;a=e4m3:g128;o=bf16", "weight blocks of 64 x 128"},
      {"w=e4m3:ch:s=fp32;a=e4m3:g64;o=bf16", "activation groups of 64"},
      {"w=e4m3:ch:s=fp32;a=e4m3:mx;o=bf16", "MX / NV activation scales"},
  };
  for (const auto& [text, fragment] : cases) {
    SCOPED_TRACE(text);
    std::string why;
    EXPECT_FALSE(runtime::fp8_scale_modes(parse_scheme(text), &why).has_value());
    EXPECT_NE(why.find(fragment), std::string::npos) << why;
    EXPECT_NE(why.find("rule"), std::string::npos) << why;
  }
}

TEST(CublasLtFp8, ScaleLayoutsFollowTheTable) {
  // rows 720 (6 row-blocks, the last partial), K 2816 (22 blocks; padded to 24).
  const auto block = runtime::fp8_scale_layout(Fp8ScaleMode::Block128x128, 720, 2816);
  EXPECT_EQ(block.rows_per_scale, 128);
  EXPECT_EQ(block.cols_per_scale, 128);
  EXPECT_EQ(block.blocks, 22);
  EXPECT_EQ(block.row_stride, 24);
  EXPECT_EQ(block.block_stride, 1);
  EXPECT_EQ(block.count, 6 * 24);
  // K 2880: 22.5 blocks -> 23, padded to 24.
  EXPECT_EQ(runtime::fp8_scale_layout(Fp8ScaleMode::Block128x128, 128, 2880).count, 24);
  EXPECT_EQ(runtime::fp8_scale_layout(Fp8ScaleMode::Block128x128, 4096, 7168).row_stride, 56);

  // 7 tokens, K 2880: 23 blocks of 7 token-contiguous scales.
  const auto vec128 = runtime::fp8_scale_layout(Fp8ScaleMode::Block1x128, 7, 2880);
  EXPECT_EQ(vec128.rows_per_scale, 1);
  EXPECT_EQ(vec128.blocks, 23);
  EXPECT_EQ(vec128.row_stride, 1);
  EXPECT_EQ(vec128.block_stride, 7);
  EXPECT_EQ(vec128.count, 23 * 7);

  const auto outer = runtime::fp8_scale_layout(Fp8ScaleMode::OuterVector, 100, 640);
  EXPECT_EQ(outer.row_stride, 1);
  EXPECT_EQ(outer.blocks, 1);
  EXPECT_EQ(outer.cols_per_scale, 640);
  EXPECT_EQ(outer.count, 100);
  const auto tensor = runtime::fp8_scale_layout(Fp8ScaleMode::Tensor, 100, 640);
  EXPECT_EQ(tensor.row_stride, 0);
  EXPECT_EQ(tensor.count, 1);
}

TEST(CublasLtFp8, WeightScalesMoveIntoCublasLtLayouts) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 720, k = 2816;  // 6 x 22 blocks of 128 (the last row-block partial)
  const auto values = random_matrix(random.engine, n, k);

  const PackedWeight block = quantize_weight(parse_scheme("fp8-block").weight, values.data(), n, k);
  const auto blk = runtime::fp8_weight_scales(block, Fp8ScaleMode::Block128x128);
  ASSERT_EQ(blk.size(), 6u * 24u);
  for (std::int64_t nb = 0; nb < 6; ++nb)
    for (std::int64_t kb = 0; kb < 24; ++kb) {
      const float want = kb < 22 ? fp32_scale(block.scales, nb * 22 + kb) : 0.0f;
      EXPECT_EQ(blk[static_cast<std::size_t>(nb * 24 + kb)], want) << nb << ", " << kb;
    }
  // The same blocks as 1x128 scales: each row takes its row-block's scale, token-contiguous.
  const auto blk_as_vec = runtime::fp8_weight_scales(block, Fp8ScaleMode::Block1x128);
  ASSERT_EQ(blk_as_vec.size(), 22u * 720u);
  for (std::int64_t r = 0; r < n; r += 37)
    for (std::int64_t kb = 0; kb < 22; ++kb)
      EXPECT_EQ(blk_as_vec[static_cast<std::size_t>(kb * n + r)],
                fp32_scale(block.scales, r / 128 * 22 + kb));

  const PackedWeight channel =
      quantize_weight(parse_scheme("w8a8-fp8").weight, values.data(), n, k);
  const auto outer = runtime::fp8_weight_scales(channel, Fp8ScaleMode::OuterVector);
  ASSERT_EQ(outer.size(), static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r)
    EXPECT_EQ(outer[static_cast<std::size_t>(r)], fp32_scale(channel.scales, r));
  const auto channel_blocks = runtime::fp8_weight_scales(channel, Fp8ScaleMode::Block1x128);
  ASSERT_EQ(channel_blocks.size(), 22u * 720u);
  for (std::int64_t kb = 0; kb < 22; ++kb)
    for (std::int64_t r = 0; r < n; ++r)
      EXPECT_EQ(channel_blocks[static_cast<std::size_t>(kb * n + r)],
                fp32_scale(channel.scales, r));

  // g128 with bf16 scales: canonical [n][22] row-major -> [22][n], bf16 values exact in fp32.
  const PackedWeight group = quantize_weight(
      parse_scheme("w=e4m3:g128:s=bf16;a=e4m3:g128;o=bf16").weight, values.data(), n, k);
  const auto group_blocks = runtime::fp8_weight_scales(group, Fp8ScaleMode::Block1x128);
  for (std::int64_t kb = 0; kb < 22; ++kb)
    for (std::int64_t r = 0; r < n; ++r) {
      const std::size_t at = static_cast<std::size_t>(r * 22 + kb) * 2;
      const std::uint32_t code = group.scales[at] | std::uint32_t{group.scales[at + 1]} << 8;
      EXPECT_EQ(group_blocks[static_cast<std::size_t>(kb * n + r)],
                static_cast<float>(decode(formats::bf16, code)));
    }

  const PackedWeight tensor = quantize_weight(
      parse_scheme("w=e4m3:t:s=fp32;a=e4m3:tok;o=bf16").weight, values.data(), n, k);
  const auto repeated = runtime::fp8_weight_scales(tensor, Fp8ScaleMode::OuterVector);
  ASSERT_EQ(repeated.size(), static_cast<std::size_t>(n));
  for (float s : repeated) EXPECT_EQ(s, fp32_scale(tensor.scales, 0));
  EXPECT_EQ(runtime::fp8_weight_scales(tensor, Fp8ScaleMode::Tensor),
            std::vector<float>{fp32_scale(tensor.scales, 0)});

  // Coarser than the grid: refused, naming it.
  expect_error(ErrorCode::InvalidArgument,
               [&] { runtime::fp8_weight_scales(channel, Fp8ScaleMode::Block128x128); },
               {"1 x 2816 scale cells", "128x128", "rule"});
  expect_error(ErrorCode::InvalidArgument,
               [&] { runtime::fp8_weight_scales(block, Fp8ScaleMode::Tensor); },
               {"128 x 128 scale cells", "tensor"});
  const PackedWeight zero_point = quantize_weight(
      parse_scheme("w=uint8:ch:s=fp32:zp=int;a=bf16;o=bf16").weight, values.data(), n, k);
  expect_error(ErrorCode::InvalidArgument,
               [&] { runtime::fp8_weight_scales(zero_point, Fp8ScaleMode::OuterVector); },
               {"zero points"});
}

TEST(CublasLtFp8, ActivationScalesMoveIntoCublasLtLayouts) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t m = 7, k = 640;  // 5 blocks of 128
  const auto values = random_matrix(random.engine, m, k);
  auto quantize = [&](const char* text) {
    return quantize_activation(
        parse_scheme(std::string("w=e4m3:ch:s=fp32;") + text + ";o=bf16").activation, values.data(),
        m, k);
  };
  const PackedActivation group = quantize("a=e4m3:g128");
  const auto vec = runtime::fp8_activation_scales(group, Fp8ScaleMode::Block1x128);
  ASSERT_EQ(vec.size(), 5u * 7u);
  for (std::int64_t b = 0; b < 5; ++b)
    for (std::int64_t r = 0; r < m; ++r)
      EXPECT_EQ(vec[static_cast<std::size_t>(b * m + r)], fp32_scale(group.scales, r * 5 + b));

  const PackedActivation token = quantize("a=e4m3:tok");
  EXPECT_EQ(runtime::fp8_activation_scales(token, Fp8ScaleMode::OuterVector),
            (std::vector<float>{fp32_scale(token.scales, 0), fp32_scale(token.scales, 1),
                                fp32_scale(token.scales, 2), fp32_scale(token.scales, 3),
                                fp32_scale(token.scales, 4), fp32_scale(token.scales, 5),
                                fp32_scale(token.scales, 6)}));
  const auto token_blocks = runtime::fp8_activation_scales(token, Fp8ScaleMode::Block1x128);
  for (std::int64_t b = 0; b < 5; ++b)
    for (std::int64_t r = 0; r < m; ++r)
      EXPECT_EQ(token_blocks[static_cast<std::size_t>(b * m + r)], fp32_scale(token.scales, r));

  const PackedActivation fixed = quantize_activation(
      parse_scheme("w=e4m3:t:s=fp32;a=e4m3:t;o=bf16").activation, values.data(), m, k, 0.0371);
  EXPECT_EQ(runtime::fp8_activation_scales(fixed, Fp8ScaleMode::Tensor),
            std::vector<float>{0.0371f});
  EXPECT_EQ(runtime::fp8_activation_scales(fixed, Fp8ScaleMode::OuterVector),
            std::vector<float>(7, 0.0371f));

  expect_error(ErrorCode::InvalidArgument,
               [&] { runtime::fp8_activation_scales(token, Fp8ScaleMode::Tensor); },
               {"1 x 640 scale cells", "tensor"});
  expect_error(ErrorCode::InvalidArgument,
               [&] { runtime::fp8_activation_scales(group, Fp8ScaleMode::Block128x128); },
               {"128x128"});
}

// The quantizer's grid: a row per block in x (capped at 65535, grid-stride beyond); rows of
// short cells shared by y blocks while the whole stays near 1024 blocks and each of a block's 8
// warps keeps a pass of cells (at one value a lane: one cell of 128 a warp, 2 of 16; at 8
// values a lane: 8 of 128, 32 of 16); row-wide scalings (one cell a row) one block a row.
TEST(CublasLtFp8, QuantizerGridSpreadsShortCellsOfFewRows) {
  auto quant = [](const char* text) {
    return parse_scheme(std::string("w=e4m3:ch:s=fp32;") + text + ";o=bf16").activation;
  };
  auto grid = [&](const char* text, std::int64_t m, std::int64_t k, int vector8 = 0) {
    auto args = runtime::quantize_activation_args(quant(text), m, k, 0, k, 0.0);
    args.vector8 = vector8;
    const runtime::LaunchGrid g = runtime::quantize_activation_grid(args, 256);
    EXPECT_EQ(g.z, 1u);
    return std::pair<unsigned, unsigned>{g.x, g.y};
  };
  using Grid = std::pair<unsigned, unsigned>;
  EXPECT_EQ(grid("a=e4m3:g128", 1, 18432), Grid(1, 18));     // 144 cells, 8 a block
  EXPECT_EQ(grid("a=e4m3:g128", 256, 18432), Grid(256, 4));  // 1024 / 256
  EXPECT_EQ(grid("a=e4m3:g128", 4096, 18432), Grid(4096, 1));
  EXPECT_EQ(grid("a=e4m3:g128", 100000, 256), Grid(65535, 1));
  EXPECT_EQ(grid("a=e4m3:g128", 1, 1000), Grid(1, 1));       // 8 cells: one block
  EXPECT_EQ(grid("a=e2m1:nv:s=ue4m3", 3, 4096), Grid(3, 16));  // 256 cells of 16, 2 a warp
  EXPECT_EQ(grid("a=e4m3:tok", 1, 18432), Grid(1, 1));       // row-wide: one block a row
  EXPECT_EQ(grid("a=int8:t", 2, 18432), Grid(2, 1));
  // 8 values a lane: 64 cells of 128 a block, 256 of 16.
  EXPECT_EQ(grid("a=e4m3:g128", 1, 18432, 1), Grid(1, 3));
  EXPECT_EQ(grid("a=e4m3:g128", 256, 18432, 1), Grid(256, 3));
  EXPECT_EQ(grid("a=e4m3:g128", 8, 18432, 1), Grid(8, 3));
  EXPECT_EQ(grid("a=e2m1:nv:s=ue4m3", 3, 4096, 1), Grid(3, 1));
  EXPECT_EQ(grid("a=e2m1:nv:s=ue4m3", 1, 16384, 1), Grid(1, 4));
}

// How the quantizer's lanes share a short cell: a power of two of them dividing its runs, a
// warp's 32 lanes split evenly; 8 values a lane hold at most kShortCellHeldRuns runs (NV's 16
// values: 2, which the kernel's registers are sized for) where the runs are a power of two up
// to 32 · 4; one value a lane pairs neighbouring lanes (4-bit codes) wherever G is even.
TEST(CublasLtFp8, ShortCellWalkSplitsEveryGroupSize) {
  for (int width : {1, 8}) {
    for (long long group = width; group <= 2048; group += width) {
      const kernels::ShortCellWalk walk = kernels::short_cell_walk(group, width);
      const long long runs = group / width;
      SCOPED_TRACE(fmt::format("group {} width {}", group, width));
      ASSERT_GE(walk.lanes, 1);
      ASSERT_LE(walk.lanes, 32);
      EXPECT_EQ(walk.lanes & (walk.lanes - 1), 0);
      EXPECT_EQ(runs % walk.lanes, 0);
      EXPECT_EQ(walk.per_lane * walk.lanes, runs);
      EXPECT_EQ(walk.cells_per_warp * walk.lanes, 32);
      const bool power_of_two = (runs & (runs - 1)) == 0;
      if (width == 8 && power_of_two && runs <= 32 * kernels::kShortCellHeldRuns)
        EXPECT_LE(walk.per_lane, kernels::kShortCellHeldRuns);
      if (width == 1 && group % 2 == 0) EXPECT_GE(walk.lanes, 2);
    }
  }
  EXPECT_EQ(kernels::short_cell_walk(16, 8).per_lane, 2);  // NV
  EXPECT_EQ(kernels::short_cell_walk(128, 8).lanes, 4);
  EXPECT_EQ(kernels::short_cell_walk(32, 8).lanes, 1);  // MX: a lane a cell, 4 runs
}

TEST(CublasLtFp8, QuantizerArgumentsWriteCublasLtScaleLayouts) {
  const std::int64_t m = 7, k = 640, lda = 648;
  auto quant = [](const char* text) {
    return parse_scheme(std::string("w=e4m3:ch:s=fp32;") + text + ";o=bf16").activation;
  };
  // Canonical grid first: the row-major [m][k / 128] of the host quantizer.
  auto canonical = runtime::quantize_activation_args(quant("a=e4m3:g128"), m, k, 0, lda, 0.0);
  EXPECT_EQ(canonical.scale_row_stride, 5);
  EXPECT_EQ(canonical.scale_cell_stride, 1);
  EXPECT_EQ(canonical.scale_copies, 1);
  EXPECT_EQ(
      runtime::quantize_activation_args(quant("a=e4m3:tok"), m, k, 0, lda, 0.0).scale_row_stride,
      1);
  EXPECT_EQ(
      runtime::quantize_activation_args(quant("a=e4m3:t"), m, k, 0, lda, 0.0).scale_row_stride, 0);

  struct Case {
    const char* quant;
    Fp8ScaleMode mode;
    long long row_stride, cell_stride, copies;
  };
  const Case cases[] = {
      {"a=e4m3:g128", Fp8ScaleMode::Block1x128, 1, 7, 1},  // scale (r, b) at b · 7 + r
      {"a=e4m3:tok", Fp8ScaleMode::Block1x128, 1, 7, 5},   // the row's scale in all 5 blocks
      {"a=e4m3:tok", Fp8ScaleMode::OuterVector, 1, 0, 1},  // [m]
      {"a=e5m2:t", Fp8ScaleMode::OuterVector, 1, 0, 1},    // the one scale, once per row
      {"a=e4m3:t", Fp8ScaleMode::Tensor, 0, 0, 1},         // row 0 writes [0]
      {"a=e4m3:t", Fp8ScaleMode::Block1x128, 1, 7, 5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.quant) + " -> " + runtime::fp8_scale_mode_name(c.mode));
    const auto args =
        runtime::fp8_quantize_activation_args(quant(c.quant), c.mode, m, k, 0, lda, 0.0);
    EXPECT_EQ(args.scale_row_stride, c.row_stride);
    EXPECT_EQ(args.scale_cell_stride, c.cell_stride);
    EXPECT_EQ(args.scale_copies, c.copies);
    EXPECT_EQ(args.lda, lda);
    EXPECT_EQ(args.k, k);
  }
  expect_error(ErrorCode::InvalidArgument,
               [&] {
                 runtime::fp8_quantize_activation_args(quant("a=e4m3:tok"), Fp8ScaleMode::Tensor, m,
                                                       k, 0, lda, 0.0);
               },
               {"tensor scales from per-token scaling", "rule"});
  expect_error(ErrorCode::InvalidArgument,
               [&] {
                 runtime::fp8_quantize_activation_args(quant("a=e4m3:g64"),
                                                       Fp8ScaleMode::Block1x128, m, k, 0, lda, 0.0);
               },
               {"1x128 scales from per-group scaling in groups of 64"});
  expect_error(ErrorCode::InvalidArgument,
               [&] {
                 runtime::fp8_quantize_activation_args(
                     quant("a=int8:tok"), Fp8ScaleMode::OuterVector, m, k, 0, lda, 0.0);
               },
               {"codes int8", "rule"});
}

}  // namespace
}  // namespace qgemm
