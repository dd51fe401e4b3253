// Tests of the selector's use of tuning tables (src/dispatch/tuned_config.hpp, select.hpp):
// bucket matching, candidates that cannot serve, tables of another machine, the active table.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dispatch/select.hpp"
#include "dispatch/tuned_config.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/tuning.hpp"

namespace qgemm::dispatch {
namespace {

const GpuLimits kH200 = GpuLimits::of_arch(jit::Arch::sm_90a, 132);

TuningEntry entry_for(const Scheme& scheme, std::int64_t n, std::int64_t k, std::int64_t m,
                      const std::string& candidate) {
  return {make_tuning_key(scheme, n, k, m), candidate, 10.0, "2026-12-02T10:00:00Z"};
}

runtime::DeviceInfo fake_device() {
  runtime::DeviceInfo device;
  device.index = 0;
  device.name = "Test GPU 9000";
  device.major = 9;
  device.minor = 0;
  device.sm_count = 66;
  return device;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/" + name + "-" + std::to_string(std::random_device{}());
}

GemmProblem w4a16_problem(std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmProblem p;
  p.scheme = parse_scheme("w4a16");
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

// The selection for a problem with `table` (the model's when null).
Selection select_with(const GemmProblem& p, const TuningTable* table) {
  SelectionContext context;
  context.gpu = kH200;
  context.rates = GpuRates::of(kH200);
  context.table = table;
  return select(p, p.m, WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch), context);
}

// A table entry decides exactly when its candidate can serve the bucket; else the model does.
TEST(TunedConfig, TheTableDecidesExactlyWhenItsCandidateCanServe) {
  const Scheme scheme = parse_scheme("w4a16");
  int served = 0, refused = 0;
  for (const Candidate& candidate : all_candidates()) {
    for (std::int64_t m : {1, 3, 16, 40, 200}) {
      SCOPED_TRACE(candidate.name + " m=" + std::to_string(m));
      const GemmProblem p = w4a16_problem(m, 256, 512);
      TuningTable table;
      table.entries.push_back(entry_for(scheme, 256, 512, m, candidate.name));
      const Selection model = select_with(p, nullptr);
      const Selection tuned = select_with(p, &table);
      bool can_serve = false;
      for (const Verdict& v : model.verdicts)
        if (v.candidate == &candidate) can_serve = v.rejected.empty();
      if (can_serve) {
        EXPECT_EQ(tuned.chosen().candidate, &candidate);
        EXPECT_NE(tuned.reason.find("tuning table"), std::string::npos) << tuned.reason;
        EXPECT_EQ(tuned.winner_us, 10.0);
        ++served;
      } else {
        EXPECT_EQ(tuned.chosen().candidate, model.chosen().candidate);
        EXPECT_EQ(tuned.reason, model.reason);
        ++refused;
      }
    }
  }
  // Both branches ran (streamed configs cannot serve M > 16; 8-bit configs no bf16 operand).
  EXPECT_GT(served, 0);
  EXPECT_GT(refused, 0);
}

// prepare_weight judges which layouts to keep with the table its plans will follow: on SM90
// the model keeps only the wgmma order for a full range, but a measured mma.sync winner
// (`medium` at M bucket 64) keeps the mma layout too, so the tuned plan can run it.
TEST(TunedConfig, ATunedWinnerKeepsItsLayout) {
  const GemmProblem p = w4a16_problem(1, 8192, 8192);
  const WeightFacts facts = WeightFacts::of_scheme(p.scheme, p.n, p.k, kH200.arch);
  SelectionContext context;
  context.gpu = kH200;
  context.rates = GpuRates::of(kH200);
  const KeptLayouts model = kept_layouts(p, facts, 65536, context);
  EXPECT_TRUE(model.wgmma);
  EXPECT_FALSE(model.mma);
  TuningTable table;
  table.entries.push_back(entry_for(p.scheme, p.n, p.k, 64, "medium"));
  context.table = &table;
  const KeptLayouts tuned = kept_layouts(p, facts, 65536, context);
  EXPECT_TRUE(tuned.mma);
  EXPECT_TRUE(tuned.wgmma);
}

TEST(TunedConfig, MatchesOnlyItsOwnBucketSchemeAndShape) {
  const Scheme scheme = parse_scheme("w4a16");
  TuningTable table;
  table.entries.push_back(entry_for(scheme, 256, 512, 128, "qdq"));
  auto tuned = [&](const GemmProblem& p) {
    return select_with(p, &table).reason.find("tuning table") != std::string::npos;
  };
  // Bucket 128 holds M 65..128.
  EXPECT_TRUE(tuned(w4a16_problem(65, 256, 512)));
  EXPECT_TRUE(tuned(w4a16_problem(128, 256, 512)));
  EXPECT_FALSE(tuned(w4a16_problem(64, 256, 512)));
  EXPECT_FALSE(tuned(w4a16_problem(129, 256, 512)));
  // Another scheme (zero points) or another shape: no entry.
  GemmProblem zero_points = w4a16_problem(100, 256, 512);
  zero_points.scheme = parse_scheme("w4a16-zp");
  EXPECT_FALSE(tuned(zero_points));
  EXPECT_FALSE(tuned(w4a16_problem(100, 320, 512)));
}

TEST(TunedConfig, UnknownCandidateNameFallsBackToTheModel) {
  TuningTable table;
  table.entries.push_back(entry_for(parse_scheme("w4a16"), 128, 256, 1, "dequant-cublas"));
  const GemmProblem p = w4a16_problem(1, 128, 256);
  EXPECT_EQ(select_with(p, &table).reason, select_with(p, nullptr).reason);
}

TEST(TunedConfig, ActiveTableAppliesOnItsMachineOnly) {
  const runtime::DeviceInfo device = fake_device();
  TuningTable table;
  table.machine = machine_key(device);
  table.entries.push_back(entry_for(parse_scheme("w4a16"), 128, 256, 1, "qdq"));
  const std::string path = temp_path("qgemm_tuned");
  save_tuning_table(table, path);

  const std::uint64_t generation = tuning_table_generation();
  use_tuning_table(path);
  EXPECT_NE(tuning_table_generation(), generation);  // cached plans are made again
  const auto active = applicable_tuning_table(device);
  ASSERT_NE(active, nullptr);
  EXPECT_EQ(active->entries.size(), 1u);

  // Another GPU: ignored, with one warning naming the field.
  table.machine.gpu = "Some Other GPU";
  save_tuning_table(table, path);
  use_tuning_table(path);
  testing::internal::CaptureStderr();
  EXPECT_EQ(applicable_tuning_table(device), nullptr);
  EXPECT_EQ(applicable_tuning_table(device), nullptr);
  const std::string log = testing::internal::GetCapturedStderr();
  const auto first = log.find("Some Other GPU");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_NE(log.find("the table is for GPU"), std::string::npos) << log;
  EXPECT_EQ(log.find("Some Other GPU", first + 1), std::string::npos) << "warned twice: " << log;

  // Another qgemm version: ignored too.
  table.machine = machine_key(device);
  table.machine.qgemm = "0.0.0-other";
  save_tuning_table(table, path);
  use_tuning_table(path);
  testing::internal::CaptureStderr();
  EXPECT_EQ(applicable_tuning_table(device), nullptr);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("0.0.0-other"), std::string::npos);

  // Turned off: the model serves.
  use_tuning_table("");
  EXPECT_EQ(applicable_tuning_table(device), nullptr);
  std::remove(path.c_str());
}

TEST(TunedConfig, AskingForAMissingOrInvalidTableIsAnError) {
  try {
    use_tuning_table("/nonexistent-dir/table.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::IoError);
  }
  const std::string path = temp_path("qgemm_tuned_bad");
  {
    std::FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr);
    std::fputs("{\"format\": \"something else\"}", file);
    std::fclose(file);
  }
  EXPECT_THROW(use_tuning_table(path), Error);
  // A failed install leaves no table active.
  EXPECT_EQ(applicable_tuning_table(fake_device()), nullptr);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace qgemm::dispatch
