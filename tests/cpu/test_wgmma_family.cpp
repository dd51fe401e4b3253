// The SM90 wgmma family on the CPU side (src/dispatch/wgmma_family.hpp): it is opt-in until it has
// been verified on an H200, its launches cover the problem exactly once, its rules reject what
// the kernel cannot hold, and its JIT specs compile for sm_90a without spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "scoped_env.hpp"
#include "dequant/wgmma_codes8.cuh"
#include "dispatch/candidate_launch.hpp"
#include "dispatch/select.hpp"
#include "dispatch/wgmma_family.hpp"
#include "gemm/mma_weight_layout.cuh"
#include "gemm/wgmma_weight_layout.cuh"
#include "jit/cache.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/moe.hpp"
#include "qgemm/plan.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::dispatch {
namespace {

const GpuLimits kH200 = GpuLimits::of_arch(jit::Arch::sm_90a, 132);

GemmProblem problem_of(const std::string& scheme, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmProblem p;
  p.scheme = parse_scheme(scheme);
  p.m = m;
  p.n = n;
  p.k = k;
  p.input = p.scheme.activation.format;
  return p;
}

Selection select_on(const GemmProblem& p, const GpuLimits& gpu, const std::string& forced = "") {
  SelectionContext context;
  context.gpu = gpu;
  context.rates = GpuRates::of(gpu);
  context.forced = forced;
  return select(p, p.max_rows(), WeightFacts::of_scheme(p.scheme, p.n, p.k, gpu.arch), context);
}

const Verdict& verdict_of(const Selection& s, std::string_view name) {
  for (const Verdict& v : s.verdicts)
    if (v.candidate->name == name) return v;
  throw std::runtime_error("no candidate " + std::string(name));
}

layout::MmaWeight wgmma_weight(const std::string& scheme, std::int64_t n, std::int64_t k) {
  return *WeightFacts::of_scheme(parse_scheme(scheme), n, k, jit::Arch::sm_90a).wgmma;
}

// The selector ranks the family on sm_90a unless QGEMM_WGMMA=0, and takes it where it measured
// fastest (H100, bench/NOTES.md, SM90 wgmma, second session: w4a16 M = 64 and 256 on
// 28672×8192 at 89.8 / 186 µs against 227 / 865 for mma.sync and 170 / 189 for cuBLAS); the
// held-back designs and a switched-off family serve forced runs only; off sm_90a it never serves.
TEST(WgmmaFamily, IsRankedOnSm90UnlessSwitchedOff) {
  const GemmProblem p = problem_of("w4a16", 64, 28672, 8192);
  {
    test::ScopedEnv unset("QGEMM_WGMMA", nullptr);
    for (std::int64_t m : {64, 256}) {
      const Selection s = select_on(problem_of("w4a16", m, 28672, 8192), kH200);
      EXPECT_EQ(s.chosen().candidate->path, Path::Wgmma) << "M = " << m;
    }
    const Selection s = select_on(p, kH200);
    EXPECT_TRUE(verdict_of(s, "wgmma-64").rejected.empty()) << verdict_of(s, "wgmma-64").rejected;
    EXPECT_GT(verdict_of(s, "wgmma-64").cost.total_us, 0.0);
    for (const WgmmaConfig& config : wgmma_configs())
      if (!config.held_back.empty())
        EXPECT_EQ(verdict_of(s, config.name).rejected,
                  config.held_back + " (a forced run takes it)")
            << config.name;
    EXPECT_EQ(select_on(p, kH200, "wgmma-64-tx").chosen().candidate->name, "wgmma-64-tx");
    const Selection ada = select_on(p, GpuLimits::of_arch(jit::Arch::sm_89, 128));
    EXPECT_NE(verdict_of(ada, "wgmma-64").rejected.find("sm_90a"), std::string::npos)
        << verdict_of(ada, "wgmma-64").rejected;
    EXPECT_NE(ada.chosen().candidate->path, Path::Wgmma);
  }
  {
    test::ScopedEnv off("QGEMM_WGMMA", "0");
    const Selection s = select_on(p, kH200);
    for (const WgmmaConfig& config : wgmma_configs())
      EXPECT_EQ(verdict_of(s, config.name).rejected, kWgmmaSwitchedOff) << config.name;
    EXPECT_NE(s.chosen().candidate->path, Path::Wgmma);
    const Selection forced = select_on(p, kH200, "wgmma-64");
    EXPECT_EQ(forced.chosen().candidate->name, "wgmma-64");
    EXPECT_GT(forced.winner_us, 0.0);
  }
}

// The rules: 16-bit operands only, a token block at most twice the rows it serves, groups that
// the tile can hold, shared memory within the block limit.
TEST(WgmmaFamily, RulesNameWhatTheKernelCannotHold) {
  const layout::MmaWeight w = wgmma_weight("w4a16", 8192, 8192);
  const WgmmaConfig* c8 = &wgmma_configs().front();
  const WgmmaConfig* c256 = &wgmma_configs()[5];
  ASSERT_EQ(c8->name, "wgmma-8");
  ASSERT_EQ(c256->name, "wgmma-256");
  EXPECT_FALSE(c8->unsupported_reason(1, w, formats::bf16, kH200));
  EXPECT_FALSE(c8->unsupported_reason(4096, w, formats::fp16, kH200));
  EXPECT_NE(c8->unsupported_reason(1, w, formats::e4m3, kH200).value_or("").find("bf16/fp16"),
            std::string::npos);
  EXPECT_NE(c256->unsupported_reason(128, w, formats::bf16, kH200).value_or("").find("half"),
            std::string::npos);
  EXPECT_FALSE(c256->unsupported_reason(129, w, formats::bf16, kH200));
  // The mma fragment order is not the wgmma order.
  const layout::MmaWeight mma =
      *WeightFacts::of_scheme(parse_scheme("w4a16"), 8192, 8192, jit::Arch::sm_90a).mma;
  EXPECT_NE(c8->unsupported_reason(1, mma, formats::bf16, kH200).value_or("").find("order"),
            std::string::npos);
  for (const WgmmaConfig& config : wgmma_configs())
    EXPECT_LE(config.shared_bytes(w, kH200), kH200.shared_per_block) << config.name;
}

// Every 64-K chunk belongs to exactly one split, a split holds whole stages, the grid never
// exceeds the SMs, and the blocks cover N and M.
TEST(WgmmaFamily, LaunchesCoverTheProblemExactlyOnce) {
  for (const char* scheme : {"w4a16", "w8a16", "mxfp4-a16", "w=uint3:g64:s=bf16:zp=int;a=bf16",
                             "w4a8-fp8", "w8a8-fp8", "w=uint4:g64:s=fp16:zp=mid;a=e4m3:tok"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {640, 640},
                        {5472, 2880},
                        {4000, 10944}})
      for (const WgmmaConfig& config : wgmma_configs())
        for (std::int64_t m : {1, 3, 16, 17, 64, 129, 1000, 4096}) {
          const layout::MmaWeight w = wgmma_weight(scheme, n, k);
          const Format operand = config.tile.eight_bit ? config.codes() : formats::bf16;
          if (config.unsupported_reason(m, w, operand, kH200)) continue;
          SCOPED_TRACE(config.name + " " + scheme + " M=" + std::to_string(m) +
                       " N=" + std::to_string(n) + " K=" + std::to_string(k));
          const WgmmaLaunch launch = wgmma_launch(config, m, w, operand, kH200);
          const std::int64_t k_chunks = w.k_blocks / 4;
          ASSERT_GE(launch.splits, 1);
          EXPECT_EQ(launch.chunks_per_split % config.tile.stage_chunks, 0);
          if (wgmma_promotes_scales(config, w, operand) && w.group_size > 0)
            EXPECT_EQ(launch.chunks_per_split % (w.group_size / 64), 0);
          EXPECT_GE(static_cast<std::int64_t>(launch.chunks_per_split) * launch.splits, k_chunks);
          EXPECT_LT(static_cast<std::int64_t>(launch.chunks_per_split) * (launch.splits - 1),
                    k_chunks);
          EXPECT_GE(static_cast<std::int64_t>(launch.n_blocks) * config.block_n(), w.n_padded);
          EXPECT_LT(static_cast<std::int64_t>(launch.n_blocks - 1) * config.block_n(),
                    w.n_padded);
          EXPECT_GE(static_cast<std::int64_t>(launch.m_blocks) * config.block_m(), m);
          EXPECT_LE(launch.grid, static_cast<unsigned>(kH200.sm_count));
          EXPECT_GE(launch.grid, 1u);
          EXPECT_EQ(wgmma_zeroed_bytes(config, launch, w) == 0, launch.splits == 1);
        }
}

// Grouped (MoE) GEMMs: only the wgmma family and the streamed decode kernel read the routing
// (the latter: test_grouped_decode.cpp), a routing block
// its tile does not divide is refused, the launch covers every routing's capacity (in token
// blocks of the config) and its split-K scratch stays bounded.
TEST(WgmmaFamily, GroupedGemmsRunOnTheFamilyOverTheRoutingsCapacity) {
  EXPECT_EQ(grouped_rows_per_expert(8, 128), 1);  // decode: 8 choices, 8 experts
  EXPECT_EQ(grouped_rows_per_expert(32768, 128), 256);
  EXPECT_EQ(grouped_rows_per_expert(300, 1), 300);
  GemmProblem p = problem_of("w4a16", 64 * 8, 1536, 2048);
  p.experts = 128;
  const Selection s = select_on(p, kH200);
  int served = 0;
  for (const Verdict& v : s.verdicts) {
    if (v.candidate->path == Path::MmaStreamed) {
      // The grouped decode kernel (test_grouped_decode.cpp) is ranked beside the tiles (but a
      // config held back).
      EXPECT_TRUE(v.rejected.empty() || v.rejected.find("shared memory") != std::string::npos ||
                  !v.candidate->config->held_back.empty())
          << v.candidate->name << ": " << v.rejected;
    } else if (v.candidate->path != Path::Wgmma) {
      EXPECT_NE(v.rejected.find("grouped (MoE) GEMM runs on the wgmma family"), std::string::npos)
          << v.candidate->name << ": " << v.rejected;
    } else if (v.rejected.empty()) {
      ++served;
    }
  }
  EXPECT_GT(served, 0);
  p.route_block = 16;
  const Selection blocked = select_on(p, kH200);
  EXPECT_NE(verdict_of(blocked, "wgmma-32").rejected.find("not a multiple of its 32-token tile"),
            std::string::npos);
  p.route_block = 48;
  EXPECT_THROW(validate(p), Error);
  for (const WgmmaConfig& config : wgmma_configs())
    for (std::int64_t slots : {1, 8, 512, 32768})
      for (int route_block : {0, 256}) {
        SCOPED_TRACE(config.name + " slots=" + std::to_string(slots) + " route_block=" +
                     std::to_string(route_block));
        const layout::MmaWeight w = wgmma_weight("w4a16", 3072, 2048);
        const WgmmaLaunch launch =
            grouped_wgmma_launch(config, slots, 128, route_block, w, formats::bf16, kH200);
        MoeRoutingShape shape;
        shape.tokens = slots;
        shape.global_experts = shape.local_experts = 128;
        shape.block = route_block > 0 ? route_block : config.block_m();
        EXPECT_EQ(static_cast<std::int64_t>(launch.m_blocks) * config.block_m(),
                  moe_routing_capacity(shape));
        EXPECT_LE(wgmma_zeroed_bytes(config, launch, w), std::size_t{64} << 20);
        EXPECT_GE(static_cast<std::int64_t>(launch.chunks_per_split) * launch.splits,
                  w.k_blocks / 4);
      }
}

// The kernel specs compile for sm_90a without spills or a stack frame: each token width, each
// dequantization (packed16, float16, fp32), stored zero points, split-K and fp16 / fp32 outputs,
// dense and grouped (MoE), with a fused GLU.
TEST(WgmmaFamily, SpecsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  struct Case {
    const char* scheme;
    std::int64_t m;
    const char* config;
    Format output;
    bool grouped = false;
    std::optional<GluKind> glu = std::nullopt;
  };
  const Case cases[] = {
      {"w4a16", 1, "wgmma-8", formats::bf16},
      {"w4a16", 4096, "wgmma-256", formats::bf16},
      {"w=uint4:g128:s=bf16:zp=int;a=bf16", 64, "wgmma-64", formats::bf16},
      {"mxfp4-a16", 16, "wgmma-16", formats::fp32},
      {"w=uint6:g128:s=fp16:zp=float;a=fp16", 32, "wgmma-32", formats::fp16},
      {"w8a16", 256, "wgmma-128", formats::bf16},
      {"w4a16", 1, "wgmma-8-k256", formats::bf16},
      {"w8a16", 16, "wgmma-16-k256", formats::bf16},
      {"w4a16", 1, "wgmma-8-c4", formats::bf16},
      {"w=uint4:g128:s=bf16:zp=int;a=bf16", 8, "wgmma-8-c4", formats::bf16},
      {"w=uint6:g128:s=fp16:zp=float;a=fp16", 1, "wgmma-8-c4", formats::fp16},
      {"mxfp4-a16", 8, "wgmma-8-c4", formats::bf16},
      {"w4a16", 4096, "wgmma-256-tx", formats::bf16},
      {"mxfp4-a16", 256, "wgmma-128-tx", formats::fp32},
      {"w=uint4:g128:s=bf16:zp=int;a=bf16", 64, "wgmma-64-tx", formats::bf16},
      {"w=e4m3:ch:s=fp32;a=bf16;o=bf16", 4096, "wgmma-256-tx", formats::bf16},
      {"w4a16", 1, "wgmma-8", formats::bf16, true},
      {"w4a16", 64, "wgmma-16", formats::fp32, true},
      {"w=uint4:g128:s=bf16:zp=int;a=bf16", 64, "wgmma-32", formats::bf16, true},
      {"mxfp4-a16", 256, "wgmma-64", formats::bf16, true},
      {"w8a16", 256, "wgmma-128", formats::fp32, true},
      {"w4a16", 4096, "wgmma-256", formats::bf16, true},
      // The gate_up GEMM with its GLU fused: each kind, each staging width (8, 16, 32 tokens).
      {"w4a16", 1, "wgmma-8", formats::bf16, true, GluKind::Silu},
      {"w=uint4:g128:s=bf16:zp=int;a=fp16", 64, "wgmma-16", formats::fp16, true, GluKind::Gelu},
      {"mxfp4-a16", 256, "wgmma-64", formats::bf16, true, GluKind::ClampedSwiglu},
      {"w8a16", 256, "wgmma-128", formats::bf16, true, GluKind::Silu},
      {"w4a16", 4096, "wgmma-256", formats::bf16, true, GluKind::ClampedSwiglu},
  };
  for (const Case& c : cases) {
    const Scheme s = parse_scheme(c.scheme);
    const layout::MmaWeight w = wgmma_weight(c.scheme, 8192, 8192);
    const WgmmaConfig* config = nullptr;
    for (const WgmmaConfig& candidate : wgmma_configs())
      if (candidate.name == c.config) config = &candidate;
    ASSERT_NE(config, nullptr);
    const WgmmaLaunch launch = wgmma_launch(*config, c.m, w, s.activation.format, kH200);
    const jit::KernelSpec spec =
        wgmma_spec(*config, launch, w, s.activation.format, c.output, jit::Arch::sm_90a,
                   /*activation_group_scales=*/false, c.grouped, c.glu);
    SCOPED_TRACE(jit::to_string(spec));
    const auto lookup = cache.get(spec);
    EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
    EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
    EXPECT_EQ(lookup.kernel->resources.wgmma_serializations, 0);
  }
}

}  // namespace
}  // namespace qgemm::dispatch

