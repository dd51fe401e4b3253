// Device codec for any qgemm::Format packed by util/format_code.cuh, written with bit tricks
// (no per-element table lookups): the format's fields are template constants, so every branch
// below folds away at compile time and a decode is a handful of integer ops.
//
//   float code  [s][ e exponent bits ][ m mantissa bits ]
//     e != 0 : fp32 bits = s<<31 | (e - bias + 127)<<23 | mantissa<<(23 - m)     (exact)
//     e == 0 : mantissa · 2^(1 - bias - m)                                        (subnormal)
//     top codes as FloatSpecials says (IEEE inf/NaN, one NaN, none, e8m0 NaN)
//   e8m0       2^(code - bias), built as an fp32 exponent field (or fp32 subnormal for 2^-127)
//   integer    sign-extended (two's complement) or zero-extended `bits`-wide code
#pragma once

#include "ptx/convert.cuh"
#include "util/format_code.cuh"

namespace qgemm::kernels {

// 2^exponent as a compile-time float (exact for the exponents any format here needs).
__host__ __device__ constexpr float power_of_two(int exponent) {
  float value = 1.0f;
  for (int i = 0; i < exponent; ++i) value *= 2.0f;
  for (int i = 0; i > exponent; --i) value *= 0.5f;
  return value;
}

// Largest finite value of a format, as a float.
template <unsigned long long kFormat>
__host__ __device__ constexpr float format_max_finite() {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  if constexpr (!f.is_float()) {
    return static_cast<float>(f.max_int);
  } else if constexpr (f.specials == kExponentOnly) {
    return power_of_two((1 << f.exponent_bits) - 2 - f.bias);
  } else {
    constexpr int top_exponent = (1 << f.exponent_bits) - 1;
    // IEEE spends the top exponent on inf/NaN; FiniteOneNaN spends only its last mantissa code.
    constexpr int max_exponent = f.specials == kIeee ? top_exponent - 1 : top_exponent;
    constexpr int max_mantissa =
        f.specials == kFiniteOneNaN ? (1 << f.mantissa_bits) - 2 : (1 << f.mantissa_bits) - 1;
    return power_of_two(max_exponent - f.bias) *
           (1.0f + static_cast<float>(max_mantissa) * power_of_two(-f.mantissa_bits));
  }
}

template <unsigned long long kFormat>
__device__ __forceinline__ float decode_to_float(unsigned int code) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  if constexpr (!f.is_float()) {
    if constexpr (f.is_signed) {
      return static_cast<float>(static_cast<int>(code << (32 - f.bits)) >> (32 - f.bits));
    } else {
      return static_cast<float>(code);
    }
  } else if constexpr (f.specials == kExponentOnly) {
    static_assert(!f.is_signed && f.mantissa_bits == 0, "exponent-only formats are unsigned");
    if (code == f.code_mask()) return __uint_as_float(0x7fc00000u);
    const int fp32_exponent = static_cast<int>(code) - f.bias + 127;
    if (fp32_exponent > 0) return __uint_as_float(static_cast<unsigned int>(fp32_exponent) << 23);
    return __uint_as_float(0x00400000u >> (-fp32_exponent));  // 2^-127 and below: fp32 subnormal
  } else {
    constexpr int m = f.mantissa_bits;
    constexpr int e = f.exponent_bits;
    static_assert(e <= 8 && m <= 23, "wider than fp32");
    static_assert(1 - f.bias >= -126 && (1 << e) - 1 - f.bias <= 128,
                  "exponent range must fit fp32 normals");
    constexpr unsigned int exponent_mask = (1u << e) - 1u;
    constexpr unsigned int mantissa_mask = (1u << m) - 1u;
    const unsigned int exponent = (code >> m) & exponent_mask;
    const unsigned int mantissa = code & mantissa_mask;
    float magnitude;
    if (exponent == 0) {
      constexpr float subnormal_quantum = power_of_two(1 - f.bias - m);
      magnitude = static_cast<float>(mantissa) * subnormal_quantum;
    } else {
      magnitude = __uint_as_float((exponent - f.bias + 127) << 23 | mantissa << (23 - m));
    }
    if constexpr (f.specials == kIeee) {
      if (exponent == exponent_mask) {
        magnitude = mantissa == 0 ? __uint_as_float(0x7f800000u) : __uint_as_float(0x7fc00000u);
      }
    } else if constexpr (f.specials == kFiniteOneNaN) {
      if (exponent == exponent_mask && mantissa == mantissa_mask) {
        magnitude = __uint_as_float(0x7fc00000u);
      }
    }
    if constexpr (f.is_signed) {
      if ((code >> (f.bits - 1)) & 1u) magnitude = -magnitude;
    }
    return magnitude;
  }
}

