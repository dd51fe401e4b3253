// qgemm tune: measures the tile configs of every (scheme, N, K, M bucket) of a recipe on GPU 0
// and writes the fastest correct one per key into a tuning table, which the Engine then prefers
// (QGEMM_TUNING_TABLE=TABLE.json or qgemm::use_tuning_table; include/qgemm/tuning.hpp).
//
//   qgemm tune RECIPE.yaml [--out TABLE.json] [--report REPORT.json] [--deadline S] [--seed S]
//
// Each candidate is checked against the CPU reference before it is timed (the recipe's timing
// mode, warm-up and repeats). Candidates run in a worker process (gpu_bench/tune_run.hpp): one
// that cannot serve is skipped with the reason, one that fails or hangs past --deadline is
// recorded and the run goes on. An existing table at --out for this machine is merged into
// (newer measurements win); one of another machine is left alone (error). --report writes
// every candidate with its outcome.
//
// Exit status: 0 a table was written; 1 no candidate succeeded; 2 bad arguments or recipe, or
// --out holds another machine's table; 3 no usable GPU.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "bench/recipe.hpp"
#include "bench/tune_plan.hpp"
#include "check/backend.hpp"
#include "check/check.hpp"
#include "command.hpp"
#include "dispatch/tuned_config.hpp"
#include "dispatch/tuning_table.hpp"
#include "gpu_bench/tune_run.hpp"
#include "jit/prewarm.hpp"
#include "qgemm/error.hpp"
#include "text_table.hpp"

namespace qgemm::cli {
namespace {

struct TuneOptions {
  std::string recipe;
  std::string out = "qgemm_tuning.json";
  std::string report;
  double deadline_s = 60;
  std::optional<std::uint64_t> seed;
  std::optional<std::size_t> worker_from;  // internal: run as the worker from this task
};

// The table to write into: the one at `path` when it is for this machine, else a new one.
dispatch::TuningTable table_to_update(const std::string& path,
                                      const dispatch::MachineKey& machine) {
  dispatch::TuningTable table;
  table.machine = machine;
  if (!std::filesystem::exists(path)) return table;
  dispatch::TuningTable existing = dispatch::load_tuning_table(path);
  const std::string mismatch = dispatch::mismatch_reason(existing.machine, machine);
  if (!mismatch.empty())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("--out {}: holds a table of another machine ({}); choose another "
                            "path rather than overwrite it",
                            path, mismatch));
  return existing;
}

void print_winners(const bench::Recipe& recipe, const std::vector<bench::TuneTask>& tasks,
                   const std::vector<bench::CandidateResult>& results,
                   const std::vector<dispatch::TuningEntry>& winners) {
  std::map<std::pair<std::size_t, std::int64_t>, std::map<std::string, int>> counts;
  for (std::size_t i = 0; i < tasks.size(); ++i)
    ++counts[{tasks[i].case_index, tasks[i].bucket}][bench::to_string(results[i].status)];
  std::vector<std::vector<std::string>> rows = {
      {"case", "M bucket", "M", "best config", "median us", "candidates"}};
  for (const auto& [key, statuses] : counts) {
    const bench::RecipeCase& c = recipe.cases[key.first];
    std::string best = "-", us = "-", m = "-";
    for (const dispatch::TuningEntry& entry : winners) {
      if (entry.key == dispatch::make_tuning_key(c.scheme, c.n, c.k, key.second)) {
        best = entry.config;
        us = fmt::format("{:.2f}", entry.microseconds);
      }
    }
    for (const bench::TuneTask& task : tasks)
      if (task.case_index == key.first && task.bucket == key.second) m = std::to_string(task.m);
    std::string summary;
    for (const auto& [status, count] : statuses)
      summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", count, status);
    rows.push_back({c.label, std::to_string(key.second), m, best, us, summary});
  }
  print_text_table(rows);
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (results[i].status == bench::CandidateStatus::Failed ||
        results[i].status == bench::CandidateStatus::Hang)
      fmt::print("  {} M={} {}: {}: {}\n", recipe.cases[tasks[i].case_index].label, tasks[i].m,
                 tasks[i].config, bench::to_string(results[i].status), results[i].reason);
  }
}

