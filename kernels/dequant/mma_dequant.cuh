// Register-level dequantization for the mma.sync family: one lane's 32 offset codes (see
// gemm/mma_weight_layout.cuh) -> 16 registers of two bf16/fp16 values, the B operands of 8
// mma.m16n8k16 tiles.
//
//   integer  u -> fp32 by the magic-number trick: bits 0x4B000000 | u is the float 2^23 + u,
//            so (that − (2^23 + zero)) is u − zero exactly, in one FADD; then × scale.
//   float    [s][e][m] -> fp32 bits  s<<31 | (e,m)<<(23 − m): the same number times 2^(bias−127)
//            for normals AND subnormals (an fp32 subnormal scales the same way), so one exact
//            multiply by 2^(127 − bias) restores it (no flush-to-zero: built without ftz). NaN
//            and inf codes are never produced by the quantizer (weights are checked finite).
// Extracting code c costs a shift and an AND (two of each and an OR when it crosses a word);
// c and bits are compile-time constants after unrolling, so all of it folds.
//
// Rounding: (u − zero) and the placed float code are exact in fp32, so × scale is the only
// rounding before the conversion to 16 bits. Where that product is not exact in fp32 (fp32
// scales times codes of more than one significant bit) the value is rounded twice; kRoundOnce
// rounds the product to odd instead (multiply_round_to_odd), which makes the conversion round
// the exact product once, as the host twin (layout::mma_weight_value) does. The GEMM kernels
// keep the plain product (kRoundFp32: their sums round anyway); mma_dequantize, whose output is
// the weight itself, rounds once.
//
// packed16 (integers of ≤ 7 bits whose scales are exact in the activation type): a whole pair
// of codes is lifted out at once into the two 16-bit halves, ORed into the exponent of 128
// (bf16 0x4300) or 1024 (fp16 0x6400), giving base + u exactly; then two fma.rn.{bf16,f16}x2:
// (x − (base + zero)) is exact, and × scale rounds once, exactly as the fp32 path rounds its
// exact product. About 2 instructions per weight instead of about 8.
#pragma once

#include "gemm/mma_weight_layout.cuh"
#include "ptx/convert.cuh"
#include "ptx/mma_sync.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"

namespace qgemm::kernels {

enum MmaZeroMode {
  kZeroNone = 0,      // value = decode(u) · scale (floats; unsigned ints without zero point)
  kZeroConstant = 1,  // integers: zero = 2^(bits−1) (signed formats, and zp=mid)
  kZeroInteger = 2,   // integers: per-group stored integer zero
  kZeroFloat = 3,     // integers: per-group stored float zero
};

// `c` must be a constant after unrolling (it is, in the callers): then the word indices fold
// away and `words` stays in registers.
template <int kBits>
__device__ __forceinline__ unsigned extract_code(const unsigned (&words)[kBits], int c) {
  const int word = MmaWeightLayout::code_word(c, kBits);
  const int first = MmaWeightLayout::code_bits_in_first_word(c, kBits);
  unsigned value = (words[word] >> MmaWeightLayout::code_shift(c, kBits)) & ((1u << first) - 1u);
  if (first < kBits)
    value |= ((words[word + 1] >> (16 * (c % 2))) & ((1u << (kBits - first)) - 1u)) << first;
  return value;
}

// (a & mask) | pattern in one LOP3. Written out because the compiler splits it into two when
// both mask and pattern are immediates (a LOP3 takes one); here the pattern stays a register.
__device__ __forceinline__ unsigned and_or(unsigned a, unsigned mask, unsigned pattern) {
  if (pattern == 0u) return a & mask;
  unsigned out;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(out) : "r"(a), "r"(mask), "r"(pattern));
  return out;
}