// Encodes a finite float, rounding to nearest even; values beyond the largest finite value
// saturate to it (callers scale into range first). Integer formats clamp to [min_int, max_int].
template <unsigned long long kFormat>
__device__ __forceinline__ unsigned int encode_from_float(float value) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  if constexpr (!f.is_float()) {
    const float rounded =
        fminf(fmaxf(rintf(value), static_cast<float>(f.min_int)), static_cast<float>(f.max_int));
    return static_cast<unsigned int>(static_cast<int>(rounded)) & f.code_mask();
  } else {
    static_assert(f.specials != kExponentOnly, "encode e8m0 scales with the host quantizer");
    constexpr int m = f.mantissa_bits;
    constexpr float max_finite = format_max_finite<kFormat>();
    constexpr float min_normal = power_of_two(1 - f.bias);
    constexpr float subnormal_quantum = power_of_two(1 - f.bias - m);
    const bool negative = f.is_signed && (__float_as_uint(value) >> 31) != 0;
    // Saturated first (rounding can only keep max_finite where it is), which also keeps the
    // inverse quantum below a normal float.
    float magnitude = fminf(f.is_signed ? fabsf(value) : fmaxf(value, 0.0f), max_finite);
    // The spacing of representable values around `magnitude`: 2^(floor(log2 |x|) - m) for
    // normals (the fp32 exponent field, shifted), the subnormal quantum below min_normal; and its
    // inverse, also a power of two, so that the products below are exact. (Dividing by the
    // quantum instead was an fp32 division subroutine per element: 3/4 of quantize_activation's
    // instructions, ncu on an H100.)
    constexpr float inverse_subnormal_quantum = power_of_two(f.bias + m - 1);
    float quantum = subnormal_quantum, inverse_quantum = inverse_subnormal_quantum;
    if (magnitude >= min_normal) {
      const unsigned exponent_field = __float_as_uint(magnitude) & 0x7f800000u;
      quantum = __uint_as_float(exponent_field - (m << 23));
      inverse_quantum = __uint_as_float(((254u + m) << 23) - exponent_field);
    }
    magnitude = fminf(rintf(magnitude * inverse_quantum) * quantum, max_finite);
    unsigned int code;
    if (magnitude < min_normal) {
      code = static_cast<unsigned int>(magnitude * inverse_subnormal_quantum);
    } else {
      const unsigned int word = __float_as_uint(magnitude);
      const unsigned int exponent = ((word >> 23) & 0xffu) - 127u + f.bias;
      code = exponent << m | (word & 0x007fffffu) >> (23 - m);
    }
    if (negative) code |= 1u << (f.bits - 1);
    return code;
  }
}

// 1 / divisor for encode_quotient, made once per cell, as fast · 2^-shift in fp32 with fast a
// normal float: shift 0 for every scale a bf16 or fp16 cell gives, ±64 for the extremes (a cell of
// tiny bf16 values; a huge given static scale). encode_quotient multiplies x by 2^shift first,
// exactly, or (huge divisors) into an underflow only where the quotient is far below any code's
// half step, so that its code, 0, is unchanged.
struct QuotientInverse {
  float fast;
  float prescale;  // 2^shift
};
__device__ __forceinline__ QuotientInverse quotient_inverse(double divisor) {
  const double exact = __drcp_rn(divisor);  // = 1.0 / divisor (both correctly rounded)
  // Divisors are fp32 scales, or NV's ue4m3 cell scale times its normal fp32 tensor scale
  // (≈ the cell's absmax / 6), so 2^-149 <= divisor <= 2^128 and fast = exact · 2^-shift is a
  // normal float whichever shift applies.
  if (exact >= 0x1p127) return {static_cast<float>(exact * 0x1p-64), 0x1p64f};
  if (exact < 0x1p-126) return {static_cast<float>(exact * 0x1p64), 0x1p-64f};
  return {static_cast<float>(exact), 1.0f};
}

// encode_from_float(x / divisor) for the quotient the host quantizer rounds (src/quant divides
// in double: `value / (scale · second_level)`), without a division per element. (x · 2^shift) ·
// fast rounded to fp32 is within 2^-23 relative (two fp32 ulps) of the exact quotient, and picks
// the same code unless it lies within those ulps of a midpoint between two codes. There the sign
// of x − midpoint · divisor (one double FMA: exact, as the product has at most 38 significant
// bits) says on which side the exact quotient lies, and the midpoint moved one fp32 ulp to that
// side rounds to the right code; zero is a true tie, which encode_from_float breaks to even. The
// host's double quotient agrees: off a midpoint, x − midpoint · divisor is at least 2^-38
// relative, far above a double's rounding, so it too lies on the exact side. divisor > 0. (The
// quotient was a double product until 2026-12-06: two conversions and a DMUL per element, for
// nothing the window below does not already cover.)
// decided_quotient returns that fp32 q (the window's midpoint moved off, else the product),
// whose round to nearest even is the code; encode_quotient encodes it.
template <unsigned long long kFormat>
__device__ __forceinline__ float decided_quotient(float x, double divisor,
                                                  QuotientInverse inverse) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  float q = (x * inverse.prescale) * inverse.fast;
  // |q| in units of the code spacing around it: times the spacing's inverse, 2^(m - e) for
  // normals from the fp32 exponent field e; both powers of two, so the products are exact.
  float inverse_step = 1.0f, step = 1.0f;
  if constexpr (f.is_float()) {
    constexpr int m = f.mantissa_bits;
    constexpr float min_normal = power_of_two(1 - f.bias);
    inverse_step = power_of_two(f.bias + m - 1);
    step = power_of_two(1 - f.bias - m);
    if (fabsf(q) >= min_normal) {
      const unsigned exponent_field = __float_as_uint(q) & 0x7f800000u;
      inverse_step = __uint_as_float(((254u + m) << 23) - exponent_field);
      step = __uint_as_float(exponent_field - (m << 23));
    }
  }
  const float t = fabsf(q) * inverse_step;
  // Four fp32 ulps of t: t · 2^-21 covers the quotient's error twice over.
  if (fabsf(t - floorf(t) - 0.5f) <= t * 4.76837158e-7f) {
    const float midpoint = copysignf((floorf(t) + 0.5f) * step, q);  // exact
    const double residual = fma(-static_cast<double>(midpoint), divisor, static_cast<double>(x));
    q = midpoint;
    if (residual != 0.0)  // ±1 on the bits: +1 away from zero, −1 toward it
      q = __uint_as_float(__float_as_uint(q) + ((residual > 0.0) == (q > 0.0f) ? 1u : ~0u));
  }
  return q;
}