namespace qgemm::dispatch {
namespace {

const WgmmaConfig& config_named(std::string_view name) {
  if (const WgmmaConfig* config = find_wgmma_config(name)) return *config;
  throw std::runtime_error("no config " + std::string(name));
}

// FP8 configs (issue #16) serve e4m3 activation codes with one scale per row against e4m3 or
// 4-bit weights whose values e4m3 holds, in groups of whole chunks; the 16-bit configs keep
// their rules. Each refusal names its cause.
TEST(WgmmaFp8, RulesNameWhatTheFp8TilesCannotHold) {
  const WgmmaConfig& fp8 = config_named("wgmma-fp8-64");
  const WgmmaConfig& bf16 = config_named("wgmma-64");
  const layout::MmaWeight w4 = wgmma_weight("w4a8-fp8", 4096, 4096);
  const layout::MmaWeight e4m3 = wgmma_weight("w8a8-fp8", 4096, 4096);
  EXPECT_FALSE(fp8.unsupported_reason(64, w4, formats::e4m3, kH200));
  EXPECT_FALSE(fp8.unsupported_reason(64, e4m3, formats::e4m3, kH200));
  EXPECT_FALSE(config_named("wgmma-fp8-128").unsupported_reason(4096, w4, formats::e4m3, kH200));
  EXPECT_NE(fp8.unsupported_reason(64, w4, formats::bf16, kH200).value_or("").find("e4m3"),
            std::string::npos);
  EXPECT_NE(bf16.unsupported_reason(64, w4, formats::e4m3, kH200).value_or("").find("bf16/fp16"),
            std::string::npos);
  // Stored zero points: u − zero differs per group, no single table.
  const layout::MmaWeight zp = wgmma_weight("w=uint4:g128:s=bf16:zp=int;a=e4m3:tok", 4096, 4096);
  EXPECT_NE(fp8.unsupported_reason(64, zp, formats::e4m3, kH200).value_or("").find("zero"),
            std::string::npos);
  // 8-bit integers are not exact in e4m3.
  const layout::MmaWeight int8 = wgmma_weight("w=int8:ch:s=fp32;a=e4m3:tok", 4096, 4096);
  EXPECT_NE(fp8.unsupported_reason(64, int8, formats::e4m3, kH200).value_or("").find("bits"),
            std::string::npos);
  // MXFP4's groups of 32 are shorter than a chunk: not promoted per chunk.
  const layout::MmaWeight mx = wgmma_weight("mxfp4-a8", 4096, 4096);
  EXPECT_NE(fp8.unsupported_reason(64, mx, formats::e4m3, kH200).value_or("").find("group"),
            std::string::npos);
  // e2m1 in groups of 64 or more is exact in e4m3 and served.
  const layout::MmaWeight e2m1 = wgmma_weight("w=e2m1:g128:s=bf16;a=e4m3:tok", 4096, 4096);
  EXPECT_FALSE(fp8.unsupported_reason(64, e2m1, formats::e4m3, kH200));
  for (const WgmmaConfig& config : wgmma_configs()) {
    if (!config.tile.eight_bit || config.int8) continue;
    EXPECT_EQ(config.tile.stage_chunks % 2, 0) << config.name;
    EXPECT_LE(config.shared_bytes(e4m3, kH200), kH200.shared_per_block) << config.name;
    EXPECT_TRUE(wgmma_promotes_scales(config, w4, formats::e4m3)) << config.name;
  }
}

// The selector offers the FP8 configs only where the activation codes are their operand: e4m3
// per token (w4a8-fp8, w8a8-fp8) or in fp32 groups of 128 against weight groups of 128
// (fp8-block), not other groups, not 16-bit activations; the verdict's operand is e4m3 and the
// spec names act=e4m3 (act=e4m3_g128 for group scales), dequant=e4m3. The 128-token tile is
// ranked, the narrower ones held back (served when forced).
TEST(WgmmaFp8, SelectorOffersThemForPerTokenE4m3Codes) {
  test::ScopedEnv unset("QGEMM_WGMMA", nullptr);
  for (const char* scheme : {"w4a8-fp8", "w8a8-fp8", "fp8-block"}) {
    const bool groups = std::string_view(scheme) == "fp8-block";
    GemmProblem p = problem_of(scheme, 1024, 8192, 8192);
    p.input = formats::bf16;  // quantized on the GPU into the codes
    const Selection ranked = select_on(p, kH200);
    EXPECT_EQ(verdict_of(ranked, "wgmma-fp8-128").rejected, "");
    EXPECT_NE(verdict_of(ranked, "wgmma-fp8-64").rejected.find("forced"), std::string::npos)
        << verdict_of(ranked, "wgmma-fp8-64").rejected;
    const Selection forced = select_on(p, kH200, "wgmma-fp8-128");
    const Verdict& v = forced.chosen();
    ASSERT_EQ(v.candidate->name, "wgmma-fp8-128");
    EXPECT_EQ(v.operand, formats::e4m3);
    EXPECT_GT(v.cost.total_us, 0.0);
    const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, jit::Arch::sm_90a);
    const CandidateLaunch launch =
        candidate_launch(p, 1024, forced.chosen(), facts, kH200, 0.0);
    ASSERT_TRUE(launch.gemm);
    const std::string text = jit::to_string(*launch.gemm);
    EXPECT_NE(text.find(groups ? "act=e4m3_g128," : "act=e4m3,"), std::string::npos) << text;
    EXPECT_NE(text.find("dequant=e4m3"), std::string::npos) << text;
    EXPECT_EQ(launch.prep, ActivationPrep::Quantize);
    EXPECT_EQ(launch.row_factors, !groups);
    EXPECT_EQ(launch.group_scales, groups);
  }
  // QGEMM_WGMMA_FP8=1 ranks the held-back ones (for gates and benches before it is lifted).
  {
    GemmProblem p = problem_of("w4a8-fp8", 1024, 8192, 8192);
    p.input = formats::bf16;
    const Selection ranked = [&] {
      const test::ScopedEnv fp8_ranked("QGEMM_WGMMA_FP8", "1");
      return select_on(p, kH200);
    }();
    const Verdict& v = verdict_of(ranked, "wgmma-fp8-64");
    EXPECT_TRUE(v.rejected.empty()) << v.rejected;
    EXPECT_GT(v.cost.total_us, 0.0);
  }
  // Weight groups other than the activation's 1x128: refused with the rule.
  {
    GemmProblem p = problem_of("w=int4:g64:s=bf16;a=e4m3:g128;o=bf16", 1024, 8192, 8192);
    p.input = formats::bf16;
    try {
      select_on(p, kH200, "wgmma-fp8-128");
      ADD_FAILURE() << "served weight groups of 64 against activation groups of 128";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("128 too"), std::string::npos) << error.what();
    }
  }
  for (const char* scheme : {"w=e4m3:ch:s=fp32;a=e4m3:g64;o=bf16", "mxfp8-mxfp4", "w4a16"}) {
    GemmProblem p = problem_of(scheme, 1024, 8192, 8192);
    p.input = formats::bf16;
    try {
      select_on(p, kH200, "wgmma-fp8-128");
      ADD_FAILURE() << scheme << ": a forced FP8 config served activations it cannot take";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("e4m3 activation codes"), std::string::npos)
          << scheme << ": " << error.what();
    }
  }
}

