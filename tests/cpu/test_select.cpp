// The selector (src/dispatch/select.hpp) and the families it chooses among: which candidate
// serves which problem and why not, that the cost model's picks follow the H200 measurements
// where they are clear-cut, that launch geometry covers the problem exactly, and that forcing a
// candidate is checked.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "dispatch/candidate_launch.hpp"
#include "dispatch/mma_family.hpp"
#include "dispatch/qdq_family.hpp"
#include "dispatch/select.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"
#include "scoped_env.hpp"

namespace qgemm::dispatch {
namespace {

const GpuLimits kH200 = GpuLimits::of_arch(jit::Arch::sm_90a, 132);
const GpuLimits kAda = GpuLimits::of_arch(jit::Arch::sm_89, 128);

// A problem of `scheme` (preset or text) at M rows with bf16 input (the scheme's own 16-bit
// activations when it has them).
GemmProblem problem_of(const std::string& scheme, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmProblem p;
  p.scheme = parse_scheme(scheme);
  p.m = m;
  p.n = n;
  p.k = k;
  p.input = p.scheme.activation.is_quantized() ? formats::bf16 : p.scheme.activation.format;
  return p;
}

SelectionContext context_of(const GpuLimits& gpu) {
  SelectionContext context;
  context.gpu = gpu;
  context.rates = GpuRates::of(gpu);
  return context;
}

Selection select_for(const GemmProblem& p, const GpuLimits& gpu = kH200) {
  return select(p, p.max_rows(), WeightFacts::of_scheme(p.scheme, p.n, p.k, gpu.arch),
                context_of(gpu));
}

const Verdict& verdict_of(const Selection& s, std::string_view name) {
  for (const Verdict& v : s.verdicts)
    if (v.candidate->name == name) return v;
  throw std::runtime_error("no candidate " + std::string(name));
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// Every candidate gets a verdict: a reason, or a finite positive prediction; one winner, which
// serves.
TEST(Select, EveryCandidateGetsAVerdictAndTheWinnerServes) {
  for (const Preset& preset : presets())
    for (std::int64_t m : {1, 7, 16, 64, 256, 4096}) {
      SCOPED_TRACE(preset.name + " M=" + std::to_string(m));
      const GemmProblem p = problem_of(preset.name, m, 4096, 4096);
      const Selection s = select_for(p);
      ASSERT_EQ(s.verdicts.size(), all_candidates().size());
      for (const Verdict& v : s.verdicts) {
        if (v.rejected.empty()) {
          EXPECT_TRUE(std::isfinite(v.cost.total_us) && v.cost.total_us > 0) << v.candidate->name;
        } else {
          EXPECT_GT(v.rejected.size(), 10u) << v.candidate->name;
        }
      }
      ASSERT_GE(s.winner, 0);
      EXPECT_TRUE(s.chosen().rejected.empty());
      EXPECT_FALSE(s.reason.empty());
      // The winner's kernels can be described without a GPU.
      const CandidateLaunch launch = candidate_launch(
          p, m, s.chosen(), WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch), kH200,
          0.0);
      EXPECT_FALSE(launch.text().empty());
    }
}

// The 8-bit mma takes int8/e4m3 codes with one scale per row, e4m3 only where mma.sync is native
// on it, and integer codes with integer zero points against int8.
TEST(Select, EightBitOperandRules) {
  {
    const Selection s = select_for(problem_of("w8a8-int8", 64, 8192, 8192));
    const Verdict& v = verdict_of(s, "medium-a8");
    EXPECT_TRUE(v.rejected.empty()) << v.rejected;
    EXPECT_EQ(v.operand, formats::int8);
    // The 16-bit configs take the 16-bit operand int8 codes expand into (fp16 holds them).
    EXPECT_EQ(verdict_of(s, "medium").operand,
              jit::activation_operand_format(parse_scheme("w8a8-int8").activation));
  }
  EXPECT_TRUE(contains(verdict_of(select_for(problem_of("w4a16", 64, 4096, 4096)), "medium-a8")
                           .rejected,
                       "one scale per row"));
  // SM90 has no native e4m3 mma.sync; SM89 has.
  EXPECT_TRUE(contains(verdict_of(select_for(problem_of("w4a8-fp8", 64, 8192, 8192)), "medium-a8")
                           .rejected,
                       "native on SM89"));
  EXPECT_EQ(verdict_of(select_for(problem_of("w4a8-fp8", 64, 8192, 8192), kAda), "medium-a8")
                .operand,
            formats::e4m3);
  // 1x128 activation groups (fp8-block) are no row factor.
  EXPECT_TRUE(contains(verdict_of(select_for(problem_of("fp8-block", 64, 8192, 8192), kAda),
                                  "prefill-a8")
                           .rejected,
                       "one scale per row"));
  // Float zero points are not integers to take off in s32.
  EXPECT_FALSE(verdict_of(select_for(problem_of("w=uint4:g128:s=fp16:zp=float;a=int8:t", 64,
                                                4096, 4096)),
                          "medium-a8")
                   .rejected.empty());
}

// Where the measurements are clear-cut (bench/NOTES.md), the model agrees: decode streams the
// weight at M ≤ 8 of a large layer, wgmma-16 takes M = 16 there (H100, 28672×8192: 61–70 µs
// against the decode kernel's 92), the tiled kernel wins at M = 64 off SM90 (80 µs against 140
// for dequantize + cuBLAS), dequantize + cuBLAS wins at M = 4096 (0.88 of cuBLAS against 0.33).
TEST(Select, ModelFollowsTheClearCutMeasurements) {
  for (std::int64_t m : {1, 2, 5, 8})
    EXPECT_EQ(select_for(problem_of("w4a16", m, 28672, 8192)).chosen().candidate->path,
              Path::MmaStreamed)
        << "M=" << m;
  EXPECT_EQ(select_for(problem_of("w4a16", 16, 28672, 8192)).chosen().candidate->path,
            Path::Wgmma);
  // SM90 wgmma from M = 64 (H100: 8192² M = 64 40.5 µs against 84.2 for the best mma.sync
  // tile; 28672×8192 M = 256 186 against 865 and qdq's ~250); dequantize + cuBLAS where the
  // wgmma kernel's serial dequantization costs more than qdq's one pass (28672×8192 M = 4096:
  // 2905 against ~2450).
  EXPECT_EQ(select_for(problem_of("w4a16", 64, 8192, 8192)).chosen().candidate->path,
            Path::Wgmma);
  EXPECT_EQ(select_for(problem_of("w4a16", 256, 28672, 8192)).chosen().candidate->path,
            Path::Wgmma);
  EXPECT_EQ(select_for(problem_of("w4a16", 4096, 28672, 8192)).chosen().candidate->path,
            Path::Qdq);
  // Off SM90 the tiled mma.sync kernel takes M = 64.
  EXPECT_EQ(select_for(problem_of("w4a16", 64, 8192, 8192), GpuLimits::of_arch(jit::Arch::sm_89, 128))
                .chosen()
                .candidate->path,
            Path::MmaTiled);
  // 8-bit float weights against 8-bit float activations at prefill: cuBLASLt FP8 (its per-token
  // × per-channel scaling costs it nothing there: 376 against 374 µs, 8192², M = 4096).
  EXPECT_EQ(select_for(problem_of("w8a8-fp8", 4096, 8192, 8192)).chosen().candidate->path,
            Path::CublasLtFp8);
}

// cuBLASLt FP8's rules: 8-bit float codes on both sides with a scale mode it has, SM89+, N and
// K in multiples of 16, 128-block scaling from M = 16 on SM90.
TEST(Select, CublasLtFp8Rules) {
  EXPECT_TRUE(verdict_of(select_for(problem_of("w8a8-fp8", 256, 8192, 8192)), "cublaslt-fp8")
                  .rejected.empty());
  EXPECT_TRUE(contains(verdict_of(select_for(problem_of("w8a8-fp8", 256, 8192, 8192),
                                             GpuLimits::of_arch(jit::Arch::sm_80, 108)),
                                  "cublaslt-fp8")
                           .rejected,
                       "8.9"));
  EXPECT_TRUE(contains(
      verdict_of(select_for(problem_of("w4a8-fp8", 256, 8192, 8192)), "cublaslt-fp8").rejected,
      "weight codes int4"));
  EXPECT_TRUE(contains(
      verdict_of(select_for(problem_of("w=e4m3:ch:s=fp32;a=bf16", 256, 8192, 8192)), "cublaslt-fp8")
          .rejected,
      "activations bf16"));
  EXPECT_TRUE(contains(verdict_of(select_for(problem_of("w8a8-fp8", 256, 8200, 8192)),
                                  "cublaslt-fp8")
                           .rejected,
                       "multiples of 16"));
  EXPECT_TRUE(contains(
      verdict_of(select_for(problem_of("fp8-block", 8, 7168, 18432)), "cublaslt-fp8").rejected,
      "m >= 16"));
  EXPECT_TRUE(verdict_of(select_for(problem_of("fp8-block", 16, 7168, 18432)), "cublaslt-fp8")
                  .rejected.empty());
  // A C below 16-byte alignment goes to the kernels that write any alignment.
  GemmProblem offset_c = problem_of("w8a8-fp8", 256, 8192, 8192);
  offset_c.c_alignment = 4;
  const Selection s = select_for(offset_c);
  EXPECT_TRUE(contains(verdict_of(s, "cublaslt-fp8").rejected, "4-byte aligned"));
  EXPECT_NE(s.chosen().candidate->path, Path::CublasLtFp8);
}

// C's alignment: a power of two from 1 to 16 bytes, at least its elements'.
TEST(Select, OutputAlignmentRules) {
  GemmProblem p = problem_of("w4a16", 8, 4096, 4096);
  for (int alignment : {2, 4, 8, 16}) {
    p.c_alignment = alignment;
    EXPECT_NO_THROW(validate(p)) << alignment;
  }
  for (int alignment : {0, 1, 3, 32}) {
    p.c_alignment = alignment;
    EXPECT_THROW(validate(p), Error) << alignment;
  }
  p.scheme.output = formats::fp32;
  p.c_alignment = 2;
  try {
    validate(p);
    ADD_FAILURE() << "a 2-byte aligned fp32 C was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "c_alignment = 2 is below the 4-byte elements of C"))
        << error.what();
  }
}

// A fused GLU is a grouped gate_up GEMM's, with 16-bit rows out; and it reaches the kernel spec
// of the grouped candidate chosen (candidate_launch: the "glu" parameter names its kind).
TEST(Select, FusedGluRules) {
  GemmProblem p = problem_of("w4a16", 64, 1536, 2048);
  p.glu = GluKind::Silu;
  try {
    validate(p);
    ADD_FAILURE() << "a dense GEMM with a GLU was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "glu = silu with experts = 0")) << error.what();
  }
  p.experts = 128;
  EXPECT_NO_THROW(validate(p));
  p.scheme.output = formats::fp32;
  EXPECT_THROW(validate(p), Error);
  p.scheme.output = formats::bf16;
  for (const GluKind kind : {GluKind::Silu, GluKind::Gelu, GluKind::ClampedSwiglu}) {
    p.glu = kind;
    const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
    const GroupedView view = grouped_view(p, facts, p.m);
    const Selection s = select(view.problem, view.m, view.weight, context_of(kH200));
    const CandidateLaunch launch = candidate_launch(p, p.m, s.chosen(), facts, kH200, 0.0);
    ASSERT_TRUE(launch.gemm.has_value());
    const std::string spec = jit::to_string(*launch.gemm);
    EXPECT_TRUE(contains(spec, std::string("glu=") + glu_kind_name(kind))) << spec;
    EXPECT_TRUE(contains(spec, "grouped=true")) << spec;
  }
}

// The grouped (MoE) 8-bit tiles: Engine::moe's gate_up GEMM forced onto one (held back from the
// ranking until measured) quantizes the gathered rows per token or per 1x128 group in its own
// step, then runs the grouped FP8 / INT8 tile; a tensor scale (which would see the capacity's
// unrouted rows) is refused, and unforced the tiles are not ranked.
TEST(Select, GroupedEightBitTilesAreForcedOnlyAndRowLocal) {
  struct Case {
    const char* scheme;
    const char* config;
    bool groups;  // 1x128 activation groups (promoted in the loop)
  };
  for (const Case& c :
       {Case{"fp8-block", "wgmma-fp8-128", true}, Case{"w4a8-fp8", "wgmma-fp8-128", false},
        Case{"w8a8-int8", "wgmma-int8-128", false}}) {
    SCOPED_TRACE(c.scheme);
    GemmProblem p = problem_of(c.scheme, 4096 * 8, 4096, 7168);
    p.experts = 256;
    const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
    const GroupedView view = grouped_view(p, facts, p.m);
    SelectionContext context = context_of(kH200);
    const Selection unforced = select(view.problem, view.m, view.weight, context);
    EXPECT_NE(unforced.chosen().candidate->name, c.config);
    context.forced = c.config;
    const Selection forced = select(view.problem, view.m, view.weight, context);
    ASSERT_EQ(forced.chosen().candidate->name, c.config);
    p.glu = GluKind::Silu;
    const CandidateLaunch launch = candidate_launch(p, p.m, forced.chosen(), facts, kH200, 0.0);
    EXPECT_EQ(launch.prep, ActivationPrep::Quantize);
    EXPECT_EQ(launch.group_scales, c.groups);
    ASSERT_TRUE(launch.gemm.has_value());
    const std::string spec = jit::to_string(*launch.gemm);
    EXPECT_TRUE(contains(spec, "grouped=true")) << spec;
    EXPECT_TRUE(contains(spec, "glu=silu")) << spec;
    EXPECT_TRUE(contains(spec, c.groups ? "act=e4m3_g128" : "act=")) << spec;
  }
  // One scale for the whole tensor: refused by name, forced or not.
  GemmProblem p = problem_of("w=e4m3:ch:s=fp32;a=e4m3:t:s=fp32;o=bf16", 1024, 4096, 7168);
  p.experts = 64;
  const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
  const GroupedView view = grouped_view(p, facts, p.m);
  SelectionContext context = context_of(kH200);
  context.forced = "wgmma-fp8-128";
  try {
    select(view.problem, view.m, view.weight, context);
    ADD_FAILURE() << "a tensor-scaled grouped problem took an 8-bit tile";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "per token or per group")) << error.what();
  }
}