// Pair p (codes 2p, 2p + 1) in the two 16-bit halves, ORed with `pattern` in both halves.
template <int kBits>
__device__ __forceinline__ unsigned extract_pair(const unsigned (&words)[kBits], int p,
                                                 unsigned pattern) {
  const int bit = p * kBits, word = bit / 16, shift = bit % 16;
  const int first = 16 - shift < kBits ? 16 - shift : kBits;
  const unsigned low_mask = ((1u << first) - 1u) * 0x10001u;
  unsigned x = and_or(words[word] >> shift, low_mask, pattern);
  if (first < kBits) {
    const unsigned high_mask = (((1u << kBits) - 1u) ^ ((1u << first) - 1u)) * 0x10001u;
    x |= (words[word + 1] << first) & high_mask;
  }
  return x;
}

template <bool kBf16>
__device__ __forceinline__ unsigned fma_pair(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  if constexpr (kBf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
}

// How dequantize_value rounds the value (u − zero) · scale, or decode(u) · scale.
enum ValueRounding {
  kRoundFp32 = 0,        // the fp32 product (the GEMMs: their sums round anyway)
  kRoundOnce = 1,        // rounded to odd, so that the 16-bit conversion rounds the exact product
                         // once; needs u − zero exact in fp32 (float zeros: zero_exact_in_fp32)
  kRoundOnceDouble = 2,  // as kRoundOnce, from the host twin's own double arithmetic (any zero)
};

// a · b rounded to odd: truncated, with the last significand bit set when anything was cut off.
// Rounding that to nearest in a format of at most 22 significand bits (bf16: 8, fp16: 11) gives
// a · b rounded once. The remainder a · b − truncated is exact (one FFMA), and it is zero only
// when the product is.
__device__ __forceinline__ float multiply_round_to_odd(float a, float b) {
  const float truncated = __fmul_rz(a, b);
  unsigned inexact;  // min(remainder bits, 1): one VIMNMX (the compiler's != 0 takes two)
  asm("min.u32 %0, %1, 1;" : "=r"(inexact) : "r"(__float_as_uint(__fmaf_rn(a, b, -truncated))));
  return __uint_as_float(__float_as_uint(truncated) | inexact);
}

// The same for a double: its value rounded to an fp32 that rounds to 16 bits as it would.
__device__ __forceinline__ float double_round_to_odd(double value) {
  const float truncated = __double2float_rz(value);
  return __uint_as_float(__float_as_uint(truncated) |
                         (static_cast<double>(truncated) != value ? 1u : 0u));
}

// Whether u − zero is exact in fp32 for every code u < 2^8: a multiple of 2^-15 below 2^8 in
// magnitude (24 bits then hold the difference), as the quantizer's float zeros almost always are.
__device__ __forceinline__ bool zero_exact_in_fp32(float zero) {
  return fabsf(zero) < 256.0f && rintf(zero * 32768.0f) == zero * 32768.0f;
}

template <unsigned long long kFormat, int kZeroMode, int kRounding = kRoundFp32>
__device__ __forceinline__ float dequantize_value(unsigned code, float scale, float zero) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  auto times_scale = [scale](float exact) {
    if constexpr (kRounding == kRoundFp32) {
      return exact * scale;
    } else {
      return multiply_round_to_odd(exact, scale);
    }
  };
  if constexpr (f.is_float()) {
    constexpr int m = f.mantissa_bits;
    constexpr unsigned magnitude_mask = (1u << (f.exponent_bits + m)) - 1u;
    unsigned bits = (code & magnitude_mask) << (23 - m);
    if constexpr (f.is_signed) bits |= (code >> (f.bits - 1)) << 31;
    constexpr float rebias = power_of_two(127 - f.bias);  // exact: a power of two
    return times_scale(__uint_as_float(bits) * rebias);
  } else {
    const float magic = __uint_as_float(0x4B000000u | code);
    if constexpr (kZeroMode == kZeroNone) {
      return times_scale(magic - 8388608.0f);
    } else if constexpr (kZeroMode == kZeroConstant) {
      return times_scale(magic - (8388608.0f + static_cast<float>(1 << (f.bits - 1))));
    } else if constexpr (kRounding == kRoundOnceDouble) {
      return double_round_to_odd((static_cast<double>(magic - 8388608.0f) - zero) *
                                 static_cast<double>(scale));
    } else {  // stored zeros: integer (u − zero exact), or float
      return times_scale(magic - 8388608.0f - zero);
    }
  }
}

