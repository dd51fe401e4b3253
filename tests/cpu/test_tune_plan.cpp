// Tests of `qgemm tune`'s plan, worker protocol, winner choice (tools/harness/bench/tune_plan.hpp) and its
// watchdog (tools/harness/bench/tune_supervisor.hpp, driven by a fake worker that hangs and crashes).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>

#include "bench/tune_plan.hpp"
#include "bench/tune_supervisor.hpp"
#include "dispatch/select.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

const char* kRecipe =
    "name: tune-test\n"
    "cases:\n"
    "  - scheme: w4a16\n"
    "    n: 256\n"
    "    k: 512\n"
    "    m: [3, 1, 16, 4, 17, 2]\n"
    "  - scheme: w4a16\n"
    "    kind: moe\n"
    "    experts: 4\n"
    "    top_k: 2\n"
    "    n: 256\n"
    "    k: 512\n"
    "    m: 8\n"
    "  - scheme: w8a16\n"
    "    n: 128\n"
    "    k: 256\n"
    "    m: 100\n";

TEST(TunePlan, EveryConfigForEveryBucketOfEveryDenseCase) {
  const Recipe recipe = parse_recipe(kRecipe, "tune-test.yaml");
  std::vector<std::string> skipped;
  const std::vector<TuneTask> tasks = plan_tuning(recipe, &skipped);
  const std::size_t configs = dispatch::all_candidates().size();
  // Case 0: M 1 2 3 4 16 17 -> buckets 1, 2, 4 (M 3 and 4: timed at 4), 16, 32 (M 17).
  // Case 2: bucket 128 (M 100). The MoE case is left out, with the reason.
  ASSERT_EQ(tasks.size(), 6 * configs);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("MoE"), std::string::npos);
  std::map<std::pair<std::size_t, std::int64_t>, std::set<std::string>> seen;
  for (const TuneTask& task : tasks) {
    EXPECT_EQ(task.bucket, dispatch::m_bucket(task.m));
    seen[{task.case_index, task.bucket}].insert(task.config);
  }
  const std::map<std::pair<std::size_t, std::int64_t>, std::int64_t> expected_m = {
      {{0, 1}, 1}, {{0, 2}, 2}, {{0, 4}, 4}, {{0, 16}, 16}, {{0, 32}, 17}, {{2, 128}, 100}};
  ASSERT_EQ(seen.size(), expected_m.size());
  for (const auto& [key, configs_seen] : seen) EXPECT_EQ(configs_seen.size(), configs);
  for (const TuneTask& task : tasks)
    EXPECT_EQ(task.m, expected_m.at({task.case_index, task.bucket}));
}

TEST(TunePlan, WorkerLinesRoundTrip) {
  CandidateResult result;
  result.status = CandidateStatus::Ok;
  result.kernel = "dense_gemm<...>";
  result.time = summarize({3.0, 1.5, 2.0});
  result.error = 1.25e-3;
  const WorkerMessage back = parse_worker_line(result_line(7, result));
  EXPECT_EQ(back.task, 7u);
  EXPECT_FALSE(back.compiled);
  ASSERT_TRUE(back.result);
  EXPECT_EQ(back.result->status, CandidateStatus::Ok);
  EXPECT_EQ(back.result->kernel, result.kernel);
  EXPECT_EQ(back.result->time->median_us, 2.0);
  EXPECT_EQ(back.result->time->samples, 3);
  EXPECT_EQ(back.result->error, 1.25e-3);

  CandidateResult skipped;
  skipped.status = CandidateStatus::Skipped;
  skipped.reason = "needs 300000 bytes of shared memory";
  const WorkerMessage s = parse_worker_line(result_line(2, skipped));
  EXPECT_EQ(s.result->status, CandidateStatus::Skipped);
  EXPECT_EQ(s.result->reason, skipped.reason);
  EXPECT_FALSE(s.result->time);

  const WorkerMessage c = parse_worker_line(compiled_line(4));
  EXPECT_TRUE(c.compiled);
  EXPECT_EQ(c.task, 4u);
}

TEST(TunePlan, MalformedWorkerLinesAreErrorsNamingTheProblem) {
  const char* lines[] = {"not json",
                         "{}",
                         "{\"task\": -1, \"phase\": \"compiled\"}",
                         "{\"task\": 1, \"phase\": \"started\"}",
                         "{\"task\": 1, \"result\": {\"status\": \"great\"}}",
                         "{\"task\": 1, \"result\": {\"status\": \"ok\", \"us\": null}}"};
  for (const char* line : lines) {
    try {
      parse_worker_line(line);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(error.what()).find("tune worker line"), std::string::npos);
    }
  }
}

CandidateResult candidate(CandidateStatus status, double median_us) {
  CandidateResult result;
  result.status = status;
  if (median_us > 0) result.time = summarize({median_us});
  return result;
}

