// Event timing for the standalone device benches (bench/read_ceiling.cu, bench/decode_probe.cu):
// the median over `repeats` launches, each after `flush` (which should evict the L2), the first
// launch discarded (clocks, caches, lazy module loading).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

struct GpuTimer {
  cudaEvent_t start, stop;
  GpuTimer() { cudaEventCreate(&start), cudaEventCreate(&stop); }
  template <typename Launch, typename Flush>
  float median_us(Launch launch, Flush flush, int repeats = 15) {
    std::vector<float> times;
    for (int r = 0; r < repeats + 1; ++r) {
      flush();
      cudaEventRecord(start);
      launch();
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      if (r > 0) times.push_back(ms * 1000.0f);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }
};

// Reads `vectors` 16-byte vectors once (grid-stride, kUnroll loads in flight per thread): the
// L2 flush of the benches and read_ceiling's baseline pattern.
template <int kUnroll>
__global__ void read_ldg(const uint4* data, long long vectors, unsigned* sink) {
  unsigned x = 0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < vectors; i += stride) {
    const uint4 v = __ldcs(data + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) sink[0] = x;  // keeps the loads alive
}

// Deterministic non-zero words: the benches time real bit patterns, never zeros.
__global__ void fill_words(unsigned* data, long long words, unsigned seed) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    data[i] = static_cast<unsigned>(i) * 2654435761u ^ seed;
}