template <unsigned long long kFormat>
__device__ __forceinline__ unsigned int encode_quotient(float x, double divisor,
                                                        QuotientInverse inverse) {
  return encode_from_float<kFormat>(decided_quotient<kFormat>(x, divisor, inverse));
}

// Whether kFormat is OCP e4m3 (true) or e5m2, the 8-bit floats the hardware converts to.
template <unsigned long long kFormat>
constexpr bool is_ocp_e4m3() {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  return f.is_float() && f.is_signed && f.bits == 8 && f.exponent_bits == 4 &&
         f.mantissa_bits == 3 && f.specials == kFiniteOneNaN && f.bias == 7;
}
template <unsigned long long kFormat>
constexpr bool is_ocp_e5m2() {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  return f.is_float() && f.is_signed && f.bits == 8 && f.exponent_bits == 5 &&
         f.mantissa_bits == 2 && f.specials == kIeee && f.bias == 15;
}

// The codes of 8 values (encode_from_float of each), through the hardware's paired conversion
// where it has the format (e4m3 / e5m2 on sm_89+: the same round to nearest even and the same
// saturation of finite values; only a NaN's code differs, NaN there, 0x7e / 0xfe here — NaN
// inputs are not diagnosed by the quantizers that call this).
template <unsigned long long kFormat>
__device__ __forceinline__ void encode_from_float8(const float (&q)[8], unsigned (&code)[8]) {
#if __CUDA_ARCH__ >= 890
  if constexpr (is_ocp_e4m3<kFormat>() || is_ocp_e5m2<kFormat>()) {
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const unsigned pair = ptx::float2_to_fp8x2_bits<is_ocp_e5m2<kFormat>()>(q[e], q[e + 1]);
      code[e] = pair & 0xffu;
      code[e + 1] = pair >> 8;
    }
    return;
  }
#endif
#pragma unroll
  for (int e = 0; e < 8; ++e) code[e] = encode_from_float<kFormat>(q[e]);
}

// A positive double rounded to nearest (ties to even) on the grid of a float format, saturating
// at its largest finite value; exponent-only formats (e8m0) take the nearest power of two, ties
// up, within their exponent range. The host's round_to (src/format) on the values scales take.
template <unsigned long long kFormat>
__device__ __forceinline__ double round_to_format(double magnitude) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  static_assert(f.is_float(), "scales are float formats");
  if constexpr (f.specials == kExponentOnly) {
    int e = ilogb(magnitude);
    if (rint(ldexp(magnitude, -e)) >= 2.0) ++e;
    const int top = (1 << f.exponent_bits) - 2 - f.bias;
    e = e < -f.bias ? -f.bias : (e > top ? top : e);
    return ldexp(1.0, e);
  } else {
    constexpr int m = f.mantissa_bits;
    const int floor_exponent = ilogb(magnitude);
    const int e = floor_exponent > 1 - f.bias ? floor_exponent : 1 - f.bias;
    const double rounded = rint(ldexp(magnitude, m - e)) * ldexp(1.0, e - m);  // exact
    constexpr double max_finite = format_max_finite<kFormat>();
    return rounded > max_finite ? max_finite : rounded;
  }
}

// A raw scale as the host's finalize_scale (src/quant/block_quant.cpp) makes it a usable one:
// an all-zero cell (raw 0) gets 1, an underflow the smallest positive value, an overflow the
// largest finite one.
template <unsigned long long kFormat>
__device__ __forceinline__ double finalize_scale(double raw) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  if (!(raw > 0)) return 1.0;
  if (isinf(raw)) return format_max_finite<kFormat>();
  const double scale = round_to_format<kFormat>(raw);
  if (scale > 0) return scale;
  if constexpr (f.specials == kExponentOnly) return ldexp(1.0, -f.bias);
  return ldexp(1.0, 1 - f.bias - f.mantissa_bits);  // the smallest subnormal
}

}  // namespace qgemm::kernels
