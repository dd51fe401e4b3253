// The dequantize + cuBLAS path (the fallback of the dense GEMM, and the faster path for large M
// until the wgmma kernels come): the prepared mma weight is dequantized chunk by chunk of N into
// a 16-bit [chunk][K] buffer that cuBLAS multiplies; where cuBLAS cannot write C directly (a
// bias, row factors of quantized activations, or an output type other than the activation's and
// fp32) it writes fp32 sums that finish_gemm turns into C.
//
//   for each chunk of N:  mma_dequantize  words ──► W16[chunk][K]            (this file)
//                         cuBLAS          C(or sums)[M][chunk] = A · W16ᵀ · global_scale
//                         finish_gemm     sums · row factor + bias ──► C[M][chunk]   (this file)
//
// finish_gemm: one thread per output element, grid-stride, consecutive threads on consecutive
// columns (coalesced). mma_dequantize: one thread per lane of a (slice, k16 block), see below.
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/dequant_cublas_args.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "ptx/convert.cuh"
#include "util/number_codec.cuh"

namespace qgemm::kernels {

// value(n, k) = (u − zero) · scale for integers, decode(u) · scale for floats, rounded once to
// 16 bits, as layout::mma_weight_value computes on the host. One thread per (slice, k16 block,
// lane) of the chunk: it reads the lane's `bits` words (consecutive lanes, consecutive words)
// and its 8 columns' scales, dequantizes its 32 codes in registers (dequantize_lane, the tiled
// kernel's fp32 path) and writes them as 16 pairs of k: per warp 64 rows × 32 bytes, whole
// sectors.
template <unsigned long long kWeightFormat, int kZeroMode, int kOutput, int kThreads,
          int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) mma_dequantize_kernel(MmaDequantizeArgs args) {
  constexpr int bits = FormatCode::unpack(kWeightFormat).bits;
  static_assert(kDynamicSmemBytes == 0, "mma_dequantize uses no shared memory");
  static_assert(kOutput == kOutBf16 || kOutput == kOutFp16, "16-bit output");
  const long long first_slice = args.n_begin / MmaWeightLayout::kSliceN;
  const long long slices = (args.rows + MmaWeightLayout::kSliceN - 1) / MmaWeightLayout::kSliceN;
  const long long total = slices * args.k_blocks * 32;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const int lane = static_cast<int>(index % 32);
    const long long kb = index / 32 % args.k_blocks;
    const long long slice = first_slice + index / 32 / args.k_blocks;
    const unsigned* lane_words =
        args.words + MmaWeightLayout::word_index(slice, kb, args.k_blocks, lane, bits);
    unsigned words[bits];
#pragma unroll
    for (int w = 0; w < bits; ++w) words[w] = lane_words[w];
    const long long group = args.group_size == 0 ? 0 : kb * 16 / args.group_size;
    const long long at = group * args.n_padded + slice * 64 + (lane / 4) * 8;
    float scales[8], zeros[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      scales[j] = args.scales[at + j];
      zeros[j] = args.zeros ? args.zeros[at + j] : 0.0f;
    }
    unsigned out[8][2];
    dequantize_lane<kWeightFormat, kZeroMode, kOutput == kOutBf16>(words, scales, zeros, out);
    // Element (n, k) of the pairs: n = slice · 64 + j · 8 + lane / 4, k = kb · 16 + 2 · (lane %
    // 4) + 8 · r, and k + 1 in the high half.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const long long row = slice * 64 + j * 8 + lane / 4 - args.n_begin;
      if (row >= args.rows) continue;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const long long k = kb * 16 + 2 * (lane % 4) + 8 * r;
        unsigned short* at_out = args.out + row * args.k + k;
        if (k + 1 < args.k && args.k % 2 == 0) {
          *reinterpret_cast<unsigned*>(at_out) = out[j][r];
        } else {
          if (k < args.k) at_out[0] = static_cast<unsigned short>(out[j][r]);
          if (k + 1 < args.k) at_out[1] = static_cast<unsigned short>(out[j][r] >> 16);
        }
      }
    }
  }
}

template <int kOutput, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) finish_gemm_kernel(FinishGemmArgs args) {
  static_assert(kDynamicSmemBytes == 0, "finish_gemm uses no shared memory");
  const long long total = args.m * args.cols;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const long long row = index / args.cols;
    const long long col = index - row * args.cols;
    float v = args.sums[index];
    if (args.row_factors) v *= args.row_factors[row];
    if (args.bias) v += args.bias[args.n_begin + col];
    const long long at = row * args.ldc + col;
    if constexpr (kOutput == kOutFp32) {
      static_cast<float*>(args.c)[at] = v;
    } else {
      static_cast<unsigned short*>(args.c)[at] =
          kOutput == kOutBf16 ? ptx::float_to_bf16_bits(v) : ptx::float_to_fp16_bits(v);
    }
  }
}

}  // namespace qgemm::kernels