// Dequantize + cuBLAS folds the per-row factors of quantized activations into the bf16 operand
// only for a bf16 output (whose own rounding that is); fp16 and fp32 outputs keep the operand
// exact and the finish applies the factors.
TEST(QdqFamily, RowFactorsFoldOnlyIntoABf16Output) {
  for (const char* activation : {"e4m3:tok:s=fp32", "int8:tok:s=fp32", "e4m3:t:s=fp32",
                                 "e2m1:nv:s=ue4m3"})
    for (const Format& out : {formats::bf16, formats::fp16, formats::fp32}) {
      GemmProblem p = problem_of(
          fmt::format("w=uint4:g128:s=bf16;a={};o={}", activation, out.name()), 64, 4096, 4096);
      SelectionContext context = context_of(kH200);
      context.forced = "qdq";
      const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
      const Selection s = select(p, p.m, facts, context);
      const CandidateLaunch launch = candidate_launch(p, p.m, s.chosen(), facts, kH200, 0.0);
      SCOPED_TRACE(std::string(activation) + " -> " + out.name());
      const bool fold = out == formats::bf16;
      EXPECT_EQ(launch.fold_row_factors, fold);
      EXPECT_EQ(launch.row_factors, !fold);
      EXPECT_EQ(launch.qdq.finish, !fold);
      EXPECT_EQ(launch.finish.has_value(), !fold);
    }
}

