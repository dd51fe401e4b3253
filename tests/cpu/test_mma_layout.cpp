// The mma.sync family's prepared layout (CPU twin of the repack) and its kernel specs.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "dispatch/candidate_launch.hpp"
#include "dispatch/mma_family.hpp"
#include "gemm/mma_repack_args.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "gemm/wgmma_weight_layout.cuh"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "jit/compiler.hpp"
#include "layout/mma_layout.hpp"
#include "layout/mma_repack_gpu.hpp"
#include "qgemm/error.hpp"
#include "util/scale_exactness.cuh"

namespace qgemm {
namespace {

using kernels::MmaWeightLayout;
using kernels::WgmmaWeightLayout;
using layout::FragmentOrder;

constexpr FragmentOrder kOrders[] = {FragmentOrder::Mma, FragmentOrder::Wgmma};

TEST(MmaLayout, FragmentMapIsABijectionMatchingMmaOperands) {
  // Every (n, k) of a 64x16 block has exactly one (lane, code), and the inverse maps back.
  std::set<std::pair<int, int>> seen;
  for (int n = 0; n < 64; ++n)
    for (int k = 0; k < 16; ++k) {
      const int lane = MmaWeightLayout::lane_of(n, k), c = MmaWeightLayout::code_of(n, k);
      ASSERT_TRUE(lane >= 0 && lane < 32 && c >= 0 && c < 32);
      EXPECT_TRUE(seen.insert({lane, c}).second);
      EXPECT_EQ(MmaWeightLayout::n_of(lane, c), n);
      EXPECT_EQ(MmaWeightLayout::k_of(lane, c), k);
    }
  // mma.m16n8k16 B operand: lane l holds column l/4 and rows 2(l%4), 2(l%4)+1 (b0), +8 (b1).
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(MmaWeightLayout::n_of(lane, 0), lane / 4);
    EXPECT_EQ(MmaWeightLayout::k_of(lane, 0), 2 * (lane % 4));
    EXPECT_EQ(MmaWeightLayout::k_of(lane, 1), 2 * (lane % 4) + 1);
    EXPECT_EQ(MmaWeightLayout::k_of(lane, 2), 2 * (lane % 4) + 8);
    EXPECT_EQ(MmaWeightLayout::k_of(lane, 3), 2 * (lane % 4) + 9);
  }
}

TEST(WgmmaLayout, FragmentMapIsABijectionMatchingWgmmaOperands) {
  // Every (n, k) of a 64x64 (tile, chunk) has exactly one (thread, code), and back.
  std::set<std::pair<int, int>> seen;
  for (int n = 0; n < 64; ++n)
    for (int k = 0; k < 64; ++k) {
      const int thread = WgmmaWeightLayout::thread_of(n, k), c = WgmmaWeightLayout::code_of(n, k);
      ASSERT_TRUE(thread >= 0 && thread < 128 && c >= 0 && c < 32);
      EXPECT_TRUE(seen.insert({thread, c}).second);
      EXPECT_EQ(WgmmaWeightLayout::n_of(thread, c), n);
      EXPECT_EQ(WgmmaWeightLayout::k_of(thread, c), k);
    }
  // wgmma's register A (the mma.m16n8k16 A fragment of warp w's rows 16w..16w+15): register r
  // of k16 step kb holds codes 2p, 2p + 1 (p = 4 kb + r) at row g + 8 (r & 1), k 2t + 8 (r / 2).
  for (int thread = 0; thread < 128; ++thread) {
    const int warp = thread / 32, g = thread % 32 / 4, t = thread % 4;
    for (int kb = 0; kb < 4; ++kb)
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) {
          const int c = 2 * (4 * kb + r) + h;
          EXPECT_EQ(WgmmaWeightLayout::n_of(thread, c), 16 * warp + g + 8 * (r & 1));
          EXPECT_EQ(WgmmaWeightLayout::k_of(thread, c), 16 * kb + 2 * t + h + 8 * (r / 2));
        }
  }
  // Scale columns: a permutation of each tile with rows g and g + 8 of a warp adjacent.
  std::set<long long> columns;
  for (int n = 0; n < 128; ++n) columns.insert(WgmmaWeightLayout::scale_column(n));
  EXPECT_EQ(columns.size(), 128u);
  EXPECT_EQ(*columns.rbegin(), 127);
  for (int n = 0; n < 64; ++n)
    if (n % 16 < 8)
      EXPECT_EQ(WgmmaWeightLayout::scale_column(n) + 1, WgmmaWeightLayout::scale_column(n + 8));
}

