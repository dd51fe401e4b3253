// The dequantize + cuBLAS path (the fallback of the dense GEMM, and the faster path for large M
// until the wgmma kernels come): the prepared mma weight is dequantized chunk by chunk of N into
// a 16-bit [chunk][K] buffer that cuBLAS multiplies; where cuBLAS cannot write C directly (a
// bias, row factors of quantized activations, or an output type other than the activation's and
// fp32) it writes fp32 sums that finish_gemm turns into C.
//
//   for each chunk of N:  mma_dequantize  words ──► W16[chunk][ld]   (gemm/mma_dequantize.cuh)
//                         cuBLAS          C(or sums)[M][chunk] = A · W16ᵀ · global_scale
//                         finish_gemm     sums · row factor + bias ──► C[M][chunk]   (this file)
//
// finish_gemm: one thread per output element, grid-stride, consecutive threads on consecutive
// columns (coalesced).
#pragma once

#include "gemm/dense_gemm_params.cuh"
#include "gemm/dequant_cublas_args.cuh"
#include "ptx/convert.cuh"

namespace qgemm::kernels {

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