// Pre-quantized codes: cuBLASLt reads per-token scales as the canonical grid holds them (against
// per-channel weights), and g128 fp32 scales after a transpose into its 1x128 layout; per-token
// codes against 128x128 weight blocks would need their scale repeated per 1x128 block.
TEST(Select, CublasLtFp8TakesPreQuantizedCodesWhoseScalesItCanRead) {
  auto prequantized = [](const std::string& scheme, std::int64_t m) {
    GemmProblem p = problem_of(scheme, m, 7168, 18432);
    p.prequantized = true;
    return verdict_of(select_for(p), "cublaslt-fp8").rejected;
  };
  EXPECT_EQ(prequantized("w8a8-fp8", 256), "");
  EXPECT_EQ(prequantized("fp8-block", 256), "");
  EXPECT_EQ(select_for([] {
              GemmProblem p = problem_of("fp8-block", 4096, 7168, 18432);
              p.prequantized = true;
              return p;
            }())
                .chosen()
                .candidate->path,
            Path::CublasLtFp8);
  EXPECT_TRUE(contains(prequantized("w=e4m3:b128x128:s=fp32;a=e4m3:tok;o=bf16", 256),
                       "canonical layout"))
      << prequantized("w=e4m3:b128x128:s=fp32;a=e4m3:tok;o=bf16", 256);
}

