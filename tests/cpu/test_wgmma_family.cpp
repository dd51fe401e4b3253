// The SM90 wgmma family on the CPU side (src/dispatch/wgmma_family.hpp): it is opt-in until it has
// been verified on an H200, its launches cover the problem exactly once, its rules reject what
// the kernel cannot hold, and its JIT specs compile for sm_90a without spills.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dispatch/select.hpp"
#include "dispatch/wgmma_family.hpp"
#include "jit/cache.hpp"
#include "qgemm/error.hpp"
#include "qgemm/moe.hpp"
#include "qgemm/plan.hpp"
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

// Sets QGEMM_WGMMA for one scope and restores it.
class ScopedWgmmaSwitch {
 public:
  explicit ScopedWgmmaSwitch(const char* value) {
    if (const char* old = std::getenv("QGEMM_WGMMA")) old_ = old;
    if (value)
      setenv("QGEMM_WGMMA", value, 1);
    else
      unsetenv("QGEMM_WGMMA");
  }
  ~ScopedWgmmaSwitch() {
    if (old_)
      setenv("QGEMM_WGMMA", old_->c_str(), 1);
    else
      unsetenv("QGEMM_WGMMA");
  }

 private:
  std::optional<std::string> old_;
};

// The selector ranks the family on sm_90a unless QGEMM_WGMMA=0, and takes it where it measured
// fastest (H100, bench/NOTES.md, SM90 wgmma, second session: w4a16 M = 64 and 256 on
// 28672×8192 at 89.8 / 186 µs against 227 / 865 for mma.sync and 170 / 189 for cuBLAS); the
// held-back designs and a switched-off family serve forced runs only; off sm_90a it never serves.
TEST(WgmmaFamily, IsRankedOnSm90UnlessSwitchedOff) {
  const GemmProblem p = problem_of("w4a16", 64, 28672, 8192);
  {
    ScopedWgmmaSwitch unset(nullptr);
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
    ScopedWgmmaSwitch off("0");
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
  for (const char* scheme : {"w4a16", "w8a16", "mxfp4-a16", "w=uint3:g64:s=bf16:zp=int;a=bf16"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {640, 640},
                        {5472, 2880},
                        {4000, 10944}})
      for (const WgmmaConfig& config : wgmma_configs())
        for (std::int64_t m : {1, 3, 16, 17, 64, 129, 1000, 4096}) {
          const layout::MmaWeight w = wgmma_weight(scheme, n, k);
          if (config.unsupported_reason(m, w, formats::bf16, kH200)) continue;
          SCOPED_TRACE(config.name + " " + scheme + " M=" + std::to_string(m) +
                       " N=" + std::to_string(n) + " K=" + std::to_string(k));
          const WgmmaLaunch launch = wgmma_launch(config, m, w, formats::bf16, kH200);
          const std::int64_t k_chunks = w.k_blocks / 4;
          ASSERT_GE(launch.splits, 1);
          EXPECT_EQ(launch.chunks_per_split % config.tile.stage_chunks, 0);
          if (wgmma_promotes_scales(config, w, formats::bf16) && w.group_size > 0)
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

// Grouped (MoE) GEMMs: only the wgmma family reads the routing, a routing block its tile does
// not divide is refused, the launch covers every routing's capacity (in token blocks of the
// config) and its split-K scratch stays bounded.
TEST(WgmmaFamily, GroupedGemmsRunOnTheFamilyOverTheRoutingsCapacity) {
  EXPECT_EQ(grouped_rows_per_expert(8, 128), 1);  // decode: 8 choices, 8 experts
  EXPECT_EQ(grouped_rows_per_expert(32768, 128), 256);
  EXPECT_EQ(grouped_rows_per_expert(300, 1), 300);
  GemmProblem p = problem_of("w4a16", 64 * 8, 1536, 2048);
  p.experts = 128;
  const Selection s = select_on(p, kH200);
  int served = 0;
  for (const Verdict& v : s.verdicts) {
    if (v.candidate->path != Path::Wgmma) {
      EXPECT_NE(v.rejected.find("grouped (MoE) GEMM runs on the wgmma family"), std::string::npos)
          << v.candidate->name << ": " << v.rejected;
    } else if (v.rejected.empty()) {
      ++served;
    }
  }
  EXPECT_GT(served, 0);
  EXPECT_NE(verdict_of(s, "wgmma-128").rejected.find("at most 64"), std::string::npos);
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
// dense and grouped (MoE).
TEST(WgmmaFamily, SpecsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  struct Case {
    const char* scheme;
    std::int64_t m;
    const char* config;
    Format output;
    bool grouped = false;
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
                   c.grouped);
    SCOPED_TRACE(jit::to_string(spec));
    const auto lookup = cache.get(spec);
    EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
    EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
  }
}

}  // namespace
}  // namespace qgemm::dispatch