// The weight as 8-bit codes in registers (kernels/dequant/wgmma_codes8.cuh), run on the host
// over the prepared words of real weights: every byte of every A register is the e4m3 (FP8
// tiles) or s8 (INT8 tiles) code of the value the layout holds at (row, k) (times its scale,
// the prepared weight's value), and the instruction's K position of that byte is where the
// activation quantizer puts activation k (MmaWeightLayout::operand8_position). The tables of
// the supported 2- and 4-bit formats are exact (2-bit codes widened to nibbles first); so are
// int8's flipped offset codes.
TEST(WgmmaCodes8, FragmentsHoldTheWeightAtThePermutedK) {
  std::mt19937 rng(16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    const char* scheme;
    Format codes;
  };
  for (const Case& c :
       {Case{"w4a8-fp8", formats::e4m3}, Case{"w8a8-fp8", formats::e4m3},
        Case{"w=uint4:g128:s=bf16:zp=mid;a=e4m3:tok", formats::e4m3},
        Case{"w=e2m1:g64:s=e8m0;a=e4m3:tok", formats::e4m3}, Case{"fp8-block", formats::e4m3},
        Case{"w8a8-int8", formats::int8}, Case{"w=int4:g128:s=bf16;a=int8:tok", formats::int8},
        Case{"w=uint4:g64:s=fp16:zp=mid;a=int8:tok", formats::int8},
        Case{"w=uint4:ch:s=fp32;a=int8:tok", formats::int8}, Case{"bitnet", formats::int8},
        Case{"w=uint2:g128:s=bf16:zp=mid;a=int8:tok", formats::int8},
        Case{"w=uint2:g64:s=bf16:zp=mid;a=e4m3:tok", formats::e4m3}}) {
    SCOPED_TRACE(c.scheme);
    const Scheme s = parse_scheme(c.scheme);
    const std::int64_t n = 128, k = 256;
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    const layout::MmaWeight prepared = layout::repack_for_mma(
        quantize_weight(s.weight, w.data(), n, k), layout::FragmentOrder::Wgmma);
    ASSERT_FALSE(wgmma_codes8_weight_unsupported(prepared, c.codes));
    const int bits = prepared.format.bits;
    const unsigned long long format = jit::packed_format_code(prepared.format);
    const bool constant_zero = prepared.zero_mode == layout::MmaZeroMode::Constant;
    const int target = c.codes == formats::int8 ? kernels::kCodes8S8 : kernels::kCodes8E4m3;
    ASSERT_TRUE(kernels::wgmma_codes8_exact(format, constant_zero, target));
    const kernels::WgmmaCodes8Table table =
        kernels::wgmma_codes8_table(format, constant_zero, target);
    const std::int64_t k_chunks = prepared.k_blocks / 4;
    int checked = 0;
    for (std::int64_t tile = 0; tile < prepared.n_padded / 64; ++tile)
      for (std::int64_t chunk = 0; chunk < k_chunks; ++chunk)
        for (int thread = 0; thread < 128; ++thread) {
          const long long at =
              kernels::WgmmaWeightLayout::word_index(tile, chunk, k_chunks, thread, bits);
          unsigned frag[2][4] = {};
          if (bits == 2) {
            unsigned words[2];
            for (int i = 0; i < 2; ++i) words[i] = prepared.words[static_cast<std::size_t>(at + i)];
            kernels::wgmma_codes8_fragments<2>(words, table, frag);
          } else if (bits == 4) {
            unsigned words[4];
            for (int i = 0; i < 4; ++i) words[i] = prepared.words[static_cast<std::size_t>(at + i)];
            kernels::wgmma_codes8_fragments<4>(words, table, frag);
          } else {
            unsigned words[8];
            for (int i = 0; i < 8; ++i) words[i] = prepared.words[static_cast<std::size_t>(at + i)];
            kernels::wgmma_codes8_fragments<8>(words, table, frag);
          }
          for (int step = 0; step < 2; ++step)
            for (int r = 0; r < 4; ++r)
              for (int v = 0; v < 4; ++v) {
                const std::int64_t row = tile * 64 + kernels::wgmma_codes8_row(thread, r);
                const int k_in_chunk = kernels::wgmma_codes8_k(thread, step, r, v);
                const std::int64_t kk = chunk * 64 + k_in_chunk;
                // The instruction's k of this byte (ptx/wgmma.cuh, the 8-bit A layout).
                const int instruction_k = 32 * step + 16 * (r >> 1) + 4 * (thread % 4) + v;
                ASSERT_EQ(kernels::MmaWeightLayout::operand8_position(k_in_chunk), instruction_k)
                    << "thread " << thread << " step " << step << " r " << r << " v " << v;
                if (row >= n || kk >= k) continue;
                const unsigned byte = (frag[step][r] >> (8 * v)) & 0xFFu;
                const double code_value = target == kernels::kCodes8S8
                                              ? static_cast<double>(static_cast<std::int8_t>(byte))
                                              : decode(formats::e4m3, byte);
                const int group = prepared.group_size == 0 ? 0 : static_cast<int>(kk / prepared.group_size);
                const double scale = prepared.scales[static_cast<std::size_t>(
                    group * prepared.n_padded + kernels::WgmmaWeightLayout::scale_column(row))];
                ASSERT_EQ(code_value * scale * prepared.global_scale,
                          layout::mma_weight_value(prepared, row, kk))
                    << "row " << row << " k " << kk;
                ++checked;
              }
        }
    EXPECT_EQ(checked, n * k);
  }
  // What each type cannot hold: e2m1's halves in s8, uint8's 128..255 without a zero point in
  // s8, int8 in e4m3; stored zero points in either.
  const auto refused = [](const char* scheme, const Format& codes) {
    const Scheme s = parse_scheme(scheme);
    std::vector<float> w(64 * 64, 0.5f);
    return wgmma_codes8_weight_unsupported(
        layout::repack_for_mma(quantize_weight(s.weight, w.data(), 64, 64),
                               layout::FragmentOrder::Wgmma),
        codes);
  };
  EXPECT_NE(refused("w=e2m1:g64:s=e8m0;a=int8:tok", formats::int8).value_or("").find("integer"),
            std::string::npos);
  EXPECT_NE(refused("w=uint8:ch:s=fp32;a=int8:tok", formats::int8).value_or("").find("exact"),
            std::string::npos);
  EXPECT_NE(refused("w8a8-int8", formats::e4m3).value_or("").find("bits"), std::string::npos);
  EXPECT_NE(refused("w=uint4:g64:s=fp16:zp=int;a=int8:tok", formats::int8)
                .value_or("")
                .find("stored zero points"),
            std::string::npos);
}