// Every k16 block belongs to exactly one split: the splits reach K, and the last one is needed;
// the grid covers N and M.
TEST(MmaFamily, LaunchesCoverTheProblemExactlyOnce) {
  for (const char* scheme : {"w4a16", "w8a16", "mxfp4-a16", "w=uint3:g64:s=bf16:zp=int;a=bf16"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {640, 640},
                        {5472, 2880},
                        {4000, 10944}})
      for (const MmaConfig& config : mma_configs())
        for (std::int64_t m : {1, 3, 16, 17, 64, 128}) {
          const layout::MmaWeight w = *WeightFacts::of_scheme(parse_scheme(scheme), n, k,
                                                              kH200.arch)
                                           .mma;
          if (config.unsupported_reason(m, w, formats::bf16, kH200)) continue;
          SCOPED_TRACE(config.name + " " + scheme + " M=" + std::to_string(m) +
                       " N=" + std::to_string(n) + " K=" + std::to_string(k));
          const MmaLaunch launch = mma_launch(config, m, w, kH200);
          ASSERT_GE(launch.splits, 1);
          if (config.kernel == MmaKernel::Streamed) {
            const std::int64_t per_split =
                static_cast<std::int64_t>(launch.blocks_per_warp) * config.decode.warps;
            EXPECT_EQ(launch.blocks_per_warp % config.decode.stage_blocks, 0);
            EXPECT_GE(per_split * launch.splits, w.k_blocks);
            EXPECT_LT(per_split * (launch.splits - 1), w.k_blocks);
            EXPECT_EQ(launch.grid_x, static_cast<unsigned>(w.n_padded / 64));
            EXPECT_GE(launch.rows, m);
          } else {
            EXPECT_GE(static_cast<std::int64_t>(launch.tiles_per_split) * launch.splits,
                      launch.k_tiles);
            EXPECT_LT(static_cast<std::int64_t>(launch.tiles_per_split) * (launch.splits - 1),
                      launch.k_tiles);
            EXPECT_GE(static_cast<std::int64_t>(launch.grid_y(config, m)) * config.block_m(), m);
            EXPECT_GE(static_cast<std::int64_t>(launch.grid_x) * config.block_n(), w.n_padded);
          }
        }
}