// The streamed decode kernel reads either order (MmaWeightLayout::decode_run and the rest): in
// both, the pair it feeds into B register b of n8 tile j at k16 block kb must hold the two
// elements of the mma.m16n8k16 B fragment, column j · 8 + g and k 2t + 8b (+ 1), and the scale
// offset it reads must be that column's.
template <class Order>
void expect_decode_reads_the_b_fragments() {
  constexpr int kRunsPerUnit = Order::kUnitThreads / 32;  // runs of 32 lanes in a layout unit
  for (int kb = 0; kb < 8; ++kb)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int j = 0; j < 8; ++j)
        for (int b = 0; b < 2; ++b) {
          const int run = Order::decode_run(kb, j);
          // The lane reads runs kDecodeReadBlocks at a time, each block inside its own read.
          ASSERT_EQ(run / Order::kDecodeReadBlocks, kb / Order::kDecodeReadBlocks);
          const int unit = run / kRunsPerUnit, thread = (run % kRunsPerUnit) * 32 + lane;
          for (int h = 0; h < 2; ++h) {
            const int c = 2 * Order::decode_pair(kb, j, b) + h;
            ASSERT_TRUE(c >= 0 && c < 32);
            EXPECT_EQ(Order::n_of(thread, c), j * 8 + g) << "kb " << kb << " j " << j;
            EXPECT_EQ(unit * Order::kUnitK + Order::k_of(thread, c), kb * 16 + 2 * t + 8 * b + h)
                << "kb " << kb << " j " << j << " b " << b;
          }
        }
    }
  for (int j = 0; j < 8; ++j)
    for (int g = 0; g < 8; ++g)
      EXPECT_EQ(Order::decode_scale_offset(j, g), Order::scale_column(j * 8 + g));
}

TEST(MmaLayout, DecodeKernelReadsBFragmentsFromEitherOrder) {
  expect_decode_reads_the_b_fragments<MmaWeightLayout>();
  expect_decode_reads_the_b_fragments<WgmmaWeightLayout>();
}

// A gate_up weight prepared for the fused GLU (kernels::glu_source_row): every gate and up row
// lands once, and where the grouped kernels' epilogues look for it: a thread's accumulator rows
// 64 s + 16 q + g and + 8 (decode: acc[q][bt][e], e / 2 = 0 / 1; wgmma: warp q's acc[4j + e])
// hold gate j and up j of column j = 32 s + 8 q + g; rows of no source (j ≥ I) are padding, and
// every row lies below the padded rows, round_up(2 I, 64).
TEST(MmaLayout, GluInterleaveHoldsGateAndUpWhereTheEpiloguesReadThem) {
  for (const long long inter : {1LL, 7LL, 8LL, 12LL, 20LL, 100LL, 192LL, 360LL, 768LL, 2880LL}) {
    SCOPED_TRACE(inter);
    const long long padded = (2 * inter + 63) / 64 * 64;
    std::vector<int> seen(static_cast<std::size_t>(2 * inter), 0);
    for (long long row = 0; row < padded; ++row) {
      const long long source = kernels::glu_source_row(row, inter);
      const long long slice = row / 64, q = row % 64 / 16, g = row % 8;
      const bool up = row % 16 >= 8;
      const long long column = 32 * slice + 8 * q + g;
      if (column >= inter) {
        EXPECT_EQ(source, -1) << row;
        continue;
      }
      ASSERT_GE(source, 0) << row;
      EXPECT_EQ(source, up ? inter + column : column) << row;
      ++seen[static_cast<std::size_t>(source)];
    }
    for (std::size_t r = 0; r < seen.size(); ++r) EXPECT_EQ(seen[r], 1) << "source row " << r;
  }
}

