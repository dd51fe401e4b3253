#include "jit/prewarm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "qgemm/error.hpp"

namespace qgemm::jit {

std::vector<PrewarmResult> prewarm(KernelCache& cache, const std::vector<KernelSpec>& specs,
                                   int jobs,
                                   const std::function<void(std::size_t, std::size_t)>& progress) {
  std::vector<PrewarmResult> results(specs.size());
  std::atomic<std::size_t> next{0};
  std::size_t done = 0;
  std::mutex progress_mutex;
  const auto worker = [&] {
    for (std::size_t i = next++; i < specs.size(); i = next++) {
      PrewarmResult& result = results[i];
      result.spec = specs[i];
      const auto start = std::chrono::steady_clock::now();
      try {
        result.lookup = cache.get(specs[i]);
      } catch (const std::exception& error) {
        result.error = error.what();
      }
      result.elapsed_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      std::lock_guard lock(progress_mutex);
      ++done;
      if (progress) progress(done, specs.size());
    }
  };
  const int threads = std::max(1, std::min<int>(jobs, static_cast<int>(specs.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
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