// The streamed split (measured on the H200, bench/NOTES.md third session): every warp of a split
// launch streams at least 512 of K (shorter ranges pay their ramp and drain), and large-N decode
// is split (one split of 28672×8192 left too few warps in flight: 51 µs against 44).
TEST(MmaFamily, StreamedSplitsKeepWarpRangesLongAndFillTheGpu) {
  for (const char* scheme : {"w4a16", "w8a16", "w=uint3:g64:s=bf16:zp=int;a=bf16"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {8192, 8192},
                        {640, 10944},
                        {5472, 2880}}) {
      SCOPED_TRACE(std::string(scheme) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
      const layout::MmaWeight w =
          *WeightFacts::of_scheme(parse_scheme(scheme), n, k, kH200.arch).mma;
      const MmaLaunch launch = mma_launch(*find_mma_config("decode"), 1, w, kH200);
      if (launch.splits > 1) EXPECT_GE(launch.blocks_per_warp * 16, 512);
      if (n >= 8192 && k >= 8192) EXPECT_GT(launch.splits, 1);
    }
}

// Dequantize + cuBLAS chunks are whole 64-row slices (and whole 128-row scale blocks), within
// the scratch bound where one slice fits it, and never more than the weight.
TEST(QdqFamily, ChunksAreBoundedWholeSlices) {
  for (const char* scheme : {"w4a16", "fp8-block"})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{28672, 8192},
                        {8192, 28672},
                        {640, 640},
                        {4000, 10944},
                        {128, 1 << 20}})
      for (std::int64_t m : {std::int64_t{300}, std::int64_t{4096}, std::int64_t{1} << 22}) {
        SCOPED_TRACE(std::string(scheme) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        const GemmProblem p = problem_of(scheme, m, n, k);
        const QdqLaunch launch =
            qdq_launch(p, m, WeightFacts::of_scheme(p.scheme, n, k, kH200.arch));
        const std::int64_t unit = p.scheme.weight.granularity == WeightGranularity::Block ? 128 : 64;
        EXPECT_EQ(launch.chunk_n % unit, 0);
        EXPECT_GE(launch.chunk_n, unit);
        EXPECT_LE(launch.chunk_n, (n + unit - 1) / unit * unit);
        EXPECT_EQ(launch.chunks, (n + launch.chunk_n - 1) / launch.chunk_n);
        if (unit * k * 2 <= (std::int64_t{64} << 20) &&
            (!launch.finish || unit * m * 4 <= (std::int64_t{128} << 20))) {
          EXPECT_LE(launch.chunk_n * k * 2, std::int64_t{64} << 20);
          if (launch.finish) EXPECT_LE(launch.chunk_n * m * 4, std::int64_t{128} << 20);
        }
      }
}

