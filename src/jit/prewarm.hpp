// Compiling many specs through a cache on a pool of threads (`qgemm cache prewarm`,
// `qgemm compile --all --jobs N`).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "jit/cache.hpp"

namespace qgemm::jit {

struct PrewarmResult {
  KernelSpec spec;
  CacheLookup lookup;     // empty kernel when the compile failed
  std::string error;      // the failure's message
  double elapsed_ms = 0;  // wall time of this spec's cache lookup (compile, disk read or hit)
};

// body(i) for every i in [0, items) on `jobs` threads (≤ 0: the hardware's), the caller's
// among them, each taking the next i when it finishes one (compiles differ in length). The
// first exception a body throws is rethrown once every thread has stopped; after it no thread
// takes a new i.
void for_each_on_threads(std::size_t items, int jobs, const std::function<void(std::size_t)>& body);

// Results in the order of `specs`, compiled on `jobs` threads (≤ 0: the hardware's).
// `progress(done, total)` is called after each spec, from the worker threads, one call at a
// time. Failures are collected, not thrown.
std::vector<PrewarmResult> prewarm(
    KernelCache& cache, const std::vector<KernelSpec>& specs, int jobs,
    const std::function<void(std::size_t, std::size_t)>& progress = {});

// A one-line progress bar on stderr ("\r[#####-----] 12/20 "), for `progress`.
void print_progress_bar(std::size_t done, std::size_t total);

}  // namespace qgemm::jit
