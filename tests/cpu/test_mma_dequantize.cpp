// mma_dequantize on the host side: the constants the kernel and the launch share
// (kernels/gemm/mma_dequantize_shape.cuh) keep the properties the kernel relies on (a bijective,
// bank-conflict-free staging swizzle; hoisted scale rows that are each k16 block's own group;
// grids that cover every tile), its spec builder picks the math the host twin's exactness
// allows, its launch refuses bad arguments by name, and every format compiles without spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gemm/mma_dequantize_shape.cuh"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"
#include "runtime/mma_dequantize_launch.hpp"

namespace qgemm {
namespace {

using Shape = kernels::MmaDequantizeShape;

// Every (row, word) of a warp's region has its own 4 bytes, inside the region.
TEST(MmaDequantizeShape, StagingOffsetsAreABijectionOntoTheRegion) {
  std::set<unsigned> seen;
  for (unsigned row = 0; row < Shape::kTileRows; ++row)
    for (unsigned word = 0; word < Shape::kRowBytes / 4; ++word) {
      const unsigned offset = Shape::staging_offset(row, word);
      EXPECT_EQ(offset % 4, 0u);
      EXPECT_LT(offset, static_cast<unsigned>(Shape::kWarpSmemBytes));
      seen.insert(offset);
      // The 16-byte chunk a row's word lands in stays in that row (whole-row reads).
      EXPECT_EQ(offset / Shape::kRowBytes, row);
    }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(Shape::kWarpSmemBytes / 4));
}

// The writes of one instruction (fixed n8 block j, k16 block b, half h; lane (q, t) writes word
// 8b + 4h + t of row 8j + q) hit 32 distinct banks, and the kernel's base + immediate form is
// the same offset.
TEST(MmaDequantizeShape, StagingWritesAreConflictFree) {
  for (unsigned j = 0; j < 8; ++j)
    for (unsigned b = 0; b < Shape::kTileBlocks; ++b)
      for (unsigned h = 0; h < 2; ++h) {
        std::set<unsigned> banks;
        for (unsigned lane = 0; lane < 32; ++lane) {
          const unsigned q = lane / 4, t = lane % 4;
          const unsigned offset = Shape::staging_offset(8 * j + q, 8 * b + 4 * h + t);
          EXPECT_EQ(offset, j * 8 * Shape::kRowBytes + Shape::write_base(2 * b + h, lane));
          banks.insert(offset / 4 % 32);
        }
        EXPECT_EQ(banks.size(), 32u) << "j " << j << " b " << b << " h " << h;
      }
}

// The reads of one instruction (lane reads chunk lane % 8 of row 4i + lane / 8, 16 bytes) are
// served per quarter warp: each quarter's 8 chunks fall on 8 distinct 16-byte bank groups. The
// 16 reads cover the region once, and the kernel's base + immediate form is the same offset.
TEST(MmaDequantizeShape, StagingReadsAreConflictFreeAndCoverTheRegion) {
  std::set<unsigned> chunks;
  for (unsigned i = 0; i < Shape::kTileRows / 4; ++i)
    for (unsigned quarter = 0; quarter < 4; ++quarter) {
      std::set<unsigned> groups;
      for (unsigned lane = 8 * quarter; lane < 8 * quarter + 8; ++lane) {
        const unsigned row = 4 * i + lane / 8, chunk = lane % 8;
        const unsigned offset = Shape::staging_offset(row, 4 * chunk);
        EXPECT_EQ(offset % 16, 0u);
        EXPECT_EQ(offset, (i / 2) * 8 * Shape::kRowBytes + Shape::read_base(i % 2, lane));
        groups.insert(offset / 16 % 8);
        chunks.insert(offset);
      }
      EXPECT_EQ(groups.size(), 8u) << "read " << i << " quarter " << quarter;
    }
  EXPECT_EQ(chunks.size(), static_cast<std::size_t>(Shape::kWarpSmemBytes / 16));
}

// The kernel loads scale_rows(group) rows per tile, row s for the group of the tile's block
// first_block_of_scale_row(s), and block b uses row scale_row_of_block(b): for every group size
// and tile, that row must be block b's own group (k16 block kb is in group kb · 16 / group).
TEST(MmaDequantizeShape, HoistedScaleRowsAreEachBlocksGroup) {
  for (int group : {0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 192, 256, 384, 4096}) {
    const int rows = Shape::scale_rows(group);
    EXPECT_GE(rows, 1);
    EXPECT_LE(rows, Shape::kTileBlocks);
    for (long long kb0 = 0; kb0 < 4096; kb0 += Shape::kTileBlocks)
      for (int b = 0; b < Shape::kTileBlocks; ++b) {
        const int row = Shape::scale_row_of_block(group, b);
        ASSERT_GE(row, 0);
        ASSERT_LT(row, rows);
        const int first = Shape::first_block_of_scale_row(group, row);
        ASSERT_LE(first, b) << "a row is loaded for a block after the first that uses it";
        const auto group_of = [&](long long kb) { return group == 0 ? 0 : kb * 16 / group; };
        ASSERT_EQ(group_of(kb0 + first), group_of(kb0 + b))
            << "group " << group << " tile at k16 block " << kb0 << " block " << b;
      }
  }
}

TEST(MmaDequantizeShape, GridAndTilesCoverTheChunk) {
  EXPECT_EQ(Shape::ld_out(1), 8);
  EXPECT_EQ(Shape::ld_out(8192), 8192);
  EXPECT_EQ(Shape::ld_out(1003), 1008);
  EXPECT_EQ(Shape::k_tiles(Shape::kTileBlocks * 3 + 1), 4);
  EXPECT_EQ(Shape::tiles(65, 5), 2 * 2);  // 2 slices × 2 k tiles
  EXPECT_EQ(Shape::tiles(28672, 512), 448 * 128);
  for (int bps : {1, 2, 3})
    for (long long tiles : {1LL, 7LL, 8LL, 9LL, 1000LL, 57344LL}) {
      const long long blocks = Shape::grid_blocks(tiles, 132, bps);
      EXPECT_GE(blocks, 1);
      EXPECT_LE(blocks, 132LL * bps);  // persistent: never more than are resident
      // Enough warps for every tile when they fit at once, else every resident one.
      EXPECT_EQ(blocks, std::min((tiles + 7) / 8, 132LL * bps));
    }
  // The register budgets the blocks per SM stand for: 80 registers for the common formats.
  EXPECT_EQ(Shape::blocks_per_sm(4, false, false, 128), 3);
  EXPECT_EQ(Shape::blocks_per_sm(4, true, false, 128), 3);
  EXPECT_EQ(Shape::blocks_per_sm(8, false, false, 0), 3);
  EXPECT_EQ(Shape::blocks_per_sm(4, false, false, 16), 3);  // NVFP4
  EXPECT_EQ(Shape::blocks_per_sm(8, true, false, 16), 2);
  EXPECT_EQ(Shape::blocks_per_sm(8, true, true, 16), 1);
  static_assert(Shape::kSmemBytes == Shape::kWarps * Shape::kTileRows * Shape::kRowBytes);
  static_assert(3 * (Shape::kSmemBytes + 1024) <= 228 * 1024, "3 blocks fit an SM90 SM");
}

// A small random weight of `scheme_text`, repacked on the host (its metadata is what the spec
// builder reads).
layout::MmaWeight prepared(const std::string& scheme_text, std::int64_t n = 64,
                           std::int64_t k = 256) {
  const Scheme scheme = parse_scheme(scheme_text);
  std::vector<float> w(static_cast<std::size_t>(n * k));
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  return layout::repack_for_mma(quantize_weight(scheme.weight, w.data(), n, k));
}

TEST(MmaDequantizeSpec, ChoosesTheMathTheScalesAllow) {
  struct Case {
    std::string scheme;
    Format out;
    std::string text;  // the spec's parameter list
  };
  const Case cases[] = {
      {"w4a16", formats::bf16,
       "weight=uint4,zero=constant,group=128,dequant=int16,scale=half,out=bf16"},
      {"gptq-w4a16-g128", formats::fp16,
       "weight=uint4,zero=int,group=128,dequant=int16,scale=half,out=fp16"},
      // fp16 scales are not exact in bf16: the scale in fp32.
      {"gptq-w4a16-g128", formats::bf16,
       "weight=uint4,zero=int,group=128,dequant=int16,scale=fp32,out=bf16"},
      {"w8a16", formats::bf16,
       "weight=uint8,zero=constant,group=128,dequant=int_f32,scale=half,out=bf16"},
      // bf16 scales of ordinary magnitude are exact in fp16 too; 8-bit codes lift into fp16.
      {"w8a16", formats::fp16,
       "weight=uint8,zero=constant,group=128,dequant=int16,scale=half,out=fp16"},
      {"w=int8:ch:s=fp32;a=bf16", formats::bf16,
       "weight=int8,zero=constant,group=0,dequant=int_f32,scale=fp32,out=bf16"},
      {"w=e4m3:ch:s=fp32;a=bf16", formats::bf16,
       "weight=e4m3,zero=none,group=0,dequant=float16,scale=fp32,out=bf16"},
      {"fp8-block", formats::fp16,
       "weight=e4m3,zero=none,group=128,dequant=float16,scale=fp32,out=fp16"},
      {"mxfp4-a16", formats::bf16,
       "weight=e2m1,zero=none,group=32,dequant=float16,scale=half,out=bf16"},
      {"nvfp4-a16", formats::bf16,
       "weight=e2m1,zero=none,group=16,dequant=float16,scale=half,out=bf16"},
      {"w=uint6:g64:s=fp16:zp=float;a=fp16", formats::fp16,
       "weight=uint6,zero=float,group=64,dequant=fp32,scale=fp32,out=fp16"},
  };
  for (const Case& c : cases) {
    const jit::KernelSpec spec =
        jit::mma_dequantize_spec(prepared(c.scheme), c.out, jit::Arch::sm_90a);
    EXPECT_EQ(jit::to_string(spec),
              "mma_dequantize<" + c.text + ",order=mma>[threads=256,smem=65536]@sm_90a")
        << c.scheme;
    EXPECT_EQ(jit::parse_kernel_spec(jit::to_string(spec)), spec);
    // The same weight kept in the wgmma order only (SM90): the spec names it.
    layout::MmaWeight in_wgmma_order = prepared(c.scheme);
    in_wgmma_order.order = layout::FragmentOrder::Wgmma;
    EXPECT_EQ(jit::mma_dequantize_spec(in_wgmma_order, c.out, jit::Arch::sm_90a)
                  .param("order")
                  .choice,
              "wgmma");
  }
  try {
    jit::mma_dequantize_spec(prepared("w4a16"), formats::fp32, jit::Arch::sm_90a);
    ADD_FAILURE() << "fp32 output accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos) << e.what();
  }
  try {
    jit::parse_kernel_spec(
        "mma_dequantize<weight=uint4,zero=constant,group=40,dequant=fp32,scale=fp32,out=bf16,"
        "order=mma>[threads=256,smem=65536]@sm_90a");
    ADD_FAILURE() << "group 40 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group = 40"), std::string::npos) << e.what();
  }
  for (const char* text :
       {"mma_dequantize<weight=uint4,zero=constant,group=0,dequant=fp32,scale=half,out=bf16,"
        "order=mma>[threads=256,smem=65536]@sm_90a",
        "mma_dequantize<weight=uint4,zero=float,group=0,dequant=int16,scale=fp32,out=bf16,"
        "order=mma>[threads=256,smem=65536]@sm_90a"}) {
    try {
      jit::parse_kernel_spec(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rule"), std::string::npos) << e.what();
    }
  }
}

