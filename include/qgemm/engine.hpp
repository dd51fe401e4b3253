// qgemm::Engine: one per GPU. Prepares quantized weights into the kernel layout on that device
// and runs GEMMs on the caller's stream.
//
//   qgemm::Engine engine(0);
//   qgemm::QuantWeight w = engine.prepare_weight(qgemm::quantize_weight(scheme.weight, ...));
//   engine.gemm({a_ptr, M, K, K, qgemm::formats::bf16}, w, {c_ptr, M, N, N, scheme.output},
//               stream);
//
// gemm() issues kernels on `stream` (a CUstream / cudaStream_t, null = the legacy default
// stream) and returns without synchronizing; it allocates no host memory once a shape has run
// once, so warmed-up calls can be captured into a CUDA graph.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "qgemm/quant.hpp"

namespace qgemm {

// A row-major matrix in device memory: element (r, c) at data + (r · stride + c) · bytes.
struct DeviceMatrix {
  void* data = nullptr;
  std::int64_t rows = 0, cols = 0, stride = 0;
  Format dtype = formats::bf16;
};

struct GemmOptions {
  const float* bias = nullptr;  // device fp32 [N], or null
  // A tile config by name (src/dispatch/dense_config.cpp), for benches and the tuner; empty:
  // the built-in heuristic chooses.
  std::string tile_config;
};

namespace detail {
struct PreparedWeight;
}

class QuantWeight {
 public:
  QuantWeight() = default;
  std::int64_t n() const;
  std::int64_t k() const;
  const WeightQuant& quant() const;
  std::size_t device_bytes() const;  // the prepared weight's device memory
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<const detail::PreparedWeight> impl_;
  friend class Engine;
};

class Engine {
 public:
  explicit Engine(int device = 0);  // Error(NoDevice) when there is no such GPU
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int device() const;
  int sm_count() const;

  // Repacks a canonical packed weight into the kernel layout and uploads it.
  QuantWeight prepare_weight(const PackedWeight& weight);

  // C = A · Wᵀ (+ bias) in the activation type of A (bf16 or fp16) and the output type of C
  // (fp16, bf16, fp32). Shapes and types are checked; a combination no kernel serves is
  // Error(Unsupported) naming the reason.
  void gemm(const DeviceMatrix& a, const QuantWeight& weight, const DeviceMatrix& c, void* stream,
            const GemmOptions& options = {});

  // Compiles (or finds in the cache) the kernel gemm() would launch for M rows, without
  // launching it. Thread-safe: several threads compile different kernels concurrently.
  void warm_up(std::int64_t m, const QuantWeight& weight, const Format& activation,
               const Format& output, const GemmOptions& options = {}) const;

  // The kernel spec gemm() would launch for M rows against `weight` (for logs and benches).
  std::string kernel_for(std::int64_t m, const QuantWeight& weight, const Format& activation,
                         const Format& output, const GemmOptions& options = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qgemm
