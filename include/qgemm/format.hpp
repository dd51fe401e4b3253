// Number formats: one description for every format qgemm packs, computes in or scales with.
//
// A Format is data. The host codec (src/format), the JIT's kernel parameters (src/jit) and the
// tests all derive from these fields; nothing else in the library names a format's bit layout.
//
//   integer  : `bits` wide, two's complement when signed; range [min_int, max_int]
//   floating : [sign?][exponent_bits][mantissa_bits], value = (-1)^s · 2^(e - bias) · 1.m
//              (e = 0: subnormal 2^(1 - bias) · 0.m), except as `specials` says for the top codes
//
// Special-value conventions (how the top exponent code is spent):
//   IEEE          exponent all ones: mantissa 0 = ±inf, else NaN           e5m2 fp16 bf16 fp32 e3m4
//   FiniteOneNaN  no inf; exponent and mantissa all ones = NaN             e4m3 (fn), ue4m3
//   FiniteNoNaN   every code is a finite number                            e2m1 e2m3 e3m2
//   ExponentOnly  unsigned, no mantissa, no zero: 2^(code - bias), all ones = NaN    e8m0
//
// Encoding (double -> code) rounds to nearest, ties to even. Overflow: IEEE formats round to
// ±inf by the IEEE rule; all others saturate to ±max finite. Unsigned formats clamp negatives
// to their smallest value (0, or 2^-127 for e8m0). NaN input encodes to the format's NaN code;
// in a format without NaN it is an error (qgemm::Error, InvalidArgument), never a silent value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qgemm {

enum class NumberKind : std::uint8_t { Integer, Float };
enum class FloatSpecials : std::uint8_t { IEEE, FiniteOneNaN, FiniteNoNaN, ExponentOnly };

struct Format {
  NumberKind kind = NumberKind::Float;
  bool is_signed = true;
  int bits = 32;           // bits that carry the value (codes are 0 .. 2^bits - 1)
  int exponent_bits = 8;   // floating only
  int mantissa_bits = 23;  // floating only
  int bias = 127;          // floating only
  FloatSpecials specials = FloatSpecials::IEEE;
  int min_int = 0, max_int = 0;  // integer only (ternary narrows int2 to [-1, 1])

  static constexpr Format integer(int bits, bool is_signed) {
    Format f{};
    f.kind = NumberKind::Integer;
    f.is_signed = is_signed;
    f.bits = bits;
    f.exponent_bits = 0;
    f.mantissa_bits = 0;
    f.bias = 0;
    f.min_int = is_signed ? -(1 << (bits - 1)) : 0;
    f.max_int = is_signed ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
    return f;
  }
  static constexpr Format floating(int exponent_bits, int mantissa_bits, FloatSpecials specials,
                                   bool is_signed = true) {
    Format f{};
    f.kind = NumberKind::Float;
    f.is_signed = is_signed;
    f.exponent_bits = exponent_bits;
    f.mantissa_bits = mantissa_bits;
    f.bits = (is_signed ? 1 : 0) + exponent_bits + mantissa_bits;
    f.bias = (1 << (exponent_bits - 1)) - 1;
    f.specials = specials;
    return f;
  }

  constexpr bool is_integer() const { return kind == NumberKind::Integer; }
  constexpr bool is_float() const { return kind == NumberKind::Float; }
  constexpr bool has_inf() const { return is_float() && specials == FloatSpecials::IEEE; }
  constexpr bool has_nan() const { return is_float() && specials != FloatSpecials::FiniteNoNaN; }
  constexpr std::uint32_t code_count() const { return bits >= 32 ? 0u : (1u << bits); }
  // Bytes one element occupies when stored unpacked (scales, activations, outputs).
  constexpr int storage_bytes() const { return bits <= 8 ? 1 : bits <= 16 ? 2 : 4; }