// Valid arguments of a 3-chunk weight (fake device addresses: nothing is launched).
kernels::MmaDequantizeArgs valid_args() {
  kernels::MmaDequantizeArgs args{};
  args.words = reinterpret_cast<const unsigned*>(0x10000);
  args.scales = reinterpret_cast<const float*>(0x20000);
  args.out = reinterpret_cast<unsigned short*>(0x30000);
  args.n_begin = 128;
  args.rows = 85;
  args.k = 1003;
  args.ld_out = 1008;
  args.k_blocks = 63;
  args.n_padded = 256;
  return args;
}

TEST(MmaDequantizeLaunch, RefusesBadArgumentsByName) {
  constexpr auto kMma = layout::FragmentOrder::Mma;
  constexpr auto kWgmma = layout::FragmentOrder::Wgmma;
  EXPECT_NO_THROW(runtime::check_mma_dequantize_args(valid_args(), kMma));
  // The wgmma order stores K in whole k64 chunks: 1003 columns are 64 k16 blocks there, 63 in
  // the mma order; each order refuses the other's count.
  kernels::MmaDequantizeArgs chunked = valid_args();
  chunked.k_blocks = 64;
  EXPECT_NO_THROW(runtime::check_mma_dequantize_args(chunked, kWgmma));
  EXPECT_THROW(runtime::check_mma_dequantize_args(chunked, kMma), Error);
  EXPECT_THROW(runtime::check_mma_dequantize_args(valid_args(), kWgmma), Error);
  struct Bad {
    const char* names;  // what the message must contain
    void (*spoil)(kernels::MmaDequantizeArgs&);
  };
  const Bad bad[] = {
      {"words is null", [](kernels::MmaDequantizeArgs& a) { a.words = nullptr; }},
      {"scales is null", [](kernels::MmaDequantizeArgs& a) { a.scales = nullptr; }},
      {"16-byte aligned",
       [](kernels::MmaDequantizeArgs& a) { a.out = reinterpret_cast<unsigned short*>(0x30004); }},
      {"n_begin = 96", [](kernels::MmaDequantizeArgs& a) { a.n_begin = 96; }},
      {"rows = 0", [](kernels::MmaDequantizeArgs& a) { a.rows = 0; }},
      {"rows = 129", [](kernels::MmaDequantizeArgs& a) { a.rows = 129; }},
      {"k_blocks = 62", [](kernels::MmaDequantizeArgs& a) { a.k_blocks = 62; }},
      {"ld_out = 1002", [](kernels::MmaDequantizeArgs& a) { a.ld_out = 1002; }},
      {"ld_out = 1012", [](kernels::MmaDequantizeArgs& a) { a.ld_out = 1012; }},
      {"n_padded = 100", [](kernels::MmaDequantizeArgs& a) { a.n_padded = 100; }},
  };
  for (const Bad& b : bad) {
    kernels::MmaDequantizeArgs args = valid_args();
    b.spoil(args);
    try {
      runtime::check_mma_dequantize_args(args, kMma);
      ADD_FAILURE() << "accepted: " << b.names;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(b.names), std::string::npos) << e.what();
    }
  }
}

