// The L2 flush between timed calls, shared by `qgemm bench` / `qgemm tune` (gpu_timing.hpp)
// and the kernel-development bench (bench/dense_bench.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/device_memory.hpp"

namespace qgemm::bench {

// Replaces the whole L2 between timed calls by streaming twice its size through it.
//
// The stream is a read (cublasSasum over the buffer, result kept on the device), not a memset:
// a memset leaves the L2 full of dirty lines, and the timed call would then pay for writing
// them back to HBM as its own reads evict them (up to a whole L2 of extra traffic, most of it
// for the short memory-bound calls a decode bake-off is about). A read leaves clean lines, and
// the dirty lines the previous call left (its output) are written back during the flush,
// outside the timed window.
class L2Flusher {
 public:
  explicit L2Flusher(std::int64_t l2_bytes);
  ~L2Flusher();
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush(cudaStream_t stream);
  std::int64_t bytes() const { return static_cast<std::int64_t>(buffer_.bytes()); }

 private:
  runtime::DeviceBuffer buffer_, sum_;
  void* cublas_ = nullptr;  // cublasHandle_t
};

}  // namespace qgemm::bench