TEST(TunePlan, WinnerIsTheFastestOkCandidatePerBucket) {
  const Recipe recipe = parse_recipe(kRecipe, "tune-test.yaml");
  const std::vector<TuneTask> tasks = {{0, 1, 1, "decode"},    {0, 1, 1, "decode-k64"},
                                       {0, 1, 1, "decode-s4"}, {0, 4, 4, "decode"},
                                       {0, 4, 4, "medium"},    {2, 100, 128, "medium"}};
  const std::vector<CandidateResult> results = {
      candidate(CandidateStatus::Ok, 12.0),    candidate(CandidateStatus::Ok, 9.5),
      candidate(CandidateStatus::Failed, 1.0),  // faster, but wrong: never a winner
      candidate(CandidateStatus::Hang, 0),     candidate(CandidateStatus::Ok, 30.0),
      candidate(CandidateStatus::Skipped, 0)};
  const std::vector<dispatch::TuningEntry> winners =
      pick_winners(recipe, tasks, results, "2026-12-02T10:00:00Z");
  ASSERT_EQ(winners.size(), 2u);  // case 2's only candidate was skipped
  std::map<std::int64_t, const dispatch::TuningEntry*> by_bucket;
  for (const auto& entry : winners) by_bucket[entry.key.m_bucket] = &entry;
  ASSERT_TRUE(by_bucket.count(1) && by_bucket.count(4));
  EXPECT_EQ(by_bucket[1]->config, "decode-k64");
  EXPECT_EQ(by_bucket[1]->microseconds, 9.5);
  EXPECT_EQ(by_bucket[1]->key, dispatch::make_tuning_key("w4a16", 256, 512, 1));
  EXPECT_EQ(by_bucket[4]->config, "medium");
  EXPECT_EQ(by_bucket[4]->measured_at, "2026-12-02T10:00:00Z");
  EXPECT_THROW(pick_winners(recipe, tasks, {}, "2026-12-02T10:00:00Z"), Error);
}

// A fake worker (a shell script): task 1 hangs after "compiled", task 2 crashes, task 3
// reports a failure and exits as after a lost context, task 5 prints noise first; the others
// succeed with median 10 + task.
const char* kFakeWorker = R"sh(
i=$1
while [ "$i" -lt 7 ]; do
  case $i in
    1) printf '{"task":%d,"phase":"compiled"}\n' "$i"; exec sleep 60 ;;
    2) printf '{"task":%d,"phase":"compiled"}\n' "$i"; exit 9 ;;
    3) printf '{"task":%d,"result":{"status":"failed","reason":"illegal address","kernel":"","us":null,"error":null}}\n' "$i"; exit 4 ;;
    5) echo "some library chatter on stdout" ;;
  esac
  printf '{"task":%d,"phase":"compiled"}\n' "$i"
  printf '{"task":%d,"result":{"status":"ok","reason":"","kernel":"k%d","us":{"median":%d,"min":1,"max":99,"samples":5},"error":0.001}}\n' "$i" "$i" $((10 + i))
  i=$((i + 1))
done
)sh";

TEST(TuneSupervisor, HangsAndCrashesAreRecordedAndTheRunGoesOn) {
  std::vector<TuneTask> tasks(7, TuneTask{0, 1, 1, "decode"});
  std::vector<std::size_t> starts;
  std::vector<std::size_t> progress;
  SupervisorOptions options;
  options.worker_command = [&](std::size_t from) {
    starts.push_back(from);
    return std::vector<std::string>{"/bin/sh", "-c", kFakeWorker, "fake-worker",
                                    std::to_string(from)};
  };
  options.deadline_s = 1.0;
  options.compile_deadline_s = 30.0;
  options.progress = [&](std::size_t done, std::size_t total) {
    EXPECT_EQ(total, tasks.size());
    progress.push_back(done);
  };
  const auto started = std::chrono::steady_clock::now();
  const std::vector<CandidateResult> results = supervise_tuning(tasks, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(results.size(), tasks.size());
  EXPECT_EQ(results[0].status, CandidateStatus::Ok);
  EXPECT_EQ(results[0].time->median_us, 10.0);
  EXPECT_EQ(results[1].status, CandidateStatus::Hang);
  EXPECT_NE(results[1].reason.find("1 s"), std::string::npos) << results[1].reason;
  EXPECT_EQ(results[2].status, CandidateStatus::Failed);
  EXPECT_NE(results[2].reason.find("exit status 9"), std::string::npos) << results[2].reason;
  EXPECT_EQ(results[3].status, CandidateStatus::Failed);
  EXPECT_EQ(results[3].reason, "illegal address");
  for (std::size_t i : {4u, 5u, 6u}) {
    EXPECT_EQ(results[i].status, CandidateStatus::Ok) << i;
    EXPECT_EQ(results[i].time->median_us, 10.0 + i) << i;
    EXPECT_EQ(results[i].kernel, "k" + std::to_string(i));
  }
  // A new worker after the hang (at 2), the crash (at 3) and the lost context (at 4).
  EXPECT_EQ(starts, (std::vector<std::size_t>{0, 2, 3, 4}));
  EXPECT_EQ(progress, (std::vector<std::size_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_LT(seconds, 20.0);  // the hang cost its deadline, not the worker's 60 s sleep
}

}  // namespace
}  // namespace qgemm::bench
