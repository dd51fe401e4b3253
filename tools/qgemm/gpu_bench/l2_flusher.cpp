#include "gpu_bench/l2_flusher.hpp"

#include <cublas_v2.h>

#include <algorithm>

#include "gpu_bench/baselines.hpp"

namespace qgemm::bench {

L2Flusher::L2Flusher(std::int64_t l2_bytes)
    : buffer_(static_cast<std::size_t>(std::max<std::int64_t>(2 * l2_bytes, 8 << 20))),
      sum_(sizeof(float)) {
  buffer_.fill_bytes(0x3C);  // finite floats (0.0115), so the sum stays a number
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate (L2 flush)");
  cublas_ = handle;
  // The sum goes to device memory: the flush never waits for the host.
  check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
}

L2Flusher::~L2Flusher() {
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
}

void L2Flusher::flush(cudaStream_t stream) {
  const auto handle = static_cast<cublasHandle_t>(cublas_);
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream (L2 flush)");
  check_cublas(cublasSasum(handle, static_cast<int>(buffer_.bytes() / sizeof(float)),
                           buffer_.as<const float>(), 1, sum_.as<float>()),
               "cublasSasum (L2 flush)");
}

}  // namespace qgemm::bench
