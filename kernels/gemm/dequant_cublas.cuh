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
// Both kernels: one thread per output element, grid-stride; consecutive threads take
// consecutive columns, so the outputs are written coalesced. mma_dequantize reads the lane words
// scattered, through L1 (32 threads of a row segment touch 2 lanes' words).
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/dequant_cublas_args.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "ptx/convert.cuh"
#include "util/number_codec.cuh"

namespace qgemm::kernels {

// value(n, k) = (u − zero) · scale for integers, decode(u) · scale for floats, as
// layout::mma_weight_value computes on the host.
template <unsigned long long kWeightFormat, int kZeroMode, int kOutput, int kThreads,
          int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) mma_dequantize_kernel(MmaDequantizeArgs args) {
  constexpr FormatCode format = FormatCode::unpack(kWeightFormat);
  constexpr int bits = format.bits;
  static_assert(kDynamicSmemBytes == 0, "mma_dequantize uses no shared memory");
  static_assert(kOutput == kOutBf16 || kOutput == kOutFp16, "16-bit output");
  const long long total = args.rows * args.k;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const long long row = index / args.k;
    const long long k = index - row * args.k;
    const long long n = args.n_begin + row;
    const int lane = MmaWeightLayout::lane_of(static_cast<int>(n % 64), static_cast<int>(k % 16));
    const int c = MmaWeightLayout::code_of(static_cast<int>(n % 64), static_cast<int>(k % 16));
    const unsigned* lane_words =
        args.words + MmaWeightLayout::word_index(n / 64, k / 16, args.k_blocks, lane, bits);
    const int word = MmaWeightLayout::code_word(c, bits);
    const int first = MmaWeightLayout::code_bits_in_first_word(c, bits);
    unsigned code = (lane_words[word] >> MmaWeightLayout::code_shift(c, bits)) & ((1u << first) - 1u);
    if (first < bits)
      code |= ((lane_words[word + 1] >> (16 * (c % 2))) & ((1u << (bits - first)) - 1u)) << first;
    const long long group = args.group_size == 0 ? 0 : k / args.group_size;
    const long long at = group * args.n_padded + MmaWeightLayout::scale_column(n);
    const float scale = args.scales[at];
    float value;
    if constexpr (format.is_float()) {
      value = decode_to_float<kWeightFormat>(code) * scale;
    } else {
      float unsigned_code = static_cast<float>(code);
      if constexpr (kZeroMode == kZeroConstant) unsigned_code -= static_cast<float>(1 << (bits - 1));
      if constexpr (kZeroMode == kZeroInteger || kZeroMode == kZeroFloat) unsigned_code -= args.zeros[at];
      value = unsigned_code * scale;
    }
    args.out[index] = kOutput == kOutBf16 ? ptx::float_to_bf16_bits(value)
                                          : ptx::float_to_fp16_bits(value);
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
