// quantize_activation: bf16/fp16 [m, k] -> 8-bit codes (e4m3, int8, any 8-bit format) with one
// fp32 scale per row (token), scale = absmax(row) / max_finite(format).
//
//   input  [m][k] 16-bit bits        codes [m][k] (canonical packing of 8-bit codes = bytes)
//   scales [m] fp32, row r = scales[r] · decode(codes[r, :])       (an all-zero row: scale 1)
//
// One block per row (grid-stride over rows): pass 1 reduces |x| to the row's absmax (warp
// shuffles, then one value per warp in shared memory); pass 2 encodes x / scale, rounding to
// nearest even (util/number_codec.cuh). Division is IEEE (this family is compiled without
// --use_fast_math) so the codes match the host quantizer's.
#pragma once

#include "ptx/convert.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"
#include "util/utility_args.cuh"

namespace qgemm::kernels {

template <int kInput>
__device__ __forceinline__ float load_half(const unsigned short* base, long long index) {
  if constexpr (kInput == kBf16) {
    return ptx::bf16_bits_to_float(base[index]);
  } else {
    return ptx::fp16_bits_to_float(base[index]);
  }
}

template <unsigned long long kCodeFormat, int kInput, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads)
    quantize_activation_kernel(QuantizeActivationArgs args) {
  constexpr FormatCode code_format = FormatCode::unpack(kCodeFormat);
  static_assert(code_format.bits == 8, "per-token activation codes are 8-bit (one per byte)");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  static_assert(kDynamicSmemBytes == 0, "quantize_activation uses static shared memory only");
  constexpr float max_finite = format_max_finite<kCodeFormat>();
  __shared__ float warp_absmax[kThreads / 32];
  __shared__ float row_scale;

  for (long long row = blockIdx.x; row < args.m; row += gridDim.x) {
    const unsigned short* input = args.input + row * args.k;
    float absmax = 0.0f;
    for (long long col = threadIdx.x; col < args.k; col += kThreads) {
      absmax = fmaxf(absmax, fabsf(load_half<kInput>(input, col)));
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
    }
    if (threadIdx.x % 32 == 0) warp_absmax[threadIdx.x / 32] = absmax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float block_absmax = 0.0f;
      for (int warp = 0; warp < kThreads / 32; ++warp)
        block_absmax = fmaxf(block_absmax, warp_absmax[warp]);
      row_scale = block_absmax > 0.0f ? block_absmax / max_finite : 1.0f;
      args.scales[row] = row_scale;
    }
    __syncthreads();
    const float scale = row_scale;
    unsigned char* codes = args.codes + row * args.k;
    for (long long col = threadIdx.x; col < args.k; col += kThreads) {
      codes[col] = static_cast<unsigned char>(
          encode_quotient<kCodeFormat>(load_half<kInput>(input, col), scale));
    }
    __syncthreads();  // row_scale and warp_absmax are reused by the next row
  }
}

}  // namespace qgemm::kernels
