// Conversions between fp32 and the 16-bit float types as raw bit patterns (uint16), one PTX
// instruction each where the architecture has it. Kernels keep 16-bit values as `unsigned short`
// so that no CUDA runtime header (cuda_fp16.h / cuda_bf16.h) is needed: NVRTC 13 does not ship
// them as builtin headers.
//
//   fp32 ──cvt.rn.bf16.f32 (sm_80+; bit trick below sm_80)──► bf16 bits
//   fp32 ──cvt.rn.f16.f32──────────────────────────────────► fp16 bits
//   bf16 bits ──<< 16──► fp32            fp16 bits ──cvt.f32.f16──► fp32
//   fp32 pair ──cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (sm_89+)──► two 8-bit float codes
#pragma once

namespace qgemm::ptx {

__device__ __forceinline__ unsigned short float_to_bf16_bits(float value) {
#if __CUDA_ARCH__ >= 800
  unsigned short bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
#else
  // Round to nearest even on the upper half; NaN stays a quiet NaN.
  unsigned int word = __float_as_uint(value);
  if ((word & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<unsigned short>(word >> 16);
#endif
}

__device__ __forceinline__ unsigned short float_to_fp16_bits(float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}

__device__ __forceinline__ float bf16_bits_to_float(unsigned short bits) {
  return __uint_as_float(static_cast<unsigned int>(bits) << 16);
}

__device__ __forceinline__ float fp16_bits_to_float(unsigned short bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
  return value;
}

#if __CUDA_ARCH__ >= 890
// Two fp32 values -> OCP e4m3 (kE5m2 false) or e5m2 codes, `low`'s in bits 0-7 and `high`'s in
// bits 8-15: round to nearest even, finite values beyond the largest finite one saturate to it,
// NaN gives NaN. One instruction for the pair (PTX puts its first source in the upper half).
template <bool kE5m2>
__device__ __forceinline__ unsigned short float2_to_fp8x2_bits(float low, float high) {
  unsigned short bits;
  if constexpr (kE5m2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(bits) : "f"(high), "f"(low));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(bits) : "f"(high), "f"(low));
  }
  return bits;
}
#endif

}  // namespace qgemm::ptx
