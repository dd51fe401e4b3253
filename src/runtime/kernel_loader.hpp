// Compiled kernels -> functions of the current CUDA context, and launches.
//
// A module is loaded once per (context, kernel): several GPUs (or several contexts) in one
// process each get their own. The lookup on the launch path is a shared-lock hash probe; the
// launch itself is one cuLaunchKernel on the caller's stream, with the argument struct passed
// by pointer from the caller's stack: no host allocation, no synchronization, so a sequence of
// launches can be captured into a CUDA graph.
#pragma once

#include <cuda.h>

#include <functional>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

#include "jit/compiler.hpp"

namespace qgemm::runtime {

struct LoadedKernel {
  CUfunction function = nullptr;
  jit::LaunchShape launch;  // from the spec the kernel was instantiated with
};

struct LaunchGrid {
  unsigned x = 1, y = 1, z = 1;
};

class KernelLoader {
 public:
  // The function of `kernel` in the current context (loading its module on first use).
  // Throws Error(CudaError) when no context is current or the load fails.
  LoadedKernel get(const jit::CompiledKernel& kernel);

  // Milliseconds the last module load took on this thread (0 for a hit), for `qgemm compile`.
  static double last_load_ms();

  static KernelLoader& global();

 private:
  struct Key {
    CUcontext context;
    jit::Hash128 kernel;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHasher {
    std::size_t operator()(const Key& key) const {
      return std::hash<const void*>()(key.context) ^ static_cast<std::size_t>(key.kernel.low);
    }
  };
  std::shared_mutex mutex_;
  std::unordered_map<Key, LoadedKernel, KeyHasher> functions_;
};

// Implementation detail of launch_kernel.
void launch_raw(const LoadedKernel& kernel, LaunchGrid grid, void** params, CUstream stream);

// Launches `kernel` with one argument struct (every qgemm kernel takes exactly one).
template <typename Args>
void launch_kernel(const LoadedKernel& kernel, LaunchGrid grid, const Args& args, CUstream stream) {
  void* params[] = {const_cast<Args*>(&args)};
  launch_raw(kernel, grid, params, stream);
}

}  // namespace qgemm::runtime
