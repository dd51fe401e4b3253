// Row-parallel loops for the host quantizer: plain std::thread, one contiguous chunk of rows
// per hardware thread, and only when the work is large enough to repay starting threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qgemm::quant_detail {

// Below this many elements a single thread finishes before a pool would have started.
inline constexpr std::int64_t kParallelThreshold = std::int64_t{1} << 20;

// Calls body(row_begin, row_end) over [0, rows) in disjoint chunks. `elements_per_row` decides
// whether threads are worth it. The first exception thrown by any chunk is rethrown here.
template <class Body>
void parallel_rows(std::int64_t rows, std::int64_t elements_per_row, Body&& body) {
  if (rows <= 0) return;
  const std::int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t workers =
      rows * elements_per_row < kParallelThreshold ? 1 : std::min<std::int64_t>(hardware, rows);
  if (workers == 1) {
    body(std::int64_t{0}, rows);
    return;
  }
  std::exception_ptr first_error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers));
  const std::int64_t chunk = (rows + workers - 1) / workers;
  for (std::int64_t begin = 0; begin < rows; begin += chunk) {
    const std::int64_t end = std::min(rows, begin + chunk);
    threads.emplace_back([&, begin, end] {
      try {
        body(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace qgemm::quant_detail