// The selector offers the INT8 configs for int8 codes with one scale per row (w8a8-int8, int4 ×
// int8), ranked and held back as the FP8 ones, with act=int8 and dequant=s8 specs; they refuse
// e4m3 codes and 16-bit activations, and the FP8 configs refuse int8 codes.
TEST(WgmmaInt8, SelectorOffersThemForPerTokenInt8Codes) {
  test::ScopedEnv unset("QGEMM_WGMMA", nullptr);
  for (const char* scheme : {"w8a8-int8", "w=int4:g128:s=bf16;a=int8:tok;o=bf16"}) {
    SCOPED_TRACE(scheme);
    GemmProblem p = problem_of(scheme, 1024, 8192, 8192);
    p.input = formats::bf16;
    const Selection ranked = select_on(p, kH200);
    EXPECT_EQ(verdict_of(ranked, "wgmma-int8-128").rejected, "");
    EXPECT_NE(verdict_of(ranked, "wgmma-int8-64").rejected.find("forced"), std::string::npos)
        << verdict_of(ranked, "wgmma-int8-64").rejected;
    {
      const test::ScopedEnv rank_eight_bit("QGEMM_WGMMA_FP8", "1");  // past the hold
      const Selection all = select_on(p, kH200);
      EXPECT_NE(verdict_of(all, "wgmma-fp8-128").rejected.find("e4m3 activation codes"),
                std::string::npos)
          << verdict_of(all, "wgmma-fp8-128").rejected;
      EXPECT_EQ(verdict_of(all, "wgmma-int8-128").rejected, "");
    }
    const Selection forced = select_on(p, kH200, "wgmma-int8-128");
    const Verdict& v = forced.chosen();
    ASSERT_EQ(v.candidate->name, "wgmma-int8-128");
    EXPECT_EQ(v.operand, formats::int8);
    const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, jit::Arch::sm_90a);
    const CandidateLaunch launch = candidate_launch(p, 1024, v, facts, kH200, 0.0);
    ASSERT_TRUE(launch.gemm);
    const std::string text = jit::to_string(*launch.gemm);
    EXPECT_NE(text.find("act=int8"), std::string::npos) << text;
    EXPECT_NE(text.find("dequant=s8"), std::string::npos) << text;
  }
  const test::ScopedEnv rank_eight_bit("QGEMM_WGMMA_FP8", "1");
  GemmProblem fp8 = problem_of("w4a8-fp8", 1024, 8192, 8192);
  fp8.input = formats::bf16;
  EXPECT_NE(verdict_of(select_on(fp8, kH200), "wgmma-int8-128").rejected.find("int8 activation"),
            std::string::npos)
      << verdict_of(select_on(fp8, kH200), "wgmma-int8-128").rejected;
}

