// Whether a weight scale lets packed16 dequantization run exactly: (code − zero) · scale computed
// in a 16-bit type (bf16 or fp16) with exact operands and one rounding. The host's mma layout
// metadata (src/layout/mma_layout.cpp) and the device repack (gemm/mma_repack.cuh), which flags
// the scales as it stores them, both ask this one function.
#pragma once

#include "common/host_device.cuh"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

namespace qgemm::kernels {

// The 16-bit type's significand width and range.
struct Packed16Type {
  int mantissa_bits;
  double min_normal, max_finite;
};
inline constexpr Packed16Type kPacked16Bf16{7, 0x1p-126, 0x1.fep127};
inline constexpr Packed16Type kPacked16Fp16{10, 0x1p-14, 65504.0};

// The scale exact and normal in `type`, and times 2^bits (|code − zero| < 2^bits) still finite.
// Exactness by the significand's width (frexp, not a rounding): this runs over every scale of
// every layer a server loads.
QGEMM_HOST_DEVICE inline bool packed16_scale_exact(double scale, Packed16Type type, int bits) {
  scale = fabs(scale);
  if (scale == 0.0) return true;
  int exponent = 0;
  const double scaled = ldexp(frexp(scale, &exponent), type.mantissa_bits + 1);
  return scaled == floor(scaled) && scale >= type.min_normal &&
         scale * ldexp(1.0, bits) <= type.max_finite;
}

}  // namespace qgemm::kernels
