// `qgemm tune`'s plan and bookkeeping, without a GPU: which candidates a recipe asks for, the
// line protocol between the tuner and its worker process, and the winners that become tuning
// table entries (dispatch/tuning_table.hpp).
//
// Candidates: for every dense case, every distinct M bucket of its M list (dispatch::m_bucket;
// each timed at the largest of the recipe's M values in it), every candidate of
// dispatch::all_candidates() (the kernel configs, dequantize + cuBLAS, cuBLASLt FP8). MoE cases
// have no candidates yet and are left out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/recipe.hpp"
#include "bench/results.hpp"
#include "dispatch/tuning_table.hpp"

namespace qgemm::bench {

struct TuneTask {
  std::size_t case_index = 0;
  std::int64_t m = 0;       // the M it is timed at
  std::int64_t bucket = 0;  // dispatch::m_bucket(m)
  std::string config;       // a dispatch::all_candidates() name
};

// The tasks in order: case, bucket (ascending), config (catalog order). `skipped` (when given)
// receives one line per case left out, with the reason.
std::vector<TuneTask> plan_tuning(const Recipe& recipe,
                                  std::vector<std::string>* skipped = nullptr);

enum class CandidateStatus {
  Ok,
  Skipped,  // the config cannot serve this problem (its unsupported_reason, or the Engine's)
  Failed,   // an error, a wrong result, or the worker died on it
  Hang,     // no result before the deadline: the worker was killed
};
std::string to_string(CandidateStatus status);  // "ok" "skipped" "failed" "hang"

struct CandidateResult {
  CandidateStatus status = CandidateStatus::Failed;
  std::string reason;
  std::string kernel;
  std::optional<TimingStats> time;
  std::optional<double> error;
};

// The worker's stdout protocol, one JSON object per line:
//   {"task": i, "phase": "compiled"}             the timed part of task i starts now
//   {"task": i, "result": {...CandidateResult}}  task i is done
struct WorkerMessage {
  std::size_t task = 0;
  bool compiled = false;                  // a "compiled" line
  std::optional<CandidateResult> result;  // a result line
};
std::string compiled_line(std::size_t task);
std::string result_line(std::size_t task, const CandidateResult& result);
// Error(InvalidArgument) naming the problem for a line that is not one of the above.
WorkerMessage parse_worker_line(const std::string& line);

// The fastest ok candidate of every (case, bucket), as table entries keyed by the case's scheme
// (canonical text), N, K and the bucket. `results[i]` belongs to `tasks[i]`.
std::vector<dispatch::TuningEntry> pick_winners(const Recipe& recipe,
                                                const std::vector<TuneTask>& tasks,
                                                const std::vector<CandidateResult>& results,
                                                const std::string& measured_at);

// Every candidate with its outcome, for --report: {"recipe", "machine", "candidates": [{"case",
// "label", "scheme", "n", "k", "m", "bucket", "config", "status", "reason", "kernel", "us",
// "error"}, ...]}.
std::string tune_report_json(const Recipe& recipe, const dispatch::MachineKey& machine,
                             const std::vector<TuneTask>& tasks,
                             const std::vector<CandidateResult>& results);

}  // namespace qgemm::bench