TEST(MmaLayout, RepackReproducesTheDequantizedWeightForEveryFormat) {
  const std::uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char* text : {"w4a16",
                           "w4a16-zp",
                           "w2a16",
                           "w3a16",
                           "w8a16",
                           "gptq-w4a16-g128",
                           "mxfp4-a16",
                           "nvfp4-a16",
                           "fp8-block",
                           "bitnet",
                           "w=int4:g32:s=bf16;a=bf16",
                           "w=uint1:g64:s=bf16:zp=int;a=bf16",
                           "w=uint5:g128:s=bf16:zp=int;a=bf16",
                           "w=uint6:g128:s=fp16:zp=float;a=fp16",
                           "w=int3:g32:s=bf16:zp=float;a=bf16",
                           "w=uint7:ch:s=fp32:zp=mid;a=bf16",
                           "w=e5m2:g64:s=bf16;a=fp16",
                           "w=e3m2:g32:s=e8m0;a=bf16",
                           "w=e2m3:g16:s=e8m0;a=bf16",
                           "w=int8:t:s=fp32;a=bf16"}) {
    SCOPED_TRACE(std::string(text) + " seed " + std::to_string(seed));
    const Scheme scheme = parse_scheme(text);
    const std::int64_t n = 64 * 2 + 37;  // a partial slice
    const std::int64_t k =
        scheme.weight.granularity == WeightGranularity::Group ? 2 * 128 : 200 + 8;
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
    const std::vector<double> expected = dequantize_weight(packed);
    for (FragmentOrder order : kOrders) {
    SCOPED_TRACE(layout::fragment_order_name(order));
    const layout::MmaWeight prepared = layout::repack_for_mma(packed, order);
    EXPECT_EQ(prepared.n_padded % 64, 0);
    EXPECT_EQ(prepared.k_blocks,
              order == FragmentOrder::Mma ? (k + 15) / 16 : (k + 63) / 64 * 4);
    // Exact, but for float zero points: the layout keeps zero + 2^(bits-1) (the signed offset
    // folded in) as fp32, one rounding of at most 2^-24 of the largest such zero, times the
    // scale (bound doubled: a margin for the double arithmetic around it).
    double tolerance = 0.0;
    if (prepared.zero_mode == layout::MmaZeroMode::Float) {
      float largest_zero = 0.0f, largest_scale = 0.0f;
      for (float z : prepared.zeros) largest_zero = std::max(largest_zero, std::abs(z));
      for (float s : prepared.scales) largest_scale = std::max(largest_scale, std::abs(s));
      tolerance = std::ldexp(double{largest_zero} * largest_scale * packed.global_scale, -23);
    }
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < k; ++c)
        ASSERT_NEAR(layout::mma_weight_value(prepared, r, c) * packed.global_scale,
                    expected[static_cast<std::size_t>(r * k + c)], tolerance)
            << "at n=" << r << " k=" << c;
    }
  }
}

