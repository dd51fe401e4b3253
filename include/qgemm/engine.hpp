// qgemm::Engine: one per GPU. Prepares quantized weights into the kernel layout on that device
// and runs GEMMs on the caller's stream.
//
//   qgemm::Engine engine(0);
//   qgemm::QuantWeight w = engine.prepare_weight(qgemm::quantize_weight(scheme.weight, ...));
//   engine.gemm({a_ptr, M, K, K, qgemm::formats::bf16}, w, {c_ptr, M, N, N, scheme.output},
//               stream);
//
// Quantized activations (the A8/A4 schemes): prepare the weight with the scheme's activation
// part, and gemm() quantizes a bf16/fp16 A on the fly, as the scheme says:
//
//   qgemm::QuantWeight w = engine.prepare_weight(packed, scheme.activation);
//   engine.gemm({a_bf16, M, K, K, qgemm::formats::bf16}, w, c, stream);
//
// or pass activations quantized earlier (a fused norm + quantize kernel) as a DeviceActivation.
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

// Quantized activations on the device in the canonical packed form (include/qgemm/quant.hpp):
// codes row-major [rows, cols], rows ceil(cols · bits / 8) bytes apart; scales the activation
// scale grid's codes in quant.scale_format (StaticTensor: one scale).
struct DeviceActivation {
  ActivationQuant quant;
  const void* codes = nullptr;
  const void* scales = nullptr;
  std::int64_t rows = 0, cols = 0;
  double tensor_scale = 1.0;  // NV: the fp32 tensor scale; else 1
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
  // How gemm() quantizes a bf16/fp16 A for this weight (not quantized: A is used as given).
  const ActivationQuant& activation() const;
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

  // Repacks a canonical packed weight into the kernel layout and uploads it. `activation` says
  // how gemm() quantizes bf16/fp16 activations for it (the scheme's activation part; default:
  // not at all). StaticTensor takes `static_activation_scale` (the calibrated scale; <= 0: each
  // call's tensor absmax, as quantize_activation does).
  QuantWeight prepare_weight(const PackedWeight& weight, const ActivationQuant& activation = {},
                             double static_activation_scale = 0.0);

  // C = A · Wᵀ (+ bias) in the activation type of A (bf16 or fp16) and the output type of C
  // (fp16, bf16, fp32). Shapes and types are checked; a combination no kernel serves is
  // Error(Unsupported) naming the reason.
  void gemm(const DeviceMatrix& a, const QuantWeight& weight, const DeviceMatrix& c, void* stream,
            const GemmOptions& options = {});
  // The same with activations quantized beforehand (any quantized ActivationQuant; the weight's
  // own activation() is not consulted).
  void gemm(const DeviceActivation& a, const QuantWeight& weight, const DeviceMatrix& c,
            void* stream, const GemmOptions& options = {});

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
