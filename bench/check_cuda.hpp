// CHECK_CUDA(call) for the standalone host benches (bench/*_bench.cpp): a CUDA runtime error
// ends the bench with its message (they time one thing; there is nothing to recover).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                    \
  do {                                                                      \
    cudaError_t status_ = (call);                                           \
    if (status_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(status_)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)