// Where the ranked 8-bit tiles win, the model picks them, and nowhere else: the winners measured
// on an H100 (bench/NOTES.md, twelfth session, `qgemm_dense_bench --fp8`: every config forced
// against the choice, qdq and cuBLASLt FP8; µs).
TEST(WgmmaEightBit, SelectionFollowsTheMeasuredWinners) {
  test::ScopedEnv unset("QGEMM_WGMMA", nullptr);
  test::ScopedEnv not_ranked("QGEMM_WGMMA_FP8", nullptr);
  struct Case {
    const char* scheme;
    std::int64_t m, n, k;
    const char* winner;  // the measured fastest, or "" for: not an 8-bit wgmma tile
  };
  const Case cases[] = {
      // int8-128 65.8 against the 16-bit wgmma-256's 80.8, qdq 163.1
      {"w8a8-int8", 256, 8192, 8192, "wgmma-int8-128"},
      // int8-128 75.0 against 82.5 and 150.9
      {"w=int4:g128:s=bf16;a=int8:tok;o=bf16", 256, 8192, 8192, "wgmma-int8-128"},
      // fp8-128 75.5 against 83.8 and 151.3
      {"w4a8-fp8", 256, 8192, 8192, "wgmma-fp8-128"},
      // qdq 812.0 / 791.8 / 797.6 against the 128-token tiles' 907.2 / 1002.7 / 972.4
      {"w8a8-int8", 4096, 8192, 8192, ""},
      {"w=int4:g128:s=bf16;a=int8:tok;o=bf16", 4096, 8192, 8192, ""},
      {"w4a8-fp8", 4096, 8192, 8192, ""},
      // the decode kernel 31.8 against wgmma-fp8-16's 39.1
      {"w4a8-fp8", 16, 8192, 8192, ""},
      // cuBLASLt FP8 39.3 / 400.3 against 60.0 / 772.6; fp8-block 73.9 / 914.0 against 162.4 /
      // 2144.6
      {"w8a8-fp8", 256, 8192, 8192, "cublaslt-fp8"},
      {"w8a8-fp8", 4096, 8192, 8192, "cublaslt-fp8"},
      {"fp8-block", 256, 7168, 18432, "cublaslt-fp8"},
      {"fp8-block", 4096, 7168, 18432, "cublaslt-fp8"},
  };
  for (const Case& c : cases) {
    GemmProblem p = problem_of(c.scheme, c.m, c.n, c.k);
    p.input = formats::bf16;
    const Selection s = select_on(p, kH200);
    const Candidate& chosen = *s.chosen().candidate;
    SCOPED_TRACE(std::string(c.scheme) + " M = " + std::to_string(c.m) + ": " + chosen.name);
    if (*c.winner)
      EXPECT_EQ(chosen.name, c.winner);
    else
      EXPECT_FALSE(chosen.wgmma && chosen.wgmma->tile.eight_bit);
  }  // Grouped, the 8-bit tiles are forced only (not yet measured): unforced, refused by name.
  GemmProblem grouped = problem_of("w4a8-fp8", 32768, 1536, 2048);
  grouped.input = formats::bf16;
  grouped.experts = 128;
  const Selection s = select_on(grouped, kH200);
  EXPECT_NE(verdict_of(s, "wgmma-fp8-128").rejected.find("grouped"), std::string::npos)
      << verdict_of(s, "wgmma-fp8-128").rejected;
}