// Pair p (codes 2p, 2p + 1) of a lane's words, scaled, in both halves of a 16-bit register.
template <unsigned long long kFormat, int kZeroMode, bool kBf16, int kRounding = kRoundFp32>
__device__ __forceinline__ unsigned dequantize_pair(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], int p, float scale, float zero) {
  constexpr int kBits = FormatCode::unpack(kFormat).bits;
  const float first = dequantize_value<kFormat, kZeroMode, kRounding>(
      extract_code<kBits>(words, 2 * p), scale, zero);
  const float second = dequantize_value<kFormat, kZeroMode, kRounding>(
      extract_code<kBits>(words, 2 * p + 1), scale, zero);
  return ptx::pack_pair<kBf16>(first, second);
}

// words: the lane's codes; scales/zeros: the lane's 8 column values (j = 0..7).
// out[j][0] = (k 2t, 2t+1) and out[j][1] = (k 2t+8, 2t+9) of column j · 8 + lane / 4.
template <unsigned long long kFormat, int kZeroMode, bool kBf16, int kRounding = kRoundFp32>
__device__ __forceinline__ void dequantize_lane(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], const float (&scales)[8],
    const float (&zeros)[8], unsigned (&out)[8][2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      out[j][h] = dequantize_pair<kFormat, kZeroMode, kBf16, kRounding>(words, 2 * j + h,
                                                                         scales[j], zeros[j]);
}

// The 8 values of a lane's columns j · 8 + g (j = 0..7) in a scale or zero row of one 64-column
// slice (tile), in `Order`'s column permutation (Order::decode_scale_offset): 8 consecutive
// floats in the mma order, four adjacent pairs in the wgmma order. Shared or global memory.
template <class Order>
__device__ __forceinline__ void load_lane_columns(const float* slice_row, int g, float (&v)[8]) {
  if constexpr (Order::decode_scale_offset(3, 0) == 3) {  // 8 consecutive (mma)
#pragma unroll
    for (int j = 0; j < 8; j += 4) {
      const float4 four =
          *reinterpret_cast<const float4*>(slice_row + Order::decode_scale_offset(j, g));
      v[j] = four.x, v[j + 1] = four.y, v[j + 2] = four.z, v[j + 3] = four.w;
    }
  } else {  // pairs (wgmma)
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const float2 pair =
          *reinterpret_cast<const float2*>(slice_row + Order::decode_scale_offset(j, g));
      v[j] = pair.x, v[j + 1] = pair.y;
    }
  }
}

// The packed16 factors of one group for a lane's 8 columns: the scale and −(base + zero) in
// both halves. They change once per group, so the callers hoist them out of the k16 loop.
template <unsigned long long kFormat, int kZeroMode, bool kBf16>
__device__ __forceinline__ void packed16_factors(const float (&scales)[8], const float (&zeros)[8],
                                                 unsigned (&scale_pairs)[8],
                                                 unsigned (&offset_pairs)[8]) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  static_assert(!f.is_float() && f.bits <= 7 && kZeroMode != kZeroFloat,
                "packed16 serves integer codes of at most 7 bits with integer zero points");
  constexpr float kBase = kBf16 ? 128.0f : 1024.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float zero = 0.0f;
    if constexpr (kZeroMode == kZeroConstant) zero = static_cast<float>(1 << (f.bits - 1));
    // Padding groups past K read zero scales and zeros: 0 · (x − base) stays finite.
    if constexpr (kZeroMode == kZeroInteger) zero = zeros[j];
    offset_pairs[j] = ptx::pack_pair<kBf16>(-(kBase + zero), -(kBase + zero));
    scale_pairs[j] = ptx::pack_pair<kBf16>(scales[j], scales[j]);  // exact (host-checked)
  }
}

