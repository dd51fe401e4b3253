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
// Extracting code c of a `bits`-wide stream costs a shift and an AND (two shifts and an OR when
// it straddles two words); c and bits are compile-time constants, so all of it unrolls.
#pragma once

#include "ptx/mma_sync.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"

namespace qgemm::kernels {

enum MmaZeroMode {
  kZeroNone = 0,      // value = decode(u) · scale (floats; unsigned ints without zero point)
  kZeroConstant = 1,  // integers: zero = 2^(bits−1) (signed formats, and zp=mid)
  kZeroInteger = 2,   // integers: per-group stored zero, kept as 2^23 + zero (exact)
  kZeroFloat = 3,     // integers: per-group stored float zero
};

// `code_index` must be a constant after unrolling (it is, in dequantize_lane): then the word
// index folds away and `words` stays in registers.
template <int kBits>
__device__ __forceinline__ unsigned extract_code(const unsigned (&words)[kBits], int code_index) {
  const int bit = code_index * kBits;
  const int word = bit / 32, shift = bit % 32;
  constexpr unsigned mask = (1u << kBits) - 1u;
  unsigned value = words[word] >> shift;
  if (shift + kBits > 32) value |= words[word + 1] << (32 - shift);
  return value & mask;
}

template <unsigned long long kFormat, int kZeroMode>
__device__ __forceinline__ float dequantize_value(unsigned code, float scale, float zero) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  if constexpr (f.is_float()) {
    constexpr int m = f.mantissa_bits;
    constexpr unsigned magnitude_mask = (1u << (f.exponent_bits + m)) - 1u;
    unsigned bits = (code & magnitude_mask) << (23 - m);
    if constexpr (f.is_signed) bits |= (code >> (f.bits - 1)) << 31;
    constexpr float rebias = power_of_two(127 - f.bias);  // exact: a power of two
    return __uint_as_float(bits) * rebias * scale;
  } else {
    const float magic = __uint_as_float(0x4B000000u | code);
    if constexpr (kZeroMode == kZeroNone) {
      return (magic - 8388608.0f) * scale;
    } else if constexpr (kZeroMode == kZeroConstant) {
      return (magic - (8388608.0f + static_cast<float>(1 << (f.bits - 1)))) * scale;
    } else if constexpr (kZeroMode == kZeroInteger) {
      return (magic - zero) * scale;  // zero holds 2^23 + z
    } else {
      return (magic - 8388608.0f - zero) * scale;
    }
  }
}

// words: the lane's codes; scales/zeros: the lane's 8 column values (j = 0..7).
// out[j][0] = (k 2t, 2t+1) and out[j][1] = (k 2t+8, 2t+9) of column j · 8 + lane / 4.
template <unsigned long long kFormat, int kZeroMode, bool kBf16>
__device__ __forceinline__ void dequantize_lane(const unsigned (&words)[FormatCode::unpack(kFormat).bits],
                                                const float (&scales)[8], const float (&zeros)[8],
                                                unsigned (&out)[8][2]) {
  constexpr int kBits = FormatCode::unpack(kFormat).bits;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const unsigned code = extract_code<kBits>(words, j * 4 + t);
      v[t] = dequantize_value<kFormat, kZeroMode>(code, scales[j], zeros[j]);
    }
    out[j][0] = ptx::pack_pair<kBf16>(v[0], v[1]);
    out[j][1] = ptx::pack_pair<kBf16>(v[2], v[3]);
  }
}

}  // namespace qgemm::kernels