// One forced 8-bit config against one scheme's weight and M.
struct ForcedSpecCase {
  const char* scheme;
  std::int64_t m, n, k;
  const char* config;
  Format output;
};

// `spec` compiles for sm_90a without spills, a stack frame or wgmma that ptxas had to
// serialize (and its registers are printed).
void expect_compiles_clean(jit::KernelCache& cache, const jit::KernelSpec& spec) {
  SCOPED_TRACE(jit::to_string(spec));
  const auto lookup = cache.get(spec);
  ASSERT_TRUE(lookup.kernel);
  EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
  EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
  EXPECT_EQ(lookup.kernel->resources.wgmma_serializations, 0);
  std::printf("%s: %d registers, %d spill bytes\n", jit::to_string(spec).c_str(),
              lookup.kernel->resources.registers, lookup.kernel->resources.spill_bytes());
}

// Each case's spec (its config forced, `codes` activation codes) compiles clean.
void expect_forced_specs_compile_clean(const Format& codes,
                                       const std::vector<ForcedSpecCase>& cases) {
  jit::KernelCache cache(jit::CacheConfig{});
  for (const ForcedSpecCase& c : cases) {
    const layout::MmaWeight w = wgmma_weight(c.scheme, c.n, c.k);
    const WgmmaConfig& config = config_named(c.config);
    ASSERT_FALSE(config.unsupported_reason(c.m, w, codes, kH200)) << c.config;
    const WgmmaLaunch launch = wgmma_launch(config, c.m, w, codes, kH200);
    expect_compiles_clean(cache, wgmma_spec(config, launch, w, codes, c.output, jit::Arch::sm_90a));
  }
}