// A weight no tile config serves (groups of 48: no BK or stage K they tile) is served at every M
// by dequantize + cuBLAS; forcing a candidate that cannot serve is an error naming it and the
// reason, and an unknown name is one too.
TEST(Select, WeightsNoKernelHoldsFallBackToQdq) {
  for (std::int64_t m : {1, 16, 64, 4096}) {
    const Selection s = select_for(problem_of("w=uint4:g48:s=bf16:zp=int;a=bf16", m, 640, 2880));
    EXPECT_EQ(s.chosen().candidate->path, Path::Qdq) << "M=" << m;
    EXPECT_TRUE(contains(verdict_of(s, "medium").rejected, "group 48")) << "M=" << m;
    if (m <= 16) EXPECT_TRUE(contains(verdict_of(s, "decode").rejected, "group 48")) << "M=" << m;
  }
  GemmProblem p = problem_of("w=uint4:g48:s=bf16:zp=int;a=bf16", 1, 640, 2880);
  SelectionContext context = context_of(kH200);
  const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
  context.forced = "decode";
  try {
    select(p, 1, facts, context);
    ADD_FAILURE() << "forced decode served a group of 48";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
    EXPECT_TRUE(contains(e.what(), "decode")) << e.what();
    EXPECT_TRUE(contains(e.what(), "group 48")) << e.what();
  }
  context.forced = "no-such-candidate";
  try {
    select(p, 1, facts, context);
    ADD_FAILURE() << "an unknown candidate name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_TRUE(contains(e.what(), "no-such-candidate")) << e.what();
  }
  context.forced = "qdq";
  EXPECT_EQ(select(p, 1, facts, context).reason, "forced by the caller");
}

// A16 problems whose A rows are not 16-byte aligned cannot be copied by the tensor-core
// kernels: dequantize + cuBLAS serves them.
TEST(Select, UnalignedActivationsAreServedByCublas) {
  GemmProblem p = problem_of("w4a16", 1, 4096, 4096);
  p.a_alignment = 2;
  const Selection s = select_for(p);
  EXPECT_EQ(s.chosen().candidate->path, Path::Qdq);
  EXPECT_TRUE(contains(verdict_of(s, "decode").rejected, "2-byte aligned"));
}