// The packed16 path of dequantize_lane (same operands and result layout), with the factors of
// packed16_factors.
// The exponent of 128 (bf16 0x4300) or 1024 (fp16 0x6400) in both halves: ORed under a pair of
// integer codes of ≤ 7 bits it reads base + u exactly (packed16, and the decode kernel's lift).
template <bool kBf16>
inline constexpr unsigned kLiftPattern = kBf16 ? 0x43004300u : 0x64006400u;

template <unsigned long long kFormat, bool kBf16>
__device__ __forceinline__ void dequantize_lane_packed16(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], const unsigned (&scale_pairs)[8],
    const unsigned (&offset_pairs)[8], unsigned (&out)[8][2]) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  constexpr unsigned kOne = kBf16 ? 0x3f803f80u : 0x3c003c00u;
  constexpr unsigned kMinusZero = 0x80008000u;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const unsigned x = extract_pair<f.bits>(words, j * 2 + r, kLiftPattern<kBf16>);
      out[j][r] =
          fma_pair<kBf16>(fma_pair<kBf16>(x, kOne, offset_pairs[j]), scale_pairs[j], kMinusZero);
    }
}

// ---------------------------------------------------------------------------------------------
// Unscaled dequantization (the decode kernel, gemm/sm80_decode.cuh): the same lane operands, but
// the B registers hold the exact code value (u − zero for integers, the format's value for
// floats) and the group scale is applied to the fp32 accumulators once per group. No scale
// needs to be exact in the activation type, and each pair costs 2–6 instructions.
//
//   int16     integers that fit the 16-bit trick (≤ 7 bits in bf16, ≤ 10 in fp16): the pair is
//             lifted into base + u (as packed16), then one FMA subtracts base + zero. Both are
//             exact, so the operand is u − zero exactly (|u − zero| < 256 fits either type).
//   int_f32   8-bit integers against bf16 (base + u would need 9 significant bits): each code
//             goes into the float 2^23 + u with one PRMT, one FADD subtracts 2^23 + zero, one
//             CVT packs the exact pair.
//   float16   float codes of formats whose every value the activation type holds: the sign and
//             the (exponent, mantissa) field are moved to the activation type's positions, which
//             reads as the value times 2^(bias_act − bias); one FMA by 2^(bias − bias_act)
//             restores it exactly (subnormal codes land on subnormals of the same scale).
// ---------------------------------------------------------------------------------------------

enum UnscaledDequant { kDequantInt16 = 0, kDequantIntF32 = 1, kDequantFloat16 = 2 };

// int16 without its offset: pair p as base + u in both halves (base 128 for bf16, 1024 for
// fp16), exact for codes of ≤ 7 bits. A caller that subtracts (base + zero) · Σ_k A from the sums
// afterwards (row sums from one more mma) saves the fma per pair: a third of the dequantization.
template <unsigned long long kFormat, bool kBf16>
__device__ __forceinline__ unsigned lift_pair_int16(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], int p) {
  return extract_pair<FormatCode::unpack(kFormat).bits>(words, p, kLiftPattern<kBf16>);
}

// offsets[j]: −(base + zero of column j · 8 + lane / 4) in both halves (int16), or the float
// 2^23 + zero (int_f32, low word only); unused for floats. unscaled_offsets makes them.
template <unsigned long long kFormat, int kZeroMode, int kDequant, bool kBf16>
__device__ __forceinline__ void unscaled_offsets(const float (&zeros)[8], unsigned (&offsets)[8]) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  static_assert(kZeroMode != kZeroFloat, "a float zero makes u − zero inexact in 16 bits");
  constexpr float kBase = kDequant == kDequantIntF32 ? 8388608.0f : (kBf16 ? 128.0f : 1024.0f);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float zero = 0.0f;
    if constexpr (kZeroMode == kZeroConstant) zero = static_cast<float>(1 << (f.bits - 1));
    if constexpr (kZeroMode == kZeroInteger) zero = zeros[j];
    if constexpr (kDequant == kDequantIntF32) {
      offsets[j] = __float_as_uint(kBase + zero);
    } else if constexpr (kDequant == kDequantInt16) {
      offsets[j] = ptx::pack_pair<kBf16>(-(kBase + zero), -(kBase + zero));
    } else {
      offsets[j] = 0u;
    }
  }
}

