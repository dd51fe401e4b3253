// Register-level dequantization for the SM90 wgmma family: one thread's 32 offset codes of a
// (tile, chunk) (gemm/wgmma_weight_layout.cuh) -> the 16 registers of its wgmma A fragments for
// the chunk's four k16 steps, scaled:
//
//   frag[kb][r]   k16 step kb, register r (a0..a3) = pair p = kb · 4 + r (codes 2p, 2p + 1);
//                 row half r & 1: the thread's row g (0) or g + 8 (1), whose scale and zero it
//                 takes
//
//   fp32      any format, any zero: each code through dequantize_value (dequant/mma_dequant.cuh),
//             the fp32 product packed to 16 bits (about 8 instructions a pair)
//   packed16  integers of ≤ 7 bits with scales exact in the activation type: base + u in both
//             halves, (x − (base + zero)) exact, × scale rounded once (3 a pair)
//   float16   float codes that the activation type holds by placement, scales exact there: the
//             placed code × 2^(bias_act − bias) (exact), × scale rounded once (about 5 a pair)
//
// Every path rounds the exact (u − zero) · scale once to 16 bits, as the fp32 path does (its
// product is exact whenever the others apply). Unscaled (kScaled false: the kernel scales the
// group's fp32 sums instead, gemm/sm90_wgmma_shape.cuh's wgmma_promotes_scales), the packed
// paths stop before the scale: u − zero and the placed float code are exact in 16 bits.
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/sm90_wgmma_shape.cuh"  // enum WgmmaDequant

namespace qgemm::kernels {

// The factors of one scale group for the thread's two rows (h = 0: row g, 1: row g + 8): the
// fp32 scale and zero, or the 16-bit pairs the packed paths multiply and add.
struct WgmmaGroupFactors {
  float scale[2], zero[2];
  unsigned scale_pair[2], offset_pair[2];
};

template <unsigned long long kFormat, int kZeroMode, int kDequant, bool kBf16>
__device__ __forceinline__ WgmmaGroupFactors wgmma_group_factors(float2 scales, float2 zeros) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  WgmmaGroupFactors out;
  out.scale[0] = scales.x, out.scale[1] = scales.y;
  out.zero[0] = zeros.x, out.zero[1] = zeros.y;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kDequant == kWgmmaPacked16) {
      static_assert(!f.is_float() && f.bits <= 7 && kZeroMode != kZeroFloat,
                    "packed16 serves integers of at most 7 bits with integer zero points");
      constexpr float kBase = kBf16 ? 128.0f : 1024.0f;
      float zero = 0.0f;
      if constexpr (kZeroMode == kZeroConstant) zero = static_cast<float>(1 << (f.bits - 1));
      if constexpr (kZeroMode == kZeroInteger) zero = out.zero[h];
      out.offset_pair[h] = ptx::pack_pair<kBf16>(-(kBase + zero), -(kBase + zero));
      out.scale_pair[h] = ptx::pack_pair<kBf16>(out.scale[h], out.scale[h]);
    } else if constexpr (kDequant == kWgmmaFloat16) {
      out.offset_pair[h] = 0u;
      out.scale_pair[h] = ptx::pack_pair<kBf16>(out.scale[h], out.scale[h]);
    } else {
      out.offset_pair[h] = out.scale_pair[h] = 0u;
    }
  }
  return out;
}

// Register r of step kb (pair p = kb · 4 + r) from `factors` (the group of step kb).
template <unsigned long long kFormat, int kZeroMode, int kDequant, bool kBf16, bool kScaled = true>
__device__ __forceinline__ unsigned wgmma_dequant_pair(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], int p,
    const WgmmaGroupFactors& factors) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  constexpr int kBits = f.bits;
  const int h = p & 1;  // register r = p % 4: a0, a2 row g; a1, a3 row g + 8
  constexpr unsigned kMinusZero = 0x80008000u;
  if constexpr (kDequant == kWgmmaPacked16) {
    constexpr unsigned kPattern = kBf16 ? 0x43004300u : 0x64006400u;
    constexpr unsigned kOne = kBf16 ? 0x3f803f80u : 0x3c003c00u;
    const unsigned x = extract_pair<kBits>(words, p, kPattern);
    const unsigned unscaled = fma_pair<kBf16>(x, kOne, factors.offset_pair[h]);
    if constexpr (!kScaled) return unscaled;
    return fma_pair<kBf16>(unscaled, factors.scale_pair[h], kMinusZero);
  } else if constexpr (kDequant == kWgmmaFloat16) {
    constexpr int kActMantissa = kBf16 ? 7 : 10;
    constexpr int kActBias = kBf16 ? 127 : 15;
    constexpr unsigned kMagnitudePair =
        (((1u << (f.exponent_bits + f.mantissa_bits)) - 1u) << (kActMantissa - f.mantissa_bits)) *
        0x10001u;
    constexpr int kRebiasField = 2 * kActBias - f.bias;
    static_assert(f.is_float() && f.mantissa_bits <= kActMantissa && kRebiasField >= 1 &&
                      kRebiasField <= 2 * kActBias,
                  "float16 serves float formats the activation type holds (host-checked)");
    constexpr unsigned kRebias = (static_cast<unsigned>(kRebiasField) << kActMantissa) * 0x10001u;
    const unsigned x = extract_pair<kBits>(words, p, 0u);
    unsigned placed = (x << (kActMantissa - f.mantissa_bits)) & kMagnitudePair;
    if constexpr (f.is_signed) placed |= (x << (15 - (kBits - 1))) & 0x80008000u;
    const unsigned unscaled = fma_pair<kBf16>(placed, kRebias, kMinusZero);
    if constexpr (!kScaled) return unscaled;
    return fma_pair<kBf16>(unscaled, factors.scale_pair[h], kMinusZero);
  } else {
    static_assert(kScaled, "the fp32 path keeps the scale (its values round)");
    const float v0 = dequantize_value<kFormat, kZeroMode>(extract_code<kBits>(words, 2 * p),
                                                          factors.scale[h], factors.zero[h]);
    const float v1 = dequantize_value<kFormat, kZeroMode>(extract_code<kBits>(words, 2 * p + 1),
                                                          factors.scale[h], factors.zero[h]);
    return ptx::pack_pair<kBf16>(v0, v1);
  }
}

}  // namespace qgemm::kernels
