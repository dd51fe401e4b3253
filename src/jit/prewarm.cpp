#include "jit/prewarm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "qgemm/error.hpp"

namespace qgemm::jit {

void for_each_on_threads(std::size_t items, int jobs,
                         const std::function<void(std::size_t)>& body) {
  std::atomic<std::size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto worker = [&] {
    try {
      for (std::size_t i = next++; i < items; i = next++) body(i);
    } catch (...) {
      std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = items;  // the others stop at their next item
    }
  };
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t threads = std::max<std::size_t>(1, std::min<std::size_t>(jobs, items));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

std::vector<PrewarmResult> prewarm(KernelCache& cache, const std::vector<KernelSpec>& specs,
                                   int jobs,
                                   const std::function<void(std::size_t, std::size_t)>& progress) {
  std::vector<PrewarmResult> results(specs.size());
  std::size_t done = 0;
  std::mutex progress_mutex;
  for_each_on_threads(specs.size(), jobs, [&](std::size_t i) {
    PrewarmResult& result = results[i];
    result.spec = specs[i];
    const auto start = std::chrono::steady_clock::now();
    try {
      result.lookup = cache.get(specs[i]);
    } catch (const std::exception& error) {
      result.error = error.what();
    }
    result.elapsed_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard lock(progress_mutex);
    ++done;
    if (progress) progress(done, specs.size());
  });
  return results;
}

void print_progress_bar(std::size_t done, std::size_t total) {
  constexpr std::size_t kWidth = 30;
  const std::size_t filled = total ? done * kWidth / total : kWidth;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '-').c_str(), done, total);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace qgemm::jit
