// The weight as 8-bit codes in registers, for the 8-bit wgmma of the SM90 family
// (gemm/sm90_wgmma.cuh with an eight-bit tile): e4m3 codes for the FP8 tensor cores, s8 codes
// for the INT8 ones. One thread's words of a (tile, 64-K chunk) in the prepared wgmma order
// (gemm/wgmma_weight_layout.cuh, the same words the 16-bit path reads) -> the 8 registers of its
// A fragments for the chunk's two m64nNk32 steps. Unscaled: every value is exact in the target
// type, the group scales are promoted into the fp32 sums by the kernel.
//
// Plain constexpr C++ where it can be, so that the CPU tests run the very same selectors and
// tables (byte_permute is PRMT on the device and its definition on the host).
//
// Where the bytes come from. The 16-bit order gives thread (g = lane / 4, t = lane % 4), for
// each k16 block kb of the chunk, pairs p = 4 kb + r:
//
//   r = 0: row g,     k 2t, 2t+1        r = 1: row g + 8, k 2t, 2t+1
//   r = 2: row g,     k 2t+8, 2t+9      r = 3: row g + 8, k 2t+8, 2t+9
//
// The 8-bit A fragment of k32 step s (ptx/wgmma.cuh, WgmmaE4m3 / WgmmaS8) wants, in register
// a(rh + 2 kh), row g + 8 rh and 4 consecutive k of the instruction's K: 16 kh + 4t .. + 3 of
// step s. The instruction's K is the real K permuted inside every run of 16 exactly as the
// 8-bit mma's activations are (MmaWeightLayout::operand8_position, which the activation
// quantizer already writes):
//
//   instruction k  16 c + 4t + 0   16 c + 4t + 1   16 c + 4t + 2   16 c + 4t + 3
//   real k         16 c + 2t       16 c + 2t + 8   16 c + 2t + 1   16 c + 2t + 9
//
// so run c = 2 s + kh of the instruction is k16 block kb = c of the weight, and the four bytes
// of a(rh + 2 kh) are, in order, the first code of pair r = rh, the first of r = 2 + rh, the
// second of r = rh, the second of r = 2 + rh, all of block kb = 2 s + kh:
//
//   register   a0          a1           a2          a3
//   row        g           g + 8        g           g + 8
//   block kb   2s          2s           2s + 1      2s + 1
//   bytes      F0 F2 S0 S2 F1 F3 S1 S3  F0 F2 S0 S2 F1 F3 S1 S3   (F r / S r: first / second
//                                                                  code of pair 4 kb + r)
//
// 8-bit codes (e4m3 weights for e4m3, offset int8 weights for s8): word w of the thread holds,
// low to high byte, F(2w) F(2w + 1) S(2w) S(2w + 1) (pairs 2w, 2w + 1: MmaWeightLayout's bit
// order at 8 bits), so block kb's pairs r = 0, 1 are word 2 kb and r = 2, 3 word 2 kb + 1; one
// PRMT of the two words makes a register: bytes (0, 4, 2, 6) for row g, (1, 5, 3, 7) for row
// g + 8. Int8 codes are stored offset by 128 (u = v + 128, the constant zero): u XOR 0x80 is v's
// two's complement byte, one LOP3 a register (the table's `flip`).
//
// 4-bit codes (int4 / uint4 with a constant zero, e2m1 for e4m3): word kb holds the first codes
// of pairs r = 0..3 as nibbles 0..3 and the second codes as nibbles 4..7. A nibble becomes its
// target byte through two 8-entry tables in registers (PRMT indexes 8 bytes with 3 bits): `low`
// for codes 0..7, `high` for 8..15, and a third PRMT picks per byte by the code's bit 3:
//
//   index    = word & 0x7777 (per half)           low_bytes  = PRMT(low table, index)
//   pick     = ((word >> 1) & 0x4444) | 0x3210    high_bytes = PRMT(high table, index)
//   code     = PRMT(low_bytes, high_bytes, pick)  (pick's nibble j: j, or 4 + j for bit 3 set)
//
// for the low half (F0 F1 F2 F3) and the high half (S0 S1 S2 S3), then one PRMT per register
// gathers (F rh, F 2+rh, S rh, S 2+rh): bytes (0, 2, 4, 6) for row g, (1, 3, 5, 7) for g + 8.
// About 13 instructions per 8 codes, against ~14 for the 16-bit packed path's 4 pairs
// (dequant/wgmma_dequant.cuh), and half the wgmma instructions. (An s8 table of a 4-bit integer
// with a constant zero is the identity minus 8; the tables keep one path for every format.)
#pragma once

#include "common/host_device.cuh"
#include "util/format_code.cuh"