int run(const TuneOptions& options) {
  const bench::Recipe recipe = bench::load_recipe(options.recipe);
  std::vector<std::string> left_out;
  const std::vector<bench::TuneTask> tasks = bench::plan_tuning(recipe, &left_out);
  if (options.worker_from) {
    require(options.seed.has_value(), "tune --worker-from needs --seed");
    // Every candidate is timed: each weight keeps every layout it can hold (QGEMM_WGMMA=1), not
    // only those the model's choices read.
    setenv("QGEMM_WGMMA", "1", 1);
    return bench::run_tune_worker(recipe, tasks, *options.worker_from, *options.seed);
  }
  for (const std::string& line : left_out) std::fprintf(stderr, "qgemm tune: %s\n", line.c_str());
  if (tasks.empty()) {
    std::fprintf(stderr, "qgemm tune: the recipe has nothing to tune\n");
    return kExitInvalid;
  }
  require(options.deadline_s > 0, "--deadline {} (rule: a positive number of seconds)",
          options.deadline_s);
  const check::GpuProbe gpu = check::probe_gpu();
  if (!gpu.usable) {
    std::fprintf(stderr, "qgemm tune: tuning needs a GPU: %s\n", gpu.detail.c_str());
    return kExitUnavailable;
  }
  // The driver is initialized here, but no context is made: the GPU work is the worker's.
  const dispatch::MachineKey machine = dispatch::machine_key(runtime::device_info(0));
  dispatch::TuningTable table = table_to_update(options.out, machine);
  const std::uint64_t seed = options.seed ? *options.seed : check::fresh_seed();
  std::fprintf(stderr, "qgemm tune: %zu candidates on %s; seed %llu\n", tasks.size(),
               machine.gpu.c_str(), static_cast<unsigned long long>(seed));

  bench::SupervisorOptions supervisor;
  supervisor.worker_command = [&](std::size_t from) {
    return std::vector<std::string>{
        "/proc/self/exe",     "tune",   options.recipe,      "--worker-from",
        std::to_string(from), "--seed", std::to_string(seed)};
  };
  supervisor.deadline_s = options.deadline_s;
  supervisor.progress = jit::print_progress_bar;
  const std::vector<bench::CandidateResult> results = bench::supervise_tuning(tasks, supervisor);
  std::fputc('\n', stderr);

  const std::vector<dispatch::TuningEntry> winners =
      bench::pick_winners(recipe, tasks, results, dispatch::utc_timestamp_now());
  for (const dispatch::TuningEntry& entry : winners) table.insert(entry);
  if (!options.report.empty()) {
    std::ofstream report(options.report, std::ios::binary | std::ios::trunc);
    report << bench::tune_report_json(recipe, machine, tasks, results);
    if (!report.flush())
      throw Error(ErrorCode::IoError,
                  fmt::format("--report {}: cannot write the file", options.report));
  }
  print_winners(recipe, tasks, results, winners);
  if (winners.empty()) {
    std::fprintf(stderr, "qgemm tune: no candidate succeeded; %s not written\n",
                 options.out.c_str());
    return kExitFailed;
  }
  dispatch::save_tuning_table(table, options.out);
  fmt::print("tuning table {} ({} entries); use it with QGEMM_TUNING_TABLE={}\n", options.out,
             table.entries.size(), options.out);
  return kExitOk;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<TuneOptions>();
  CLI::App* command = app.add_subcommand(
      "tune", "Time the tile configs of a recipe's shapes on GPU 0 and write a tuning table");
  command->add_option("recipe", options->recipe, "Recipe file (YAML)")->required();
  command->add_option("--out", options->out, "Tuning table to write or update")
      ->capture_default_str();
  command->add_option("--report", options->report, "Write every candidate's outcome (JSON)");
  command
      ->add_option("--deadline", options->deadline_s,
                   "Seconds a candidate's timed part may take before it counts as hung")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "Seed of the random inputs (default: fresh)");
  command->add_option("--worker-from", options->worker_from)->group("");  // internal
  command->callback([options, &status] {
    try {
      status = run(*options);
    } catch (const Error& error) {
      status = report_error("tune", error);
    }
  });
});

}  // namespace
}  // namespace qgemm::cli