// M ranges are cut into power-of-two buckets clipped to the range.
// The layouts prepare_weight keeps (kept_layouts): on SM90 a range that reaches the wgmma
// family holds the weight once, in the wgmma order, which the decode kernel (M = 1) and qdq
// read (unless QGEMM_WGMMA_ORDER_READERS=0); a decode-only range holds the mma layout;
// off SM90 the mma layout. The catalog that `qgemm compile --all` builds follows it (its decode
// kernels then read the wgmma order on SM90).
TEST(Select, Sm90KeepsOneLayoutWhereTheRangeReachesWgmma) {
  const GemmProblem p = problem_of("w4a16", 1, 8192, 8192);
  const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
  {
    // Switched off: both layouts kept, and a weight in the wgmma order alone is not decoded
    // unforced.
    test::ScopedEnv off("QGEMM_WGMMA_ORDER_READERS", "0");
    const KeptLayouts both = kept_layouts(p, facts, 65536, context_of(kH200));
    EXPECT_TRUE(both.mma && both.wgmma);
    const WeightFacts wgmma_only = keep_layouts(facts, {false, true, false});
    const Selection s = select(p, 1, wgmma_only, context_of(kH200));
    EXPECT_EQ(s.chosen().candidate->path, Path::Wgmma);
    EXPECT_TRUE(contains(verdict_of(s, "decode").rejected, "QGEMM_WGMMA_ORDER_READERS=0"))
        << verdict_of(s, "decode").rejected;
    EXPECT_TRUE(contains(verdict_of(s, "qdq").rejected, "QGEMM_WGMMA_ORDER_READERS=0"));
    // Beside canonical codes, qdq reads those (their own dequantizer), not the wgmma order.
    EXPECT_EQ(qdq_prepared_weight(keep_layouts(facts, {false, true, true})), nullptr);
    EXPECT_EQ(qdq_prepared_weight(keep_layouts(facts, {true, true, true}))->order,
              layout::FragmentOrder::Mma);
  }
  test::ScopedEnv by_default("QGEMM_WGMMA_ORDER_READERS", nullptr);
  const KeptLayouts whole = kept_layouts(p, facts, 65536, context_of(kH200));
  EXPECT_TRUE(whole.wgmma);
  EXPECT_FALSE(whole.mma);
  EXPECT_FALSE(whole.canonical);
  const WeightFacts kept = keep_layouts(facts, whole);
  ASSERT_FALSE(kept.mma);
  EXPECT_TRUE(contains(kept.no_mma, "wgmma order")) << kept.no_mma;
  const Selection decode = select(p, 1, kept, context_of(kH200));
  EXPECT_EQ(decode.chosen().candidate->path, Path::MmaStreamed);
  const CandidateLaunch launch = candidate_launch(p, 1, decode.chosen(), kept, kH200, 0.0);
  EXPECT_EQ(launch.gemm->param("order").choice, "wgmma");
  SelectionContext forced = context_of(kH200);
  forced.forced = "qdq";
  const Selection qdq = select(p, 64, kept, forced);
  ASSERT_EQ(qdq.chosen().candidate->path, Path::Qdq);
  const CandidateLaunch qdq_launch = candidate_launch(p, 64, qdq.chosen(), kept, kH200, 0.0);
  EXPECT_EQ(qdq_launch.dequantize->param("order").choice, "wgmma");
  EXPECT_TRUE(contains(verdict_of(select(p, 64, kept, context_of(kH200)), "medium").rejected,
                       "no mma layout"));

  const KeptLayouts decode_only = kept_layouts(p, facts, 8, context_of(kH200));
  EXPECT_TRUE(decode_only.mma);
  EXPECT_FALSE(decode_only.wgmma);
  const WeightFacts on_ada = WeightFacts::of_scheme(p.scheme, p.n, p.k, kAda.arch);
  const KeptLayouts ada = kept_layouts(p, on_ada, 65536, context_of(kAda));
  EXPECT_TRUE(ada.mma);
  EXPECT_FALSE(ada.wgmma);

  bool decode_reads_wgmma = false;
  for (const jit::KernelSpec& spec : kernel_catalog(kH200))
    if (spec.family == "dense_decode_sm80" && spec.param("order").choice == "wgmma")
      decode_reads_wgmma = true;
  EXPECT_TRUE(decode_reads_wgmma);
}