// Partial last groups (K % G != 0), and K that is not a multiple of 16 on top: groups =
// ceil(K / G) scale (and zero) rows, the last group's own values, and the K padding of the last
// k16 block inside the last group's row (never past [groups][n_padded]).
TEST(MmaLayout, PartialLastGroupsReproduceTheDequantizedWeight) {
  const std::uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    const char* scheme;
    std::int64_t k;
    int groups;  // ceil(k / group), written out
  };
  for (const Case& c :
       {Case{"w4a16", 2880, 23}, Case{"gptq-w4a16-g128", 2880, 23}, Case{"w8a16", 2888, 23},
        Case{"mxfp4-a16", 2896, 91}, Case{"nvfp4-a16", 2904, 182}, Case{"fp8-block", 2880, 23},
        Case{"w=uint6:g64:s=fp16:zp=float;a=fp16", 2888, 46},
        Case{"w=int3:g32:s=bf16;a=bf16", 2890, 91},
        Case{"w=uint1:g64:s=bf16:zp=int;a=bf16", 100, 2}}) {
    SCOPED_TRACE(std::string(c.scheme) + " K=" + std::to_string(c.k) + " seed " +
                 std::to_string(seed));
    const Scheme scheme = parse_scheme(c.scheme);
    const std::int64_t n = 64 + 37, k = c.k;
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    // The last group an order of magnitude smaller: its scales differ from the others'.
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t d = (k - 1) / 16 * 16 - 16; d < k; ++d) w[r * k + d] *= 0.01f;
    const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
    const std::vector<double> expected = dequantize_weight(packed);
    for (FragmentOrder order : kOrders) {
    SCOPED_TRACE(layout::fragment_order_name(order));
    const layout::MmaWeight prepared = layout::repack_for_mma(packed, order);
    EXPECT_EQ(prepared.groups, c.groups);
    EXPECT_EQ(prepared.scales.size(), static_cast<std::size_t>(c.groups) * prepared.n_padded);
    if (prepared.stores_zeros()) EXPECT_EQ(prepared.zeros.size(), prepared.scales.size());
    // mma order: the last k16 block, padding included, maps to the last scale row. The wgmma
    // order pads K to 64, which may pass the last group: the kernel (and mma_weight_value)
    // clamp the row to the last one.
    if (order == FragmentOrder::Mma)
      EXPECT_EQ((prepared.k_blocks * 16 - 1) / prepared.group_size, c.groups - 1);
    double tolerance = 0.0;  // float zeros: see RepackReproducesTheDequantizedWeight...
    if (prepared.zero_mode == layout::MmaZeroMode::Float) {
      float largest_zero = 0.0f, largest_scale = 0.0f;
      for (float z : prepared.zeros) largest_zero = std::max(largest_zero, std::abs(z));
      for (float s : prepared.scales) largest_scale = std::max(largest_scale, std::abs(s));
      tolerance = std::ldexp(double{largest_zero} * largest_scale * packed.global_scale, -23);
    }
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t d = 0; d < k; ++d)
        ASSERT_NEAR(layout::mma_weight_value(prepared, r, d) * packed.global_scale,
                    expected[static_cast<std::size_t>(r * k + d)], tolerance)
            << "at n=" << r << " k=" << d;
    // Padding columns hold code 0 (k_blocks · 16 > K where K % 16 != 0).
    for (std::int64_t d = k; d < prepared.k_blocks * 16; ++d) {
      const double scale = prepared.scales[static_cast<std::size_t>(
          (prepared.groups - 1) * prepared.n_padded + layout::scale_column(order, 5))];
      double code_zero = 0.0;  // the value code 0 stands for, before the scale
      if (prepared.format.is_float())
        code_zero = decode(prepared.format, 0);
      else if (prepared.zero_mode == layout::MmaZeroMode::Constant)
        code_zero = -std::ldexp(1.0, prepared.format.bits - 1);
      else if (prepared.stores_zeros())
        code_zero = -prepared.zeros[static_cast<std::size_t>(
            (prepared.groups - 1) * prepared.n_padded + layout::scale_column(order, 5))];
      EXPECT_EQ(layout::mma_weight_value(prepared, 5, d), code_zero * scale) << "k=" << d;
    }
    }
  }
}

TEST(MmaLayout, UnservableGroupsAreReported) {
  WeightQuant q = parse_scheme("w=uint4:g8:s=bf16;a=bf16").weight;
  EXPECT_TRUE(layout::mma_unsupported_reason(q).has_value());
  std::vector<float> w(16 * 16, 0.5f);
  EXPECT_THROW(layout::repack_for_mma(quantize_weight(q, w.data(), 16, 16)), Error);
}