// The formats of the dequantize + cuBLAS path (each preset of the issue, both output types)
// compile for sm_90a without spills or stack; registers and compile time are printed. The
// kernel is built for MmaDequantizeShape::blocks_per_sm, whose register budget it must meet.
TEST(MmaDequantizeSpecs, CompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  const char* schemes[] = {
      "w4a16",
      "w=uint4:g128:s=fp16:zp=int;a=fp16",
      "w=uint4:g128:s=fp16:zp=int;a=bf16",
      "w2a16",
      "w3a16",
      "w8a16",
      "w=int4:g128:s=bf16;a=bf16",
      "w=int8:ch:s=fp32;a=bf16",
      "w=e4m3:ch:s=fp32;a=bf16",
      "w=e4m3:b128x128:s=fp32;a=bf16",
      "mxfp4-a16",
      "nvfp4-a16",
      "w=ternary:t:s=fp32;a=bf16",
      "w=uint6:g64:s=fp16:zp=float;a=fp16",
      "w=uint8:g16:s=bf16:zp=int;a=bf16",
  };
  for (const char* text : schemes)
    for (const Format& out : {formats::bf16, formats::fp16}) {
      const jit::KernelSpec spec = jit::mma_dequantize_spec(prepared(text), out, jit::Arch::sm_90a);
      SCOPED_TRACE(jit::to_string(spec));
      const auto lookup = cache.get(spec);
      const int blocks = runtime::mma_dequantize_blocks_per_sm(spec);
      EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
      EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
      EXPECT_GT(lookup.kernel->resources.registers, 0);
      EXPECT_LE(lookup.kernel->resources.registers * Shape::kThreads * blocks, 65536);
      std::printf("%-40s %s  %3d registers  %d blocks/SM  %6.0f ms\n", text, out.name().c_str(),
                  lookup.kernel->resources.registers, blocks, lookup.kernel->compile_ms);
    }
}

}  // namespace
}  // namespace qgemm
