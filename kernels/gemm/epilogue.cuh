// The output side shared by the dense GEMM kernels (gemm/sm80_dense.cuh, gemm/sm80_decode.cuh):
// row factors (quantized activations), bias, conversion to the output type, and the split-K
// protocol. C[r, c] = sum · global_scale · row_factor[r] + bias[c].
//
// Split-K: every K split of an output tile adds its partial sums into an fp32 workspace with
// atomicAdd; the last block of the tile to arrive (a per-tile counter) reads the sums back,
// applies the global scale and bias, writes C, and returns the workspace tile and the counter to
// zero, so no memset is needed between calls and the launch stays graph-capturable.
#pragma once

#include "gemm/dense_gemm_params.cuh"
#include "ptx/convert.cuh"

namespace qgemm::kernels {

template <int kOutput>
__device__ __forceinline__ unsigned short to_output_half(float v) {
  return kOutput == kOutBf16 ? ptx::float_to_bf16_bits(v) : ptx::float_to_fp16_bits(v);
}

// v rounded to the 16-bit output type and back (what a reader of C would see).
template <int kOutput>
__device__ __forceinline__ float rounded_to_half(float v) {
  return kOutput == kOutBf16 ? ptx::bf16_bits_to_float(ptx::float_to_bf16_bits(v))
                             : ptx::fp16_bits_to_float(ptx::float_to_fp16_bits(v));
}

// (The SM90 wgmma kernel applies the same bias and row factors in its staged epilogue,
// gemm/sm90_wgmma.cuh, with the loads hoisted out of its per-token loop.)
template <int kOutput>
__device__ __forceinline__ void store_single(const DenseGemmParams& p, int row, int col, float v) {
  if (p.row_factors) v *= p.row_factors[row];
  if (p.bias) v += p.bias[col];
  const long long at = static_cast<long long>(row) * p.ldc + col;
  if constexpr (kOutput == kOutFp32) {
    static_cast<float*>(p.c)[at] = v;
  } else {
    static_cast<unsigned short*>(p.c)[at] = to_output_half<kOutput>(v);
  }
}

// Columns col and col + 1 of one row (either may lie past N or M: skipped).
template <int kOutput>
__device__ __forceinline__ void store_pair(const DenseGemmParams& p, int row, int col, float v0,
                                           float v1) {
  if (row >= p.m || col >= p.n) return;
  const bool pair = col + 1 < p.n;
  const long long at = static_cast<long long>(row) * p.ldc + col;
  // One 4-byte store where the pair's address allows it (any C pointer and row stride: an odd
  // stride or a C starting mid-word puts every other row's pairs across words).
  unsigned short* const out = static_cast<unsigned short*>(p.c) + at;
  if (kOutput != kOutFp32 && pair && reinterpret_cast<unsigned long long>(out) % 4 == 0) {
    if (p.row_factors) v0 *= p.row_factors[row], v1 *= p.row_factors[row];
    if (p.bias) v0 += p.bias[col], v1 += p.bias[col + 1];
    *reinterpret_cast<unsigned*>(out) =
        static_cast<unsigned>(to_output_half<kOutput>(v0)) |
        static_cast<unsigned>(to_output_half<kOutput>(v1)) << 16;
    return;
  }
  store_single<kOutput>(p, row, col, v0);
  if (pair) store_single<kOutput>(p, row, col + 1, v1);
}

// One partial sum of a split: into the workspace (rows past M and columns past N skipped).
__device__ __forceinline__ void add_split_pair(const DenseGemmParams& p, int row, int col,
                                               float v0, float v1) {
  if (row >= p.m) return;
  float* at = p.workspace + static_cast<long long>(row) * p.n + col;
  if (col < p.n) atomicAdd(at, v0);
  if (col + 1 < p.n) atomicAdd(at + 1, v1);
}

// Called by every thread of the block once its partial sums are added: the last split of the
// tile (rows [m0, m0 + rows), columns [n0, n0 + cols)) emits it.
template <int kOutput>
__device__ void finish_split_tile(const DenseGemmParams& p, unsigned tile_id, int m0, int rows,
                                  int n0, int cols) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.counters + tile_id, 1u) == gridDim.z - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Read the sums back from L2 (__ldcg: not a stale L1 line), emit, and zero them.
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    const int row = m0 + i / cols, col = n0 + i % cols;
    if (row >= p.m || col >= p.n) continue;
    float* at = p.workspace + static_cast<long long>(row) * p.n + col;
    const float sum = __ldcg(at);
    *at = 0.0f;
    store_single<kOutput>(p, row, col, sum * p.global_scale);
  }
  if (threadIdx.x == 0) p.counters[tile_id] = 0;
}

}  // namespace qgemm::kernels
