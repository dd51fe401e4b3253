// The watchdog of `qgemm tune`: runs the candidates in a worker process and survives the ones
// that hang or crash it.
//
// Why a worker process: a candidate kernel that hangs cannot be stopped from inside the process
// that launched it (the GPU keeps running it, and everything queued behind it waits), and one
// that faults leaves a sticky error that fails every later call of that CUDA context. So the
// tuner never touches the GPU itself; it starts a worker (`qgemm tune RECIPE --worker-from I`,
// the same binary) that runs tasks I, I+1, ... and reports each on its stdout, one line per
// event (tune_plan.hpp). A task gets `deadline_s` from its "compiled" line (JIT compilation and
// the CPU reference are not timed against it) to its result; on expiry the worker is killed,
// the task recorded as "hang", and a new worker starts at the next task. A worker that dies
// during a task is replaced the same way (the task "failed"); one that exits with
// kWorkerContextLost has reported its task already and is simply replaced. The run always
// reaches the end of the plan.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/tune_plan.hpp"

namespace qgemm::bench {

// The worker's exit status after an error that left its CUDA context unusable.
inline constexpr int kWorkerContextLost = 4;

struct SupervisorOptions {
  // The worker's argv (argv[0] a path) for a worker that starts at task `from`.
  std::function<std::vector<std::string>(std::size_t from)> worker_command;
  double deadline_s = 60;           // from "compiled" to the result
  double compile_deadline_s = 900;  // from the task's start to "compiled" (JIT, preparation)
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// The tuner: one result per task, in order.
std::vector<CandidateResult> supervise_tuning(const std::vector<TuneTask>& tasks,
                                              const SupervisorOptions& options);

}  // namespace qgemm::bench
