// `qgemm tune`: times every candidate tile config (tools/harness/bench/tune_plan.hpp) and keeps the
// fastest correct one per (scheme, N, K, M bucket).
//
// The candidates run in a worker process under a watchdog: tools/harness/bench/tune_supervisor.hpp says
// why and how. This is the worker.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/recipe.hpp"
#include "bench/tune_plan.hpp"
#include "bench/tune_supervisor.hpp"

namespace qgemm::bench {

// The worker: runs tasks[from..] on GPU 0 and writes the protocol to stdout. Returns its exit
// status: 0 done, kWorkerContextLost after an error that left the CUDA context unusable.
int run_tune_worker(const Recipe& recipe, const std::vector<TuneTask>& tasks, std::size_t from,
                    std::uint64_t seed);

}  // namespace qgemm::bench
