// cuBLAS for the dequantize + cuBLAS path of the dense GEMM (src/api/engine.cpp): one handle per
// engine, set to the caller's stream at each call. cuBLAS uses the context current on the thread
// (the engine's primary context).
#pragma once

#include <cstddef>
#include <cstdint>

#include "qgemm/format.hpp"

namespace qgemm::runtime {

class Cublas {
 public:
  Cublas();  // Error(CudaError) naming the cuBLAS status when the handle cannot be made
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  // C[m][n] (row stride ldc, type c_type: fp32, or the type of A and W) = alpha · A · Wᵀ with
  // fp32 accumulation, for row-major A[m][k] (stride lda) and W[n][k] (stride ldw) of the same
  // 16-bit type (bf16 / fp16). Asynchronous on `stream`; cuBLAS's scratch is `workspace` (device
  // memory of the caller's, so that concurrent streams never share it and the call allocates
  // nothing inside a graph capture).
  void gemm_nt(void* stream, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const void* a, std::int64_t lda, const void* w, std::int64_t ldw,
               const Format& input, void* c, std::int64_t ldc, const Format& c_type,
               void* workspace, std::size_t workspace_bytes);

 private:
  void* handle_ = nullptr;
};

}  // namespace qgemm::runtime