// A packed weight whose arrays do not match its shape is refused by name before any is read.
TEST(MmaLayout, MalformedPackedWeightsAreRejectedByName) {
  std::vector<float> w(64 * 256);
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  const PackedWeight good = quantize_weight(parse_scheme("w4a16-zp").weight, w.data(), 64, 256);
  auto expect_refused = [](PackedWeight bad, const char* field) {
    try {
      layout::repack_for_mma(bad);
      ADD_FAILURE() << field << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  PackedWeight bad = good;
  bad.codes.pop_back();
  expect_refused(bad, "codes");
  bad = good;
  bad.scales.resize(bad.scales.size() / 2);
  expect_refused(bad, "scales");
  bad = good;
  bad.zeros.clear();
  expect_refused(bad, "zeros");
  bad = good;
  bad.global_scale = 0.0;
  expect_refused(bad, "global_scale");
  bad = good;
  bad.k = 200;  // a K the arrays were not packed for (rows of 100 bytes, 2 groups: fine alone)
  expect_refused(bad, "codes");
}

// `spec` compiles to a kernel with registers and no local memory (spills or stack).
void expect_no_spills(jit::KernelCache& cache, const jit::KernelSpec& spec) {
  SCOPED_TRACE(jit::to_string(spec));
  const auto lookup = cache.get(spec);
  EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
  EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
  EXPECT_GT(lookup.kernel->resources.registers, 0);
}

// Every config of the family compiles without spills for sm_80, sm_89 and sm_90a, for four weight
// families that span its code paths (int16 / int_f32 / float16 dequantization, stored zeros,
// fp32 output) with the largest streamed A (16 rows).
TEST(DenseGemmSpecs, CompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});  // memory only: always a real compile
  const char* schemes[] = {"w4a16", "w=uint3:g128:s=bf16:zp=int;a=fp16;o=fp16", "nvfp4-a16",
                           "w=e4m3:ch:s=fp32;a=bf16;o=fp32"};
  std::vector<float> w(256 * 256);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  for (jit::Arch arch : {jit::Arch::sm_80, jit::Arch::sm_89, jit::Arch::sm_90a}) {
    for (std::size_t s = 0; s < std::size(schemes); ++s) {
      const Scheme scheme = parse_scheme(schemes[s]);
      const layout::MmaWeight prepared =
          layout::repack_for_mma(quantize_weight(scheme.weight, w.data(), 256, 256));
      for (const auto& config : dispatch::mma_configs()) {
        const auto gpu = dispatch::GpuLimits::of_arch(jit::Arch::sm_90a, 132);
        if (config.unsupported_reason(16, prepared, scheme.activation.format, gpu)) continue;
        dispatch::MmaLaunch launch = dispatch::mma_launch(config, 16, prepared, gpu);
        launch.splits = config.kernel == dispatch::MmaKernel::Tiled && config.tile.warps_k > 1 ? 2 : 1;
        // The streamed kernel's largest A (16 rows) is its most register-hungry instantiation.
        launch.rows = 16;
        expect_no_spills(cache, dispatch::mma_spec(config, launch, prepared,
                                                   scheme.activation.format, scheme.output, arch));
      }
    }
  }
}

// The 8-bit activation configs (mma.m16n8k32) compile without spills for each byte
// dequantization (raw integer codes with and without zero points, raw e4m3 codes, integers and
// small floats through fp16) and group shape, on every architecture that takes them (e4m3 on
// SM89 only of these: SM90 has no native e4m3 mma.sync).
TEST(DenseGemmSpecs, ByteOperandConfigsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  const char* schemes[] = {"w8a8-int8",
                           "w=uint4:g128:s=fp16:zp=int;a=int8:t;o=fp16",
                           "w=uint3:g32:s=bf16:zp=int;a=int8:t;o=fp32",
                           "w4a8-fp8",
                           "w8a8-fp8",
                           "mxfp4-a8"};
  std::vector<float> w(256 * 256);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  int compiled = 0;
  for (jit::Arch arch : {jit::Arch::sm_80, jit::Arch::sm_89, jit::Arch::sm_90a}) {
    for (const char* text : schemes) {
      const Scheme scheme = parse_scheme(text);
      const layout::MmaWeight prepared =
          layout::repack_for_mma(quantize_weight(scheme.weight, w.data(), 256, 256));
      for (const auto& config : dispatch::mma_configs()) {
        if (config.operand_bytes != 1) continue;
        const auto gpu = dispatch::GpuLimits::of_arch(arch, 132);
        const auto reason = config.unsupported_reason(64, prepared, scheme.activation.format, gpu);
        if (arch != jit::Arch::sm_89 && scheme.activation.format == formats::e4m3) {
          EXPECT_TRUE(reason.has_value()) << text << ": e4m3 mma.sync is not native here";
          continue;
        }
        ASSERT_FALSE(reason.has_value()) << text << " " << config.name << ": " << *reason;
        dispatch::MmaLaunch launch = dispatch::mma_launch(config, 64, prepared, gpu);
        launch.splits = 2;
        expect_no_spills(cache, dispatch::mma_spec(config, launch, prepared,
                                                   scheme.activation.format, scheme.output, arch));
        ++compiled;
      }
    }
  }
  EXPECT_EQ(compiled, 3 * (3 + 6 + 3));
}

