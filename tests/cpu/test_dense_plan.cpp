// How the dense GEMM is planned (src/dispatch/dense_config.cpp): which kernel serves which M,
// that split-K and chunking cover the problem exactly, and the fallback when no tile config can.
#include <gtest/gtest.h>

#include <random>

#include "dispatch/dense_config.hpp"
#include "jit/cache.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm {
namespace {

const dispatch::GpuLimits kH200 = dispatch::GpuLimits::of_arch(jit::Arch::sm_90a, 132);

// The prepared weight's metadata for `scheme` at N x K, quantized on a small random tile (the
// metadata of a large weight differs only in its sizes, which are set directly).
layout::MmaWeight metadata(const char* scheme_text, std::int64_t n, std::int64_t k) {
  const Scheme scheme = parse_scheme(scheme_text);
  const std::int64_t tile_k =
      scheme.weight.granularity == WeightGranularity::Group ? 2 * scheme.weight.group : 256;
  std::vector<float> w(static_cast<std::size_t>(64 * tile_k));
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  layout::MmaWeight meta =
      layout::mma_metadata(quantize_weight(scheme.weight, w.data(), 64, tile_k));
  meta.n = n;
  meta.k = k;
  meta.n_padded = (n + 63) / 64 * 64;
  meta.k_blocks = (k + 15) / 16;
  meta.groups =
      meta.group_size == 0 ? 1 : static_cast<int>((k + meta.group_size - 1) / meta.group_size);
  return meta;
}

// Quantized activations take their 8-bit codes as the mma operand (int8 everywhere from SM80,
// e4m3 where mma.sync is native on it) for 16 < M <= 256 when they are one scale per row, else
// the 16-bit operand; a forced config decides by its operand width.
TEST(DensePlan, EightBitOperandWhereItServesAndWins) {
  auto quant_of = [](const char* text) { return parse_scheme(text).activation; };
  const layout::MmaWeight int8_weight = metadata("w8a8-int8", 8192, 8192);
  const ActivationQuant int8_token = quant_of("w8a8-int8");
  for (std::int64_t m : {1, 16, 17, 64, 128, 129, 256, 257, 4096}) {
    const Format type = dispatch::dense_operand(m, int8_weight, int8_token, formats::bf16, kH200);
    EXPECT_EQ(type, m > 16 && m <= 256 ? formats::int8 : formats::bf16) << "M = " << m;
    const dispatch::DensePlan plan = dispatch::plan_dense_gemm(m, int8_weight, type, kH200);
    if (type == formats::int8)
      EXPECT_EQ(plan.config.name, m <= 128 ? "medium-a8" : "prefill-a8") << "M = " << m;
  }
  const layout::MmaWeight int4_weight = metadata("w4a8-fp8", 8192, 8192);
  const ActivationQuant e4m3_token = quant_of("w4a8-fp8");
  const auto ada = dispatch::GpuLimits::of_arch(jit::Arch::sm_89, 128);
  EXPECT_EQ(dispatch::dense_operand(64, int4_weight, e4m3_token, formats::bf16, kH200),
            formats::bf16);  // SM90: no native e4m3 mma.sync
  EXPECT_EQ(dispatch::dense_operand(64, int4_weight, e4m3_token, formats::bf16, ada),
            formats::e4m3);
  // Float weights go through fp16 to e4m3 only where e4m3 holds their every value.
  const layout::MmaWeight mxfp4 = metadata("mxfp4-a8", 8192, 8192);
  EXPECT_EQ(dispatch::dense_operand(64, mxfp4, quant_of("mxfp4-a8"), formats::bf16, ada),
            formats::e4m3);
  const layout::MmaWeight e5m2 = metadata("w=e5m2:g64:s=bf16;a=e4m3:t", 8192, 8192);
  EXPECT_EQ(dispatch::dense_operand(64, e5m2, e4m3_token, formats::bf16, ada), formats::bf16);
  // Activation scales along K (fp8-block's 1x128 groups) cannot be a row factor.
  const layout::MmaWeight block_weight = metadata("fp8-block", 8192, 8192);
  EXPECT_EQ(dispatch::dense_operand(64, block_weight, quant_of("fp8-block"), formats::bf16, ada),
            formats::bf16);
  EXPECT_EQ(dispatch::dense_operand(64, block_weight, quant_of("fp8-block"), formats::bf16, ada,
                                    "prefill-a8"),
            formats::bf16);
  // Forced: by the config's width (a plan then refuses what cannot serve, by name).
  EXPECT_EQ(
      dispatch::dense_operand(4096, int8_weight, int8_token, formats::bf16, kH200, "prefill-a8"),
      formats::int8);
  EXPECT_EQ(dispatch::dense_operand(64, int8_weight, int8_token, formats::bf16, kH200, "medium"),
            formats::bf16);
  EXPECT_THROW(dispatch::plan_dense_gemm(64, int4_weight, formats::bf16, kH200, "medium-a8"),
               Error);
  // Float zero points are not integers to take off in s32: the 16-bit operand serves them.
  const layout::MmaWeight float_zeros =
      metadata("w=uint4:g128:s=fp16:zp=float;a=int8:t", 4096, 4096);
  EXPECT_EQ(dispatch::dense_operand(64, float_zeros, int8_token, formats::bf16, kH200),
            formats::bf16);
}

TEST(DensePlan, PicksTheKernelByM) {
  const layout::MmaWeight w = metadata("w4a16", 28672, 8192);
  for (std::int64_t m : {1, 2, 5, 16})
    EXPECT_EQ(dispatch::plan_dense_gemm(m, w, formats::bf16, kH200).config.kernel,
              dispatch::DenseKernel::Streamed)
        << "M=" << m;
  for (std::int64_t m : {17, 64, 128})
    EXPECT_EQ(dispatch::plan_dense_gemm(m, w, formats::bf16, kH200).config.name, "medium")
        << "M=" << m;
  for (std::int64_t m : {129, 200, 257, 4096})
    EXPECT_EQ(dispatch::plan_dense_gemm(m, w, formats::bf16, kH200).config.kernel,
              dispatch::DenseKernel::DequantCublas)
        << "M=" << m;
}

// Every k16 block belongs to exactly one split: the splits reach K, and the last one is needed.
TEST(DensePlan, SplitsCoverKExactlyOnce) {
  for (const char* scheme : {"w4a16", "w8a16", "mxfp4-a16", "w=uint3:g64:s=bf16:zp=int;a=bf16"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {640, 640},
                        {5472, 2880},
                        {4000, 10944}})
      for (std::int64_t m : {1, 3, 16, 17, 64, 128}) {
        SCOPED_TRACE(std::string(scheme) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        const layout::MmaWeight w = metadata(scheme, n, k);
        const dispatch::DensePlan plan = dispatch::plan_dense_gemm(m, w, formats::bf16, kH200);
        ASSERT_GE(plan.splits, 1);
        if (plan.config.kernel == dispatch::DenseKernel::Streamed) {
          const std::int64_t per_split =
              static_cast<std::int64_t>(plan.blocks_per_warp) * plan.config.warps_k;
          EXPECT_EQ(plan.blocks_per_warp % (plan.config.block_k / 16), 0);
          EXPECT_GE(per_split * plan.splits, w.k_blocks);
          EXPECT_LT(per_split * (plan.splits - 1), w.k_blocks);
          EXPECT_EQ(plan.grid_x, static_cast<unsigned>(w.n_padded / 64));
          EXPECT_GE(plan.rows, m);
        } else {
          ASSERT_EQ(plan.config.kernel, dispatch::DenseKernel::Tiled);
          EXPECT_GE(static_cast<std::int64_t>(plan.tiles_per_split) * plan.splits, plan.k_tiles);
          EXPECT_LT(static_cast<std::int64_t>(plan.tiles_per_split) * (plan.splits - 1),
                    plan.k_tiles);
          EXPECT_GE(static_cast<std::int64_t>(plan.grid_y) * plan.config.block_m(), m);
          EXPECT_GE(static_cast<std::int64_t>(plan.grid_x) * plan.config.block_n(), w.n_padded);
        }
      }
}

// The streamed split (measured on the H200, bench/NOTES.md third session): every warp of a split
// plan streams at least 512 of K (shorter ranges pay their ramp and drain), and large-N decode
// is split (one split of 28672×8192 left too few warps in flight: 51 µs against 44).
TEST(DensePlan, StreamedSplitsKeepWarpRangesLongAndFillTheGpu) {
  for (const char* scheme : {"w4a16", "w8a16", "w=uint3:g64:s=bf16:zp=int;a=bf16"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {8192, 8192},
                        {640, 10944},
                        {5472, 2880}}) {
      SCOPED_TRACE(std::string(scheme) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
      const layout::MmaWeight w = metadata(scheme, n, k);
      const dispatch::DensePlan plan = dispatch::plan_dense_gemm(1, w, formats::bf16, kH200);
      ASSERT_EQ(plan.config.kernel, dispatch::DenseKernel::Streamed);
      if (plan.splits > 1) EXPECT_GE(plan.blocks_per_warp * 16, 512);
      if (n >= 8192 && k >= 8192) EXPECT_GT(plan.splits, 1);
    }
}

// Dequant + cuBLAS chunks are whole 64-row slices, within the scratch bound where one slice
// fits it, and never more than the weight.
TEST(DensePlan, DequantCublasChunksAreBoundedWholeSlices) {
  for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                      {8192, 28672},
                      {640, 640},
                      {4000, 10944},
                      {100, 1 << 20}})
    for (std::int64_t m : {std::int64_t{300}, std::int64_t{4096}, std::int64_t{1} << 22}) {
      SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) +
                   " K=" + std::to_string(k));
      const layout::MmaWeight w = metadata("w4a16", n, k);
      const dispatch::DensePlan plan =
          dispatch::plan_dense_gemm(m, w, formats::bf16, kH200, "dequant-cublas");
      EXPECT_EQ(plan.chunk_n % 64, 0);
      EXPECT_GE(plan.chunk_n, 64);
      EXPECT_LE(plan.chunk_n, w.n_padded);
      if (64 * k * 2 <= (std::int64_t{64} << 20) && 64 * m * 4 <= (std::int64_t{128} << 20)) {
        EXPECT_LE(plan.chunk_n * k * 2, std::int64_t{64} << 20);
        EXPECT_LE(plan.chunk_n * m * 4, std::int64_t{128} << 20);
      }
    }
}

