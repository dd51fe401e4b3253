// The grouped (MoE) mode of the streamed mma.sync decode kernel (issue #17; gemm/sm80_decode.cuh,
// kGrouped) without a GPU: its specs compile with no local memory for sm_80 and sm_90a, the
// selector serves it wherever the experts keep the mma layout and ranks it against wgmma as an
// H100 measured, and its launch covers a routing's capacity in token blocks that divide the
// routing block.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dispatch/candidate_launch.hpp"
#include "dispatch/mma_family.hpp"
#include "dispatch/select.hpp"
#include "dispatch/wgmma_family.hpp"
#include "jit/cache.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"
#include "qgemm/moe.hpp"
#include "qgemm/plan.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"
#include "scoped_env.hpp"

namespace qgemm::dispatch {
namespace {

const GpuLimits kH200 = GpuLimits::of_arch(jit::Arch::sm_90a, 132);
const GpuLimits kA100 = GpuLimits::of_arch(jit::Arch::sm_80, 108);
const GpuLimits kAda = GpuLimits::of_arch(jit::Arch::sm_89, 128);

// A grouped problem of `tokens` · `top_k` routed slots over `experts` experts of [n, k].
GemmProblem grouped_problem(const std::string& scheme, std::int64_t tokens, int top_k, int experts,
                            std::int64_t n, std::int64_t k) {
  GemmProblem p;
  p.scheme = parse_scheme(scheme);
  p.m = tokens * top_k;
  p.n = n;
  p.k = k;
  p.input = p.scheme.activation.format;
  p.experts = experts;
  return p;
}

// Expert weights as prepare_experts keeps them with ExpertLayout::Mma (the mma layout only) or
// ::Wgmma (the wgmma order only).
WeightFacts experts_in(layout::FragmentOrder order, const GemmProblem& p, const GpuLimits& gpu) {
  return expert_facts(WeightFacts::of_scheme(p.scheme, p.n, p.k, gpu.arch), order, std::nullopt,
                      "expert weights keep one order");
}
WeightFacts mma_experts(const GemmProblem& p, const GpuLimits& gpu) {
  return experts_in(layout::FragmentOrder::Mma, p, gpu);
}

// The engine's selection of a grouped problem: the grouped view at the problem's slots.
Selection select_grouped(const GemmProblem& p, const WeightFacts& facts, const GpuLimits& gpu,
                         const std::string& forced = "") {
  SelectionContext context;
  context.gpu = gpu;
  context.rates = GpuRates::of(gpu);
  context.forced = forced;
  const GroupedView view = grouped_view(p, facts, p.max_rows());
  return select(view.problem, view.m, view.weight, context);
}

const Verdict& verdict_of(const Selection& s, std::string_view name) {
  for (const Verdict& v : s.verdicts)
    if (v.candidate->name == name) return v;
  throw std::runtime_error("no candidate " + std::string(name));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Served wherever the experts keep the mma layout: unforced, a streamed config is chosen on
// every arch (off SM90 it is the only grouped kernel), every streamed config serves or names the
// shared memory it lacks (decode-w8's 8 warps on SM89's 99 KB), the tiled ones name the rule, and
// a forced one is taken. With the wgmma order only (prepare_experts' default on SM90) the
// streamed configs find no mma layout.
TEST(GroupedDecode, ServesEveryArchWhereTheExpertsKeepTheMmaLayout) {
  // Qwen3-30B-A3B's gate_up at M = 1: 8 slots over 128 experts of 1536 x 2048.
  const GemmProblem p = grouped_problem("w4a16", 1, 8, 128, 1536, 2048);
  for (const GpuLimits& gpu : {kH200, kA100, kAda}) {
    SCOPED_TRACE(jit::arch_name(gpu.arch));
    const WeightFacts facts = mma_experts(p, gpu);
    const Selection ranked = select_grouped(p, facts, gpu);
    EXPECT_EQ(ranked.chosen().candidate->path, Path::MmaStreamed);
    for (const MmaConfig& config : mma_configs()) {
      const std::string& why = verdict_of(ranked, config.name).rejected;
      if (!config.held_back.empty())
        EXPECT_TRUE(contains(why, "held back")) << config.name << ": " << why;
      else if (config.kernel == MmaKernel::Streamed)
        EXPECT_TRUE(why.empty() || contains(why, "shared memory")) << config.name << ": " << why;
      else
        EXPECT_TRUE(contains(why, "streamed decode kernel")) << config.name << ": " << why;
    }
    EXPECT_TRUE(verdict_of(ranked, "decode").rejected.empty());
    const Selection forced = select_grouped(p, facts, gpu, "decode-k64");
    EXPECT_EQ(forced.chosen().candidate->name, "decode-k64");
    // A held-back config serves when forced.
    EXPECT_EQ(select_grouped(p, facts, gpu, "decode-w2").chosen().candidate->name, "decode-w2");
    EXPECT_EQ(forced.reason, "forced by the caller");
    EXPECT_GT(forced.winner_us, 0.0);
    EXPECT_TRUE(contains(forced.chosen().cost.note, "grouped: 8 rows a token block"))
        << forced.chosen().cost.note;
  }
  // SM90's auto layout keeps the wgmma order only: the streamed kernel reads it (its spec says
  // so), unforced unless QGEMM_WGMMA_ORDER_READERS=0 switches that off (then only forced); the
  // tiled ones still name the grouped rule.
  const WeightFacts wgmma_only = experts_in(layout::FragmentOrder::Wgmma, p, kH200);
  {
    test::ScopedEnv off("QGEMM_WGMMA_ORDER_READERS", "0");
    const Selection s = select_grouped(p, wgmma_only, kH200);
    EXPECT_EQ(s.chosen().candidate->path, Path::Wgmma);
    EXPECT_TRUE(contains(verdict_of(s, "decode").rejected, "QGEMM_WGMMA_ORDER_READERS=0"));
    const Selection forced = select_grouped(p, wgmma_only, kH200, "decode");
    EXPECT_EQ(forced.chosen().candidate->name, "decode");
  }
  test::ScopedEnv by_default("QGEMM_WGMMA_ORDER_READERS", nullptr);
  const Selection s = select_grouped(p, wgmma_only, kH200);
  EXPECT_EQ(s.chosen().candidate->path, Path::MmaStreamed);
  EXPECT_TRUE(verdict_of(s, "decode").rejected.empty()) << verdict_of(s, "decode").rejected;
  EXPECT_TRUE(contains(verdict_of(s, "medium").rejected, "streamed decode kernel"));
  const CandidateLaunch launch = candidate_launch(p, p.m, s.chosen(), wgmma_only, kH200, 0.0);
  ASSERT_TRUE(launch.gemm);
  EXPECT_EQ(launch.mma.order, layout::FragmentOrder::Wgmma);
  EXPECT_EQ(launch.gemm->param("order").choice, "wgmma");
  const CandidateLaunch in_mma =
      candidate_launch(p, p.m, select_grouped(p, mma_experts(p, kH200), kH200).chosen(),
                       mma_experts(p, kH200), kH200, 0.0);
  EXPECT_EQ(in_mma.gemm->param("order").choice, "mma");
}

// Where both kernels could serve (both layouts), the ranking follows what an H100 measured
// (bench/NOTES.md, "Grouped decode", qgemm_moe_bench --decode against the wgmma run, graph-timed):
// the Qwen3-30B-A3B w4a16 gate_up GEMM (1536 x 2048) took 12.5 / 26.7 / 59.7 / 83.6 us on the
// grouped decode kernel against 14.1 / 31.4 / 65.6 / 108.2 on wgmma-8 at 1 / 4 / 16 / 64 tokens;
// its down GEMM (2048 x 768, K short: 192 a warp) 45.0 / 63.2 against 40.1 / 61.2 at 16 / 64 (at
// 1 and 4 tokens the two are within 2 %, not asserted).
TEST(GroupedDecode, RankedAgainstWgmmaAsMeasured) {
  auto chosen_path = [](std::int64_t tokens, std::int64_t n, std::int64_t k) {
    const GemmProblem p = grouped_problem("w4a16", tokens, 8, 128, n, k);
    const Selection s = select_grouped(p, WeightFacts::of_scheme(p.scheme, n, k, kH200.arch), kH200);
    std::printf("Qwen3 %s M=%lld: %s %.1f us (%s)\n", k == 2048 ? "gate_up" : "down",
                static_cast<long long>(tokens), s.chosen().candidate->name.c_str(), s.winner_us,
                s.chosen().cost.note.c_str());
    return s.chosen().candidate->path;
  };
  for (std::int64_t tokens : {1, 4, 16, 64})
    EXPECT_EQ(chosen_path(tokens, 1536, 2048), Path::MmaStreamed) << "gate_up M=" << tokens;
  for (std::int64_t tokens : {16, 64})
    EXPECT_EQ(chosen_path(tokens, 2048, 768), Path::Wgmma) << "down M=" << tokens;
}

// The token block follows the rows an expert expects (8 up to 8, else 16) and divides a routing
// block the caller fixed; a routing block it cannot divide is refused with the rule.
TEST(GroupedDecode, TokenBlocksDivideTheRoutingBlock) {
  EXPECT_EQ(grouped_decode_rows(1, 0), 8);
  EXPECT_EQ(grouped_decode_rows(8, 0), 8);
  EXPECT_EQ(grouped_decode_rows(9, 0), 16);
  EXPECT_EQ(grouped_decode_rows(300, 0), 16);
  EXPECT_EQ(grouped_decode_rows(12, 8), 8);    // the down GEMM of an 8-row gate_up
  EXPECT_EQ(grouped_decode_rows(12, 64), 16);  // a wgmma-64 routing: 4 token blocks a route
  EXPECT_EQ(grouped_decode_rows(3, 16), 8);
  GemmProblem p = grouped_problem("w4a16", 1, 8, 128, 1536, 2048);
  p.route_block = 16;
  const Selection s = select_grouped(p, mma_experts(p, kH200), kH200, "decode");
  EXPECT_TRUE(s.chosen().rejected.empty());
  // route_block 4 is not a valid problem (validate refuses it); the launch names the rule.
  const layout::MmaWeight w = *mma_experts(p, kH200).mma;
  try {
    (void)grouped_mma_launch(*find_mma_config("decode"), 8, 128, 4, w, kH200);
    ADD_FAILURE() << "a routing block of 4 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::Unsupported);
    EXPECT_TRUE(contains(error.what(), "routing block 4")) << error.what();
  }
  EXPECT_THROW((void)grouped_mma_launch(*find_mma_config("medium"), 8, 128, 0, w, kH200), Error);
}

// The launch: one split whose warps cover K in whole stages, every slice of one expert in
// grid.x, and grid.y = the routing's capacity in token blocks (what moe_routing_capacity gives
// for the block the plan routes with); the spec is the dense one's with grouped = true.
TEST(GroupedDecode, LaunchCoversTheRoutingsCapacity) {
  for (const char* scheme : {"w4a16", "mxfp4-a16", "w8a16"})
    for (const auto& [n, k] :
         {std::pair<std::int64_t, std::int64_t>{1536, 2048}, {2048, 768}, {720, 360}, {5760, 2880}})
      for (const MmaConfig& config : mma_configs()) {
        if (config.kernel != MmaKernel::Streamed) continue;
        for (std::int64_t slots : {1, 8, 56, 128, 4096})
          for (int route_block : {0, 8, 16, 64}) {
            const GemmProblem p = grouped_problem(scheme, slots, 1, 128, n, k);
            const WeightFacts facts = mma_experts(p, kH200);
            ASSERT_TRUE(facts.mma) << facts.no_mma;
            const layout::MmaWeight& w = *facts.mma;
            if (config.unsupported_reason(16, w, formats::bf16, kH200)) continue;
            SCOPED_TRACE(config.name + " " + scheme + " " + std::to_string(n) + "x" +
                         std::to_string(k) + " slots=" + std::to_string(slots) +
                         " route_block=" + std::to_string(route_block));
            const MmaLaunch launch = grouped_mma_launch(config, slots, 128, route_block, w, kH200);
            ASSERT_TRUE(launch.rows == 8 || launch.rows == 16);
            EXPECT_TRUE(launch.grouped);
            if (route_block > 0) EXPECT_EQ(route_block % launch.rows, 0);
            EXPECT_EQ(launch.splits, 1);
            EXPECT_EQ(launch.blocks_per_warp % config.decode.stage_blocks, 0);
            EXPECT_GE(static_cast<std::int64_t>(launch.blocks_per_warp) * config.decode.warps,
                      w.k_blocks);
            EXPECT_EQ(static_cast<std::int64_t>(launch.grid_x) * 64, w.n_padded);
            EXPECT_EQ(mma_zeroed_bytes(config, launch, slots, w), 0u);
            MoeRoutingShape shape;
            shape.tokens = slots;
            shape.global_experts = shape.local_experts = 128;
            shape.block = route_block > 0 ? route_block : launch.rows;
            const std::int64_t capacity = moe_routing_capacity(shape);
            EXPECT_EQ(capacity % launch.rows, 0);
            EXPECT_EQ(static_cast<std::int64_t>(launch.grid_y(config, capacity)) * launch.rows,
                      capacity);
            EXPECT_LE(launch.grid_y(config, capacity), 65535u);
            const jit::KernelSpec spec =
                mma_spec(config, launch, w, formats::bf16, formats::bf16, jit::Arch::sm_80);
            EXPECT_EQ(spec.param("grouped").value, 1);
            EXPECT_EQ(spec.param("rows").value, launch.rows);
            EXPECT_EQ(spec.param("split_k").value, 0);
          }
      }
  // Dense launches keep grouped = false (and their grid.y of 1).
  const GemmProblem dense = grouped_problem("w4a16", 1, 1, 0, 4096, 4096);
  const layout::MmaWeight w = *WeightFacts::of_scheme(dense.scheme, 4096, 4096, kH200.arch).mma;
  const MmaLaunch launch = mma_launch(*find_mma_config("decode"), 1, w, kH200);
  EXPECT_FALSE(launch.grouped);
  EXPECT_EQ(launch.grid_y(*find_mma_config("decode"), 1), 1u);
  EXPECT_EQ(mma_spec(*find_mma_config("decode"), launch, w, formats::bf16, formats::bf16,
                     jit::Arch::sm_80)
                .param("grouped")
                .value,
            0);
}

// What the engine's plan step launches for a forced grouped decode: the grouped spec, and the
// token block in the kernel text (`qgemm explain` shows it).
TEST(GroupedDecode, CandidateLaunchOfAGroupedProblem) {
  GemmProblem p = grouped_problem("w4a16", 16, 8, 128, 1536, 2048);
  p.candidate = "decode";
  const WeightFacts facts = mma_experts(p, kA100);
  const Selection s = select_grouped(p, facts, kA100, "decode");
  const CandidateLaunch launch = candidate_launch(p, p.m, s.chosen(), facts, kA100, 0.0);
  ASSERT_TRUE(launch.gemm);
  EXPECT_EQ(launch.gemm->family, "dense_decode_sm80");
  EXPECT_EQ(launch.gemm->param("grouped").value, 1);
  EXPECT_TRUE(launch.mma.grouped);
  EXPECT_EQ(launch.prep, ActivationPrep::None);
  // 128 slots over 128 experts: ~81 experts active, ~1.6 rows each: 8-row token blocks.
  EXPECT_EQ(launch.mma.rows, 8);
  EXPECT_TRUE(contains(launch.text(), "token_block=8")) << launch.text();
  // What warm_up compiles ahead is what the plan launches (both judge the grouped view).
  SelectionContext context;
  context.gpu = kA100;
  context.rates = GpuRates::of(kA100);
  context.forced = "decode";
  const std::vector<jit::KernelSpec> specs = problem_specs(p, facts, context);
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs.front(), *launch.gemm);
}

// Every streamed config's grouped instantiation compiles for sm_80 and sm_90a with no spills
// and no stack: the 16-row block (twice the accumulators) for each dequantization (int16,
// int_f32, float16), stored integer and float zeros, fp16 / fp32 outputs, and 8 rows for the
// default config; with a fused GLU (kinds cycled) where the rows out are 16-bit; the dense
// instantiations beside them for the registers' comparison.
TEST(GroupedDecode, SpecsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});  // memory only: always a real compile
  const char* schemes[] = {"w4a16",     "w=uint3:g128:s=bf16:zp=int;a=fp16;o=fp16",
                           "mxfp4-a16", "w=e4m3:ch:s=fp32;a=bf16;o=fp32",
                           "w8a16",     "w=uint4:g64:s=fp16:zp=float;a=fp16;o=bf16"};
  std::vector<float> values(256 * 256);
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : values) x = normal(rng);
  int compiled = 0;
  for (jit::Arch arch : {jit::Arch::sm_80, jit::Arch::sm_90a}) {
    const GpuLimits gpu = GpuLimits::of_arch(arch, 132);
    for (const char* text : schemes) {
      const Scheme scheme = parse_scheme(text);
      const layout::MmaWeight w =
          layout::repack_for_mma(quantize_weight(scheme.weight, values.data(), 256, 256));
      for (const MmaConfig& config : mma_configs()) {
        if (config.kernel != MmaKernel::Streamed) continue;
        if (config.unsupported_reason(16, w, scheme.activation.format, gpu)) continue;
        for (const int rows : {8, 16}) {
          if (rows == 8 && config.name != "decode") continue;
          MmaLaunch launch = grouped_mma_launch(config, rows == 8 ? 8 : 4096, 128, 0, w, gpu);
          ASSERT_EQ(launch.rows, rows);
          const jit::KernelSpec spec =
              mma_spec(config, launch, w, scheme.activation.format, scheme.output, arch);
          SCOPED_TRACE(jit::to_string(spec));
          const auto lookup = cache.get(spec);
          EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
          EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
          EXPECT_GT(lookup.kernel->resources.registers, 0);
          ++compiled;
          std::printf("%-14s %-44s rows %2d %-6s grouped: %3d registers\n", config.name.c_str(),
                      text, rows, jit::arch_name(arch).c_str(), lookup.kernel->resources.registers);
          // The gate_up GEMM with its GLU fused (16-bit rows out): one kind per spec, cycled,
          // so every kind's epilogue compiles across the set without tripling the test's time.
          if (scheme.output.storage_bytes() == 2) {
            const GluKind kinds[] = {GluKind::Silu, GluKind::Gelu, GluKind::ClampedSwiglu};
            const GluKind glu = kinds[compiled % 3];
            const jit::KernelSpec fused =
                mma_spec(config, launch, w, scheme.activation.format, scheme.output, arch, glu);
            SCOPED_TRACE(jit::to_string(fused));
            const auto glu_lookup = cache.get(fused);
            EXPECT_EQ(glu_lookup.kernel->resources.spill_bytes(), 0);
            EXPECT_EQ(glu_lookup.kernel->resources.stack_frame_bytes, 0);
            std::printf("%-14s %-44s rows %2d %-6s %-8s %3d registers\n", config.name.c_str(), text,
                        rows, jit::arch_name(arch).c_str(), glu_kind_name(glu),
                        glu_lookup.kernel->resources.registers);
          }
          if (config.name != "decode") continue;
          // The dense instantiation of the same rows, for the record.
          launch.grouped = false;
          const jit::KernelSpec dense =
              mma_spec(config, launch, w, scheme.activation.format, scheme.output, arch);
          const auto dense_lookup = cache.get(dense);
          std::printf("%-14s %-44s rows %2d %-6s dense:   %3d registers\n", config.name.c_str(),
                      text, rows, jit::arch_name(arch).c_str(),
                      dense_lookup.kernel->resources.registers);
          EXPECT_EQ(dense_lookup.kernel->resources.spill_bytes(), 0);
        }
      }
    }
  }
  EXPECT_GE(compiled, 2 * 6 * 2);
}