// The grouped (MoE) 8-bit specs, as Engine::moe's forced gate_up GEMM launches them (per-token
// e4m3 and int8 codes, 1x128-group e4m3 codes; with and without a fused GLU), compile for sm_90a
// without spills, a stack frame or serialized wgmma.
TEST(WgmmaEightBit, GroupedSpecsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  struct Case {
    const char* scheme;
    const char* config;
    Format codes;
    bool groups;
    std::optional<GluKind> glu;
  };
  for (const Case& c :
       {Case{"w4a8-fp8", "wgmma-fp8-128", formats::e4m3, false, GluKind::Silu},
        Case{"fp8-block", "wgmma-fp8-128", formats::e4m3, true, GluKind::Silu},
        Case{"fp8-block", "wgmma-fp8-128", formats::e4m3, true, std::nullopt},
        Case{"w8a8-int8", "wgmma-int8-128", formats::int8, false, GluKind::ClampedSwiglu}}) {
    const layout::MmaWeight w = wgmma_weight(c.scheme, 4096, 7168);
    const WgmmaConfig& config = config_named(c.config);
    const WgmmaLaunch launch = grouped_wgmma_launch(config, 32768, 256, 0, w, c.codes, kH200);
    expect_compiles_clean(cache, wgmma_spec(config, launch, w, c.codes, formats::bf16,
                                            jit::Arch::sm_90a, c.groups, true, c.glu));
  }
}