// A weight whose groups suit no tile config (48 neither divides nor is a multiple of any BK)
// is still served, by dequant + cuBLAS, at every M; a forced config that cannot serve is an error
// naming it, and an unknown name is one too.
TEST(DensePlan, WeightsNoTileConfigServesFallBackToDequantCublas) {
  const layout::MmaWeight w = metadata("w=uint4:g48:s=bf16:zp=int;a=bf16", 640, 2880);
  for (std::int64_t m : {1, 16, 64, 4096}) {
    const dispatch::DensePlan plan = dispatch::plan_dense_gemm(m, w, formats::bf16, kH200);
    EXPECT_EQ(plan.config.kernel, dispatch::DenseKernel::DequantCublas) << "M=" << m;
  }
  try {
    dispatch::plan_dense_gemm(1, w, formats::bf16, kH200, "decode");
    ADD_FAILURE() << "forced decode served a group of 48";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
    EXPECT_NE(std::string(e.what()).find("decode"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("group 48"), std::string::npos) << e.what();
  }
  try {
    dispatch::plan_dense_gemm(1, w, formats::bf16, kH200, "no-such-config");
    ADD_FAILURE() << "an unknown config name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no-such-config"), std::string::npos) << e.what();
  }
}

// The dequant + cuBLAS kernels compile without spills: the dequantization for each zero mode
// and float weights, the finishing kernel for each output type.
TEST(DequantCublasSpecs, CompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  std::vector<jit::KernelSpec> specs;
  for (const char* scheme :
       {"w4a16", "w=uint4:g128:s=bf16:zp=int;a=bf16", "w=uint6:g128:s=fp16:zp=float;a=fp16",
        "w=e3m2:g32:s=e8m0;a=bf16", "w8a16"}) {
    const Scheme s = parse_scheme(scheme);
    dispatch::DensePlan plan = dispatch::plan_dense_gemm(
        4096, metadata(scheme, 640, 1024), s.activation.format, kH200, "dequant-cublas");
    specs.push_back(dispatch::dense_gemm_spec(plan, metadata(scheme, 640, 1024),
                                              s.activation.format, s.output, jit::Arch::sm_90a));
    EXPECT_EQ(specs.back().family, "mma_dequantize");
  }
  for (const Format& out : {formats::fp16, formats::bf16, formats::fp32})
    for (jit::Arch arch : {jit::Arch::sm_80, jit::Arch::sm_90a})
      specs.push_back(dispatch::finish_gemm_spec(out, arch));
  for (const jit::KernelSpec& spec : specs) {
    SCOPED_TRACE(jit::to_string(spec));
    const auto lookup = cache.get(spec);
    EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
    EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
  }
}

}  // namespace
}  // namespace qgemm