// The 8-bit operand's K order matches the weight's: in the register a lane builds for n8 tile
// j of a k-block (codes 4j, 4j+2, 4j+1, 4j+3; dequant/mma_dequant.cuh, lane_bytes), byte i sits
// at mma K position 4 · (lane % 4) + i, and there the activations hold the code's own k.
TEST(MmaLayout, Operand8OrderMatchesTheCodesOfEachLane) {
  using L = kernels::MmaWeightLayout;
  std::vector<int> seen(16, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 8; ++j) {
      const int codes[4] = {4 * j, 4 * j + 2, 4 * j + 1, 4 * j + 3};
      for (int i = 0; i < 4; ++i) {
        const int k = L::k_of(lane, codes[i]);
        EXPECT_EQ(L::n_of(lane, codes[i]), j * 8 + lane / 4);
        EXPECT_EQ(L::operand8_position(k), 4 * (lane % 4) + i) << "lane " << lane << " k " << k;
        if (j == 0 && lane < 4) ++seen[L::operand8_position(k)];
      }
    }
  for (int position = 0; position < 16; ++position) EXPECT_EQ(seen[position], 1);  // a bijection
  EXPECT_EQ(L::operand8_position(16 + 9), 16 + 3);  // runs of 16 keep their place
}

// SM75 (Turing) with fp16 activations: the plan fits its 64 KB of shared memory at every M, and
// what it launches (decode, tiled, dequant + cuBLAS with its finishing pass) compiles for sm_75
// without spills, where cp.async and mma.m16n8k16 fall back (ptx/); bf16 is refused by name.
TEST(DenseGemmSpecs, Sm75ServesFp16Activations) {
  jit::KernelCache cache(jit::CacheConfig{});
  const dispatch::GpuLimits turing = dispatch::GpuLimits::of_arch(jit::Arch::sm_75, 40);
  std::vector<float> w(512 * 512);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  for (const char* text : {"gptq-w4a16-g128", "w=e4m3:ch:s=fp32;a=fp16;o=fp16"}) {
    const Scheme scheme = parse_scheme(text);
    const layout::MmaWeight prepared =
        layout::repack_for_mma(quantize_weight(scheme.weight, w.data(), 512, 512));
    dispatch::WeightFacts facts;
    facts.quant = scheme.weight;
    facts.n = facts.mma.emplace(prepared).n;
    facts.k = prepared.k;
    dispatch::SelectionContext context;
    context.gpu = turing;
    context.rates = dispatch::GpuRates::of(turing);
    for (std::int64_t m : {1, 9, 17, 100, 300}) {
      GemmProblem problem;
      problem.scheme = scheme;
      problem.m = m;
      problem.n = 512;
      problem.k = 512;
      problem.input = formats::fp16;
      const dispatch::Selection selection = dispatch::select(problem, m, facts, context);
      const dispatch::CandidateLaunch launch =
          dispatch::candidate_launch(problem, m, selection.chosen(), facts, turing, 0.0);
      for (const jit::KernelSpec& launched : launch.specs()) {
        SCOPED_TRACE(jit::to_string(launched));
        EXPECT_LE(launched.launch.dynamic_smem_bytes, turing.shared_per_block);
        const auto lookup = cache.get(launched);
        EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0) << jit::to_string(launched);
        EXPECT_GT(lookup.kernel->resources.registers, 0);
      }
    }
    // Dequantize + cuBLAS, forced at M = 17, compiles for sm_75 too.
    for (const char* forced : {"qdq"}) {
      GemmProblem problem;
      problem.scheme = scheme;
      problem.m = 17;
      problem.n = 512;
      problem.k = 512;
      problem.input = formats::fp16;
      context.forced = forced;
      const dispatch::Selection selection = dispatch::select(problem, 17, facts, context);
      for (const jit::KernelSpec& launched :
           dispatch::candidate_launch(problem, 17, selection.chosen(), facts, turing, 0.0).specs())
        EXPECT_EQ(cache.get(launched).kernel->resources.spill_bytes(), 0) << jit::to_string(launched);
      context.forced.clear();
    }
    GemmProblem bf16 = {};
    bf16.scheme = scheme;
    bf16.scheme.activation.format = formats::bf16;
    bf16.n = 512;
    bf16.k = 512;
    try {
      dispatch::select(bf16, 1, facts, context);
      ADD_FAILURE() << "bf16 planned on sm_75";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Unsupported);
      EXPECT_NE(std::string(e.what()).find("SM80"), std::string::npos) << e.what();
    }
  }
  const ActivationQuant per_token = parse_scheme("w8a8-fp8").activation;
  const auto lookup = cache.get(jit::quantize_activation_spec(
      per_token, formats::fp16, jit::ActivationEmit::Operand, formats::fp16, jit::Arch::sm_75));
  EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
}