  // Canonical spelling: int4, uint3, ternary, e4m3, e5m2, e2m1, e8m0, ue4m3, fp16, bf16, fp32,
  // and fpN_eXmY[_ieee|_fn|_finite] for any other floating format.
  std::string name() const;
  double max_finite() const;    // largest finite value (max_int for integers)
  double lowest() const;        // most negative finite value (0 or 2^-127 when unsigned)
  double min_normal() const;    // smallest positive normal (1 for integers)
  double min_positive() const;  // smallest positive value (subnormal where there are any)

  friend constexpr bool operator==(const Format& a, const Format& b) {
    return a.kind == b.kind && a.is_signed == b.is_signed && a.bits == b.bits &&
           a.exponent_bits == b.exponent_bits && a.mantissa_bits == b.mantissa_bits &&
           a.bias == b.bias && a.specials == b.specials && a.min_int == b.min_int &&
           a.max_int == b.max_int;
  }
};

namespace formats {
constexpr Format int_(int bits) { return Format::integer(bits, true); }
constexpr Format uint_(int bits) { return Format::integer(bits, false); }
constexpr Format ternary() {
  Format f = Format::integer(2, true);
  f.min_int = -1;
  return f;
}
inline constexpr Format int4 = int_(4);
inline constexpr Format int8 = int_(8);
inline constexpr Format uint4 = uint_(4);
inline constexpr Format uint8 = uint_(8);
inline constexpr Format e4m3 = Format::floating(4, 3, FloatSpecials::FiniteOneNaN);
inline constexpr Format e5m2 = Format::floating(5, 2, FloatSpecials::IEEE);
inline constexpr Format e3m4 = Format::floating(3, 4, FloatSpecials::IEEE);
inline constexpr Format e2m1 = Format::floating(2, 1, FloatSpecials::FiniteNoNaN);
inline constexpr Format e2m3 = Format::floating(2, 3, FloatSpecials::FiniteNoNaN);
inline constexpr Format e3m2 = Format::floating(3, 2, FloatSpecials::FiniteNoNaN);
inline constexpr Format e8m0 = Format::floating(8, 0, FloatSpecials::ExponentOnly, false);
inline constexpr Format ue4m3 = Format::floating(4, 3, FloatSpecials::FiniteOneNaN, false);
inline constexpr Format fp16 = Format::floating(5, 10, FloatSpecials::IEEE);
inline constexpr Format bf16 = Format::floating(8, 7, FloatSpecials::IEEE);
inline constexpr Format fp32 = Format::floating(8, 23, FloatSpecials::IEEE);
}  // namespace formats

// Parses a canonical name or an alias (case-insensitive): "int4", "s4", "u4", "fp8_e4m3",
// "float8_e4m3fn", "e4m3fn", "fp4", "mxfp4"-style element names are NOT formats (see scheme).
// Throws qgemm::Error naming the text when it is not a format.
Format parse_format(std::string_view text);

// The named formats (canonical spellings), integers of 1-8 bits first.
std::vector<Format> named_formats();
// Aliases accepted for `format` (not including its canonical name).
std::vector<std::string> format_aliases(const Format& format);

// Exact codec. `encode` rounds to nearest even (see the header comment for overflow and NaN);
// `decode` is exact. Codes are right-aligned in a uint32 (bits above `bits` are zero).
std::uint32_t encode(const Format& format, double value);
std::uint32_t encode(const Format& format, float value);
double decode(const Format& format, std::uint32_t code);
// True when `code` is a code of the format (integer codes outside [min_int, max_int] are not).
bool is_valid_code(const Format& format, std::uint32_t code);
// Rounds `value` to the nearest representable value (decode(encode(value))).
double round_to(const Format& format, double value);
// Half the distance to the next representable magnitude above |value| (for error bounds):
// the largest rounding error `encode` makes on a value of this magnitude, 0 when exact range.
double half_ulp(const Format& format, double value);

}  // namespace qgemm