// Pair p of a lane's words, unscaled: (u − zero) for integers (offset as below), the code's
// value for floats. The streamed decode kernel calls it pair by pair, in the order its weight
// layout feeds the mma (gemm/sm80_decode.cuh); dequantize_lane_unscaled takes all 16 in the mma
// order.
template <unsigned long long kFormat, int kDequant, bool kBf16>
__device__ __forceinline__ unsigned dequantize_pair_unscaled(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], int p, unsigned offset) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  constexpr int kBits = f.bits;
  if constexpr (kDequant == kDequantInt16) {
    constexpr unsigned kOne = kBf16 ? 0x3f803f80u : 0x3c003c00u;
    return fma_pair<kBf16>(lift_pair_int16<kFormat, kBf16>(words, p), kOne, offset);
  } else if constexpr (kDequant == kDequantIntF32) {
    static_assert(kBits == 8, "int_f32 serves 8-bit codes");
    // Word p / 2 holds pairs 2w (bytes 0, 2) and 2w + 1 (bytes 1, 3).
    const float minus = -__uint_as_float(offset);
    const unsigned word = words[p / 2];
    const unsigned byte = p % 2;
    // 0x4B0000uu, the float 2^23 + u: byte `byte` (first code) or `byte` + 2 (second) of the
    // word under the top byte 0x4B of the constant (selector nibbles name bytes 0-7).
    const unsigned lo = __byte_perm(word, 0x4B000000u, 0x7540u | byte);
    const unsigned hi = __byte_perm(word, 0x4B000000u, 0x7542u | byte);
    return ptx::pack_pair<kBf16>(__uint_as_float(lo) + minus, __uint_as_float(hi) + minus);
  } else {
    static_assert(f.is_float() && f.specials != kExponentOnly, "float16 serves float codes");
    constexpr int kActMantissa = kBf16 ? 7 : 10;
    constexpr int kActBias = kBf16 ? 127 : 15;
    constexpr int kMagnitudeBits = f.exponent_bits + f.mantissa_bits;
    constexpr unsigned kMagnitude = ((1u << kMagnitudeBits) - 1u)
                                    << (kActMantissa - f.mantissa_bits);
    constexpr unsigned kMagnitudePair = kMagnitude * 0x10001u;
    constexpr unsigned kSignPair = 0x80008000u;
    // The placed code reads 2^(e − bias_act) · 1.m; the value is 2^(e − bias) · 1.m, so it is
    // multiplied by 2^(bias_act − bias), whose exponent field is 2 · bias_act − bias.
    constexpr int kRebiasField = 2 * kActBias - f.bias;
    static_assert(
        f.mantissa_bits <= kActMantissa && kRebiasField >= 1 && kRebiasField <= 2 * kActBias,
        "the float format does not fit the activation type (host-checked)");
    constexpr unsigned kRebias = (static_cast<unsigned>(kRebiasField) << kActMantissa) * 0x10001u;
    constexpr unsigned kMinusZero = 0x80008000u;
    const unsigned x = extract_pair<kBits>(words, p, 0u);
    unsigned placed = (x << (kActMantissa - f.mantissa_bits)) & kMagnitudePair;
    if constexpr (f.is_signed) placed |= (x << (15 - (kBits - 1))) & kSignPair;
    return fma_pair<kBf16>(placed, kRebias, kMinusZero);
  }
}

template <unsigned long long kFormat, int kDequant, bool kBf16>
__device__ __forceinline__ void dequantize_lane_unscaled(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], const unsigned (&offsets)[8],
    unsigned (&out)[8][2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      out[j][r] = dequantize_pair_unscaled<kFormat, kDequant, kBf16>(words, j * 2 + r, offsets[j]);
}