namespace qgemm::kernels {

// The value of code u of a weight format of at most 8 bits as the wgmma family stores it:
// integers are offset codes (u − zero, zero = 2^(bits − 1) for a constant zero, 0 without one),
// floats decode by their fields (sign, exponent, mantissa; exponent 0 subnormal). Special
// encodings (NaN, infinity) are not weight values and never reach here (host-checked).
QGEMM_HOST_DEVICE constexpr double wgmma_code_value(const FormatCode& f, bool constant_zero,
                                                    unsigned u) {
  if (!f.is_float()) {
    const double zero = constant_zero ? static_cast<double>(1u << (f.bits - 1)) : 0.0;
    return static_cast<double>(u) - zero;
  }
  const unsigned magnitude_bits = static_cast<unsigned>(f.exponent_bits + f.mantissa_bits);
  const bool negative = f.is_signed && ((u >> magnitude_bits) & 1u) != 0;
  const unsigned exponent = (u >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u);
  const unsigned mantissa = u & ((1u << f.mantissa_bits) - 1u);
  double significand = static_cast<double>(mantissa) / static_cast<double>(1u << f.mantissa_bits);
  int power = static_cast<int>(exponent) - f.bias;
  if (exponent == 0) {
    power = 1 - f.bias;
  } else {
    significand += 1.0;
  }
  double value = significand;
  for (int i = 0; i < power; ++i) value *= 2.0;
  for (int i = 0; i > power; --i) value /= 2.0;
  return negative ? -value : value;
}

// The 8-bit type of the wgmma's operands: e4m3 (FP8 tensor cores) or s8 (INT8 ones).
enum WgmmaCodes8 { kCodes8E4m3 = 0, kCodes8S8 = 1 };

// The e4m3 code of `value`, which must be exact in e4m3 (normal or subnormal, |value| ≤ 448);
// -1 when it is not.
QGEMM_HOST_DEVICE constexpr int e4m3_code_of_exact(double value) {
  const int sign = value < 0 ? 0x80 : 0;
  double magnitude = value < 0 ? -value : value;
  if (magnitude == 0.0) return sign;
  if (magnitude > 448.0) return -1;
  int exponent = 0;  // magnitude = m · 2^exponent with m in [1, 2)
  while (magnitude >= 2.0) magnitude /= 2.0, ++exponent;
  while (magnitude < 1.0) magnitude *= 2.0, --exponent;
  if (exponent < -6) {  // subnormal: mantissa · 2^-9
    double scaled = magnitude;
    for (int i = exponent; i < 9; ++i) scaled *= 2.0;
    const int mantissa = static_cast<int>(scaled);
    return static_cast<double>(mantissa) == scaled && mantissa < 8 ? sign | mantissa : -1;
  }
  const double eighths = (magnitude - 1.0) * 8.0;
  const int mantissa = static_cast<int>(eighths);
  if (static_cast<double>(mantissa) != eighths) return -1;
  return sign | ((exponent + 7) << 3) | mantissa;
}

// The s8 byte of `value`, which must be an integer in [−128, 127]; -1 when it is not.
QGEMM_HOST_DEVICE constexpr int s8_code_of_exact(double value) {
  if (!(value >= -128.0 && value <= 127.0)) return -1;
  const int integer = static_cast<int>(value);
  if (static_cast<double>(integer) != value) return -1;
  return integer & 0xFF;
}

QGEMM_HOST_DEVICE constexpr int code8_of_exact(int target, double value) {
  return target == kCodes8S8 ? s8_code_of_exact(value) : e4m3_code_of_exact(value);
}

// The 16-entry table of a 4-bit (or 2-bit) weight format as four words: codes 0..3, 4..7 (`low`),
// 8..11, 12..15 (`high`), byte u % 4 of word u / 4. An entry that is not exact is 0xFF (an e4m3
// NaN, s8 −1; wgmma_codes8_exact says whether any is). `flip`: what 8-bit codes are XORed with
// (0x80 a byte for int8 to s8, else 0).
struct WgmmaCodes8Table {
  unsigned words[4];
  unsigned flip;
};

QGEMM_HOST_DEVICE constexpr WgmmaCodes8Table wgmma_codes8_table(unsigned long long format,
                                                                bool constant_zero, int target) {
  const FormatCode f = FormatCode::unpack(format);
  WgmmaCodes8Table table{{0u, 0u, 0u, 0u}, 0u};
  if (f.bits <= 4) {  // 2-bit codes take the table's first four entries
    for (unsigned u = 0; u < 16; ++u) {
      const int code = code8_of_exact(target, wgmma_code_value(f, constant_zero, u));
      const unsigned byte = code < 0 ? 0xFFu : static_cast<unsigned>(code);
      table.words[u / 4] |= byte << (8 * (u % 4));
    }
  }
  if (f.bits == 8 && target == kCodes8S8 && constant_zero) table.flip = 0x80808080u;
  return table;
}

// Whether every code of the weight format is exact in the target type as the fragments make it:
// 4-bit codes through the table, 8-bit ones as they are (e4m3 weights for e4m3, whose special
// codes are never weight values) or flipped (int8 offset codes for s8).
QGEMM_HOST_DEVICE constexpr bool wgmma_codes8_exact(unsigned long long format, bool constant_zero,
                                                    int target) {
  const FormatCode f = FormatCode::unpack(format);
  if (f.bits != 2 && f.bits != 4 && f.bits != 8) return false;
  if (f.bits == 8 && f.is_float())
    return target == kCodes8E4m3 && f.exponent_bits == 4 && f.mantissa_bits == 3 && f.is_signed &&
           !constant_zero;
  const WgmmaCodes8Table table = wgmma_codes8_table(format, constant_zero, target);
  for (unsigned u = 0; u < (1u << f.bits); ++u) {
    const int code = code8_of_exact(target, wgmma_code_value(f, constant_zero, u));
    if (code < 0) return false;
    if (f.bits == 8 && static_cast<unsigned>(code) != ((u ^ table.flip) & 0xFFu)) return false;
  }
  return true;
}

// PRMT (default mode, selector nibbles < 8): byte i of the result is byte (selector >> 4i) & 7
// of the 8 bytes {high:low}.
QGEMM_HOST_DEVICE inline unsigned byte_permute(unsigned low, unsigned high, unsigned selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(low, high, selector);
#else
  const unsigned long long bytes =
      static_cast<unsigned long long>(high) << 32 | static_cast<unsigned long long>(low);
  unsigned out = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned index = (selector >> (4 * i)) & 7u;
    out |= static_cast<unsigned>((bytes >> (8 * index)) & 0xFFu) << (8 * i);
  }
  return out;
#endif
}