TEST(Select, BucketsCoverTheRange) {
  GemmProblem p = problem_of("w4a16", 3, 64, 64);
  p.m_max = 40;
  const auto buckets = m_buckets(p);
  const std::vector<std::pair<std::int64_t, std::int64_t>> expected = {
      {3, 4}, {5, 8}, {9, 16}, {17, 32}, {33, 40}};
  EXPECT_EQ(buckets, expected);
  p.m_max = 0;
  EXPECT_EQ(m_buckets(p), (std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 3}}));
}

// What Engine::warm_up compiles (problem_specs with every_m) holds each M's own winner, which
// Engine::gemm launches (it plans every M by itself): fp8-block 1536 x 1024 at M = 300 chooses
// cuBLASLt FP8 and its codes quantizer, which the buckets' winners (each judged at its largest
// M) do not; every_m adds them, and the bucket specs stay.
TEST(Select, WarmUpSpecsHoldEveryMsOwnWinner) {
  for (const char* scheme : {"fp8-block", "w4a16", "nvfp4", "w4a8-fp8"}) {
    GemmProblem p = problem_of(scheme, 1, 1536, 1024);
    p.m_max = 512;
    const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<jit::KernelSpec> warm = problem_specs(p, facts, context_of(kH200), 0.0, true);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const std::vector<jit::KernelSpec> buckets = problem_specs(p, facts, context_of(kH200));
    for (const jit::KernelSpec& spec : buckets)
      EXPECT_NE(std::find(warm.begin(), warm.end(), spec), warm.end()) << scheme;
    std::size_t missed_by_buckets = 0;
    for (std::int64_t m = 1; m <= p.m_max; ++m) {
      GemmProblem exact = p;
      exact.m = m, exact.m_max = 0;
      for (const jit::KernelSpec& spec : problem_specs(exact, facts, context_of(kH200))) {
        EXPECT_NE(std::find(warm.begin(), warm.end(), spec), warm.end())
            << scheme << " M = " << m << ": " << jit::to_string(spec);
        missed_by_buckets += std::find(buckets.begin(), buckets.end(), spec) == buckets.end();
      }
    }
    if (std::string(scheme) == "fp8-block") EXPECT_GT(missed_by_buckets, 0u);
    std::printf("%-10s %zu bucket specs, %zu with every M (%.1f ms)\n", scheme, buckets.size(),
                warm.size(), ms);
  }
}

// The dequant + cuBLAS kernels compile without spills: the dequantization for each zero mode
// and float weights, the finishing kernel for each output type.
TEST(QdqFamily, KernelsCompileWithoutSpills) {
  jit::KernelCache cache(jit::CacheConfig{});
  std::vector<jit::KernelSpec> specs;
  for (const char* scheme :
       {"w4a16", "w=uint4:g128:s=bf16:zp=int;a=bf16", "w=uint6:g128:s=fp16:zp=float;a=fp16",
        "w=e3m2:g32:s=e8m0;a=bf16", "w8a16", "w=uint4:g48:s=bf16:zp=int;a=bf16"}) {
    const Scheme s = parse_scheme(scheme);
    specs.push_back(qdq_dequantize_spec(WeightFacts::of_scheme(s, 640, 1024, kH200.arch),
                                        s.activation.format, jit::Arch::sm_90a));
  }
  for (const Format& out : {formats::fp16, formats::bf16, formats::fp32})
    for (jit::Arch arch : {jit::Arch::sm_80, jit::Arch::sm_90a})
      specs.push_back(finish_gemm_spec(out, arch));
  for (const jit::KernelSpec& spec : specs) {
    SCOPED_TRACE(jit::to_string(spec));
    const auto lookup = cache.get(spec);
    EXPECT_EQ(lookup.kernel->resources.spill_bytes(), 0);
    EXPECT_EQ(lookup.kernel->resources.stack_frame_bytes, 0);
  }
}

}  // namespace
}  // namespace qgemm::dispatch