// Every INT8 spec compiles for sm_90a without spills or a stack frame: each token width, 2-, 4-
// and 8-bit weights (bitnet's ternary included), groups, channel and tensor scales, split-K,
// fp16 / fp32 outputs.
TEST(WgmmaInt8, SpecsCompileWithoutSpills) {
  expect_forced_specs_compile_clean(
      formats::int8,
      {
          {"w8a8-int8", 1, 8192, 8192, "wgmma-int8-8", formats::bf16},
          {"w8a8-int8", 16, 8192, 8192, "wgmma-int8-16", formats::bf16},
          {"w8a8-int8", 64, 8192, 8192, "wgmma-int8-64", formats::fp16},
          {"w8a8-int8", 4096, 8192, 8192, "wgmma-int8-128", formats::bf16},
          {"w8a8-int8", 16, 28672, 8192, "wgmma-int8-16-k256", formats::fp32},
          {"w=int4:g128:s=bf16;a=int8:tok;o=bf16", 1, 8192, 8192, "wgmma-int8-8-k256",
           formats::bf16},
          {"w=int4:g128:s=bf16;a=int8:tok;o=bf16", 32, 8192, 8192, "wgmma-int8-32", formats::bf16},
          {"w=int4:g128:s=bf16;a=int8:tok;o=bf16", 4096, 8192, 8192, "wgmma-int8-128",
           formats::bf16},
          {"w=uint4:g64:s=fp16:zp=mid;a=int8:tok;o=fp16", 256, 8192, 8192, "wgmma-int8-128",
           formats::fp16},
          {"bitnet", 1, 8192, 8192, "wgmma-int8-8", formats::bf16},
          {"bitnet", 4096, 8192, 8192, "wgmma-int8-128", formats::bf16},
          {"w=uint2:g128:s=bf16:zp=mid;a=int8:tok;o=bf16", 64, 8192, 8192, "wgmma-int8-64",
           formats::bf16},
      });
}

// Every FP8 spec the selector can choose compiles for sm_90a without spills or a stack frame:
// each token width, 4-bit and e4m3 weights, e2m1, split-K, fp16 / fp32 outputs, channel scales.
TEST(WgmmaFp8, SpecsCompileWithoutSpills) {
  expect_forced_specs_compile_clean(
      formats::e4m3,
      {
          {"w4a8-fp8", 1, 8192, 8192, "wgmma-fp8-8", formats::bf16},
          {"w4a8-fp8", 16, 8192, 8192, "wgmma-fp8-16", formats::bf16},
          {"w4a8-fp8", 32, 8192, 8192, "wgmma-fp8-32", formats::fp16},
          {"w4a8-fp8", 64, 8192, 8192, "wgmma-fp8-64", formats::bf16},
          {"w4a8-fp8", 4096, 8192, 8192, "wgmma-fp8-128", formats::bf16},
          {"w4a8-fp8", 1, 8192, 8192, "wgmma-fp8-8-k256", formats::bf16},
          {"w4a8-fp8", 16, 28672, 8192, "wgmma-fp8-16-k256", formats::fp32},
          {"w8a8-fp8", 1, 8192, 8192, "wgmma-fp8-8", formats::bf16},
          {"w8a8-fp8", 64, 8192, 8192, "wgmma-fp8-64", formats::bf16},
          {"w8a8-fp8", 4096, 8192, 8192, "wgmma-fp8-128", formats::bf16},
          {"w8a8-fp8", 16, 8192, 8192, "wgmma-fp8-16-k256", formats::fp16},
          {"w=e2m1:g64:s=e8m0;a=e4m3:tok", 256, 8192, 8192, "wgmma-fp8-128", formats::bf16},
          {"w=e2m1:g128:s=bf16;a=e4m3:tok", 32, 8192, 8192, "wgmma-fp8-32", formats::bf16},
          {"w=uint4:g128:s=bf16:zp=mid;a=e4m3:tok", 8, 8192, 8192, "wgmma-fp8-8", formats::bf16},
      });
}

}  // namespace
}  // namespace qgemm::dispatch

namespace qgemm::dispatch {
namespace {

// fp8-block on the FP8 tiles (e4m3 128x128 weight blocks × 1x128 activation groups, both
// promoted per group): every kernel a forced FP8 config launches compiles for sm_90a, the GEMM
// without spills or a stack frame at each token width, split-K included, and the activation
// step (quantize into operand8 codes + group scales, or expand pre-quantized codes) too.
TEST(WgmmaFp8, BlockScaledSpecsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  struct Case {
    std::int64_t m, n, k;
    const char* config;
    bool prequantized;
  };
  const Case cases[] = {
      {1, 7168, 18432, "wgmma-fp8-8", false},       {16, 7168, 18432, "wgmma-fp8-16", true},
      {32, 7168, 18432, "wgmma-fp8-32", false},     {64, 7168, 18432, "wgmma-fp8-64", false},
      {4096, 7168, 18432, "wgmma-fp8-128", true},   {1, 7168, 18432, "wgmma-fp8-8-k256", false},
      {16, 4000, 2880, "wgmma-fp8-16-k256", false},
  };
  for (const Case& c : cases) {
    GemmProblem p = problem_of("fp8-block", c.m, c.n, c.k);
    p.input = formats::bf16;
    p.prequantized = c.prequantized;
    const Selection forced = select_on(p, kH200, c.config);
    const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, jit::Arch::sm_90a);
    const CandidateLaunch launch = candidate_launch(p, c.m, forced.chosen(), facts, kH200, 0.0);
    ASSERT_TRUE(launch.group_scales);
    ASSERT_EQ(launch.prep, c.prequantized ? ActivationPrep::Expand : ActivationPrep::Quantize);
    for (const jit::KernelSpec& spec : launch.specs()) {
      SCOPED_TRACE(jit::to_string(spec));
      const auto lookup = cache.get(spec);
      EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
      EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
      EXPECT_EQ(lookup.kernel->resources.wgmma_serializations, 0);
      std::printf("%s: %d registers, %d spill bytes\n", jit::to_string(spec).c_str(),
                  lookup.kernel->resources.registers, lookup.kernel->resources.spill_bytes());
    }
  }
}

}  // namespace
}  // namespace qgemm::dispatch
