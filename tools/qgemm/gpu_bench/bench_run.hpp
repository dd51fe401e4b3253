// The timed bake-off of a recipe: every run (case × M × backend) through measure(), in recipe
// order, one progress line per run on stderr. A run that cannot be served is recorded
// (unsupported, failed, skipped, with the reason) and the recipe goes on; only a lost CUDA
// context (a sticky error: every later call would fail) stops the timing, and the remaining runs
// are recorded as skipped with that reason.
#pragma once

#include <cstdint>

#include "bench/recipe.hpp"
#include "bench/results.hpp"

namespace qgemm::bench {

BenchDocument run_bench(const Recipe& recipe, std::uint64_t seed, int device = 0);

}  // namespace qgemm::bench