// The 16-bit types the device repack checks scales against (util/scale_exactness.cuh) are
// bf16 and fp16 as the format library defines them, and the rule holds at its edges.
TEST(MmaLayout, Packed16ScaleExactnessAtItsEdges) {
  for (const auto& [type, format] : {std::pair{kernels::kPacked16Bf16, formats::bf16},
                                     std::pair{kernels::kPacked16Fp16, formats::fp16}}) {
    EXPECT_EQ(type.mantissa_bits, format.mantissa_bits);
    EXPECT_EQ(type.min_normal, format.min_normal());
    EXPECT_EQ(type.max_finite, format.max_finite());
  }
  using kernels::packed16_scale_exact;
  EXPECT_TRUE(packed16_scale_exact(0.0, kernels::kPacked16Fp16, 4));
  EXPECT_TRUE(packed16_scale_exact(-0.375, kernels::kPacked16Bf16, 4));  // 1.1b · 2^-2
  EXPECT_FALSE(packed16_scale_exact(1.0 / 3.0, kernels::kPacked16Bf16, 4));
  // 1 + 2^-8: 9 significant bits, beyond bf16's 8 and within fp16's 11.
  EXPECT_FALSE(packed16_scale_exact(1.0 + 0x1p-8, kernels::kPacked16Bf16, 4));
  EXPECT_TRUE(packed16_scale_exact(1.0 + 0x1p-8, kernels::kPacked16Fp16, 4));
  // fp16: 2^-14 is its smallest normal, 2^-15 subnormal; 4096 · 2^4 = 65536 overflows it.
  EXPECT_TRUE(packed16_scale_exact(0x1p-14, kernels::kPacked16Fp16, 4));
  EXPECT_FALSE(packed16_scale_exact(0x1p-15, kernels::kPacked16Fp16, 4));
  EXPECT_TRUE(packed16_scale_exact(2048.0, kernels::kPacked16Fp16, 4));
  EXPECT_FALSE(packed16_scale_exact(4096.0, kernels::kPacked16Fp16, 4));
  // The host's Format wrapper agrees.
  EXPECT_FALSE(layout::packed16_scale_exact(4096.0, formats::fp16, 4));
  EXPECT_TRUE(layout::packed16_scale_exact(4096.0, formats::bf16, 4));
}

// The device twin of the repack compiles for every weight family (integer, float, zero points).
TEST(MmaRepackSpecs, CompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  std::vector<float> w(64 * 128, 0.25f);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 17) - 8.0f;
  for (const char* text : {"w4a16", "w4a16-zp", "w=uint6:g128:s=fp16:zp=float;a=fp16", "nvfp4-a16",
                           "mxfp4-a16", "fp8-block", "w=int3:g32:s=bf16;a=bf16"}) {
    const Scheme scheme = parse_scheme(text);
    for (FragmentOrder order : kOrders) {
      const jit::KernelSpec spec = layout::mma_repack_spec(
          quantize_weight(scheme.weight, w.data(), 64, 128), jit::Arch::sm_90a, order);
      SCOPED_TRACE(jit::to_string(spec));
      const auto lookup = cache.get(spec);
      EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
      EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
    }
  }
}

}  // namespace
}  // namespace qgemm