// Four 4-bit codes (nibbles 0..3 of `codes`) -> their four target bytes; `pick` is
// ((word >> 1) & 0x4444) | 0x3210 of the same nibbles (the byte source per code).
QGEMM_HOST_DEVICE inline unsigned wgmma_codes8_lookup(const WgmmaCodes8Table& table,
                                                      unsigned codes, unsigned pick) {
  const unsigned index = codes & 0x7777u;
  const unsigned low = byte_permute(table.words[0], table.words[1], index);
  const unsigned high = byte_permute(table.words[2], table.words[3], index);
  return byte_permute(low, high, pick);
}

// The thread's 8 A registers of one chunk: frag[s][r] = register a_r of k32 step s.
// 2-bit codes (ternary, uint2): word kb / 2 holds block kb's first codes as 2-bit fields
// 4 (kb % 2) .. + 3 of its low half and its second codes at the same fields of its high half;
// one PRMT brings the two bytes to bits 0-7 and 16-23, two shift-and-mask steps spread each
// byte's four fields to four nibbles, and the 4-bit path takes the word from there.
QGEMM_HOST_DEVICE inline unsigned wgmma_codes8_widen2(unsigned word, int kb) {
  unsigned w = byte_permute(word, 0u, kb % 2 == 0 ? 0x4240u : 0x4341u);  // 0x00SS00FF
  w = (w | (w << 4)) & 0x0F0F0F0Fu;  // fields 2, 3 to the next byte
  w = (w | (w << 2)) & 0x33333333u;  // fields 1, 3 to the next nibble
  return w;
}

// The thread's 8 A registers of one chunk: frag[s][r] = register a_r of k32 step s.
template <int kBits>
QGEMM_HOST_DEVICE inline void wgmma_codes8_fragments(const unsigned (&words)[kBits],
                                                     const WgmmaCodes8Table& table,
                                                     unsigned (&frag)[2][4]) {
  static_assert(kBits == 2 || kBits == 4 || kBits == 8,
                "the 8-bit wgmma takes 2-, 4- and 8-bit weight codes");
  for (int s = 0; s < 2; ++s)
    for (int kh = 0; kh < 2; ++kh) {
      const int kb = 2 * s + kh;
      if constexpr (kBits == 8) {
        frag[s][2 * kh] = byte_permute(words[2 * kb], words[2 * kb + 1], 0x6240u) ^ table.flip;
        frag[s][2 * kh + 1] =
            byte_permute(words[2 * kb], words[2 * kb + 1], 0x7351u) ^ table.flip;
      } else {
        const unsigned word = kBits == 2 ? wgmma_codes8_widen2(words[kb / 2], kb) : words[kb];
        const unsigned pick = ((word >> 1) & 0x44444444u) | 0x32103210u;
        const unsigned first = wgmma_codes8_lookup(table, word, pick);               // F0..F3
        const unsigned second = wgmma_codes8_lookup(table, word >> 16, pick >> 16);  // S0..S3
        frag[s][2 * kh] = byte_permute(first, second, 0x6420u);
        frag[s][2 * kh + 1] = byte_permute(first, second, 0x7531u);
      }
    }
}

// Where byte v of register r of k32 step s of thread `thread` sits in the chunk: its weight row
// (0..63) and real k (0..63); the inverse of the table above, for the CPU tests.
QGEMM_HOST_DEVICE constexpr int wgmma_codes8_row(int thread, int r) {
  return (thread / 32) * 16 + (thread % 32) / 4 + 8 * (r & 1);
}
QGEMM_HOST_DEVICE constexpr int wgmma_codes8_k(int thread, int s, int r, int v) {
  const int t = thread % 4;
  const int run = 2 * s + (r >> 1);
  return 16 * run + 2 * t + (v >> 1) + 8 * (v & 1);
}

}  // namespace qgemm::kernels