// The grouped kernel addresses expert e's codes as slice e · slices + s of the whole and its
// scale (zero) rows as rows e · groups + g (prepare_experts lays the experts back to back): that
// holds only if one expert's mma arrays are exactly whole slices and scale rows, which the host
// twin of the device repack shows here (prepare_experts checks the device's sizes too).
TEST(GroupedDecode, AnExpertsMmaArraysAreWholeSlicesAndScaleRows) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char* text : {"w4a16", "mxfp4-a16", "w8a16", "w=uint4:g128:s=bf16:zp=int;a=bf16",
                           "w=uint3:g64:s=fp16:zp=float;a=fp16", "nvfp4-a16"})
    for (const auto& [n, k] :
         {std::pair<std::int64_t, std::int64_t>{200, 360}, {128, 256}, {720, 368}}) {
      const Scheme scheme = parse_scheme(text);
      std::vector<float> values(static_cast<std::size_t>(n * k));
      for (float& x : values) x = normal(rng);
      const PackedWeight packed = quantize_weight(scheme.weight, values.data(), n, k);
      const layout::MmaWeight w = layout::repack_for_mma(packed);
      SCOPED_TRACE(std::string(text) + " " + std::to_string(n) + "x" + std::to_string(k));
      EXPECT_EQ(static_cast<std::int64_t>(w.words.size()),
                w.n_padded / 64 * w.k_blocks * 32 * w.format.bits);
      EXPECT_EQ(static_cast<std::int64_t>(w.scales.size()),
                static_cast<std::int64_t>(w.groups) * w.n_padded);
      EXPECT_EQ(w.zeros.size(), w.stores_zeros() ? w.scales.size() : 0u);
    }
}

}  // namespace
}  // namespace qgemm::dispatch

namespace qgemm {
namespace {

TEST(ExpertLayout, Names) {
  EXPECT_STREQ(expert_layout_name(ExpertLayout::Auto), "auto");
  EXPECT_STREQ(expert_layout_name(ExpertLayout::Wgmma), "wgmma");
  EXPECT_STREQ(expert_layout_name(ExpertLayout::Mma), "mma");
}

}  // namespace
}  // namespace qgemm