// ---------------------------------------------------------------------------------------------
// Byte operands (8-bit activations, mma.m16n8k32; gemm/sm80_dense.cuh): one k16 block of a
// lane's codes -> 8 registers, out[j] = codes 4j, 4j+2, 4j+1, 4j+3 of n8 tile j, the order of
// MmaWeightLayout::operand8_position.
//
//   raw           the codes themselves: integers as u8 (the kernel takes zero · Σ_k A off the
//                 s32 sums), e4m3 codes as they are; 8-bit codes are word j as stored.
//   int16, float16 (e4m3 activations) the unscaled fp16 dequantization above, then one cvt per
//                 pair to e4m3: exact for the weights whose every value e4m3 holds (host-checked:
//                 integers with |u − zero| ≤ 16, the small float formats).
// ---------------------------------------------------------------------------------------------

enum ByteDequant { kBytesRaw = 0, kBytesInt16 = 1, kBytesFloat16 = 2 };

// offsets: as dequantize_lane_unscaled's for fp16 (int16 only).
template <unsigned long long kFormat, int kBytes>
__device__ __forceinline__ void lane_bytes(
    const unsigned (&words)[FormatCode::unpack(kFormat).bits], const unsigned (&offsets)[8],
    unsigned (&out)[8]) {
  constexpr int kBits = FormatCode::unpack(kFormat).bits;
  if constexpr (kBytes == kBytesRaw) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kBits == 8) {
        out[j] = words[j];  // bytes: first(2j), first(2j + 1), second(2j), second(2j + 1)
      } else {
        const unsigned x = extract_pair<kBits>(words, j * 2, 0u);      // codes 4j, 4j + 1
        const unsigned y = extract_pair<kBits>(words, j * 2 + 1, 0u);  // codes 4j + 2, 4j + 3
        out[j] = x | (y << 8);
      }
    }
  } else {
    unsigned pairs[8][2];
    dequantize_lane_unscaled<kFormat, kBytes == kBytesInt16 ? kDequantInt16 : kDequantFloat16,
                             false>(words, offsets, pairs);
#pragma unroll
    for (int j = 0; j < 8; ++j)  // bytes x0, y0, x1, y1 of the two converted pairs
      out[j] = __byte_perm(ptx::e4m3x2_from_f16x2(pairs[j][0]), ptx::e4m3x2_from_f16x2(pairs[j][1]),
                           0x5140);
  }
}

// ---------------------------------------------------------------------------------------------
// Scaling the exact 16-bit values of dequantize_lane_unscaled (mma_dequantize, the weight itself):
// each value times its column's scale, rounded once to 16 bits.
//
//   scale_pair_exact      the scale is exact in the 16-bit type (host-checked): one fma.rn per
//                         pair rounds the exact product once
//   scale_pair_to_odd     any fp32 scale: both values back to fp32 (exact), the products rounded
//                         to odd, then to 16 bits (rounded once: see multiply_round_to_odd)
// ---------------------------------------------------------------------------------------------

// `scale_pair`: the scale in both halves.
template <bool kBf16>
__device__ __forceinline__ unsigned scale_pair_exact(unsigned pair, unsigned scale_pair) {
  return fma_pair<kBf16>(pair, scale_pair, 0x80008000u);  // + (−0): the product itself
}

template <bool kBf16>
__device__ __forceinline__ unsigned scale_pair_to_odd(unsigned pair, float scale) {
  float low, high;
  if constexpr (kBf16) {
    low = __uint_as_float(pair << 16);
    high = __uint_as_float(pair & 0xffff0000u);
  } else {
    low = ptx::fp16_bits_to_float(static_cast<unsigned short>(pair & 0xffffu));
    high = ptx::fp16_bits_to_float(static_cast<unsigned short>(pair >> 16));
  }
  return ptx::pack_pair<kBf16>(multiply_round_to_odd(low, scale),
                               multiply_round_to_odd(high, scale));
}

}  // namespace qgemm::kernels
