// Tests of the number formats (include/qgemm/format.hpp, src/format/format.cpp).
//
// The oracle here shares no code with src/format: it reads a code's meaning straight off the
// format's fields as the specs define them (IEEE 754, OCP MX v1.0, the NVFP4 scale), builds the
// sorted ladder of every finite value of the format, and encodes by picking the nearest rung.
// Ties go to the rung that is an even multiple of the gap between the two candidates; for a
// format with mantissa bits that is the rung with an even mantissa LSB (IEEE roundTiesToEven),
// and for an exponent-only format (e8m0, no mantissa bit to be even) it is the larger power of
// two, which is what rounding the significand 1.1b to zero fraction bits gives. Overflow follows
// the header: IEEE formats round to inf as if the exponent were unbounded, all others saturate.
//
// Random inputs are drawn from a fresh seed (std::random_device) printed in every failure;
// set QGEMM_TEST_SEED to replay one.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/format.hpp"

namespace {

using qgemm::FloatSpecials;
using qgemm::Format;

std::uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("QGEMM_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

std::string hex_double(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%a (%.17g)", value, value);
  return text;
}

// ---------------------------------------------------------------------------------------------
// The oracle: what each code means, from the format's fields alone.

enum class CodeClass { Finite, Inf, NaN, Invalid };
struct CodeMeaning {
  CodeClass what = CodeClass::Finite;
  double value = 0.0;  // finite values and the sign of inf
};

std::uint32_t sign_mask_of(const Format& f) {
  return f.is_float() && f.is_signed ? 1u << (f.bits - 1) : 0u;
}

CodeMeaning reference_meaning(const Format& f, std::uint32_t code) {
  if (f.is_integer()) {
    std::int64_t value = code;
    if (f.is_signed && code >= (1u << (f.bits - 1))) value -= std::int64_t{1} << f.bits;
    if (value < f.min_int || value > f.max_int) return {CodeClass::Invalid, 0.0};
    return {CodeClass::Finite, static_cast<double>(value)};
  }
  const std::uint32_t sign_mask = sign_mask_of(f);
  const bool negative = (code & sign_mask) != 0;
  const std::uint32_t magnitude_bits = code & ~sign_mask;
  const std::uint32_t exponent_field = magnitude_bits >> f.mantissa_bits;
  const std::uint32_t mantissa_field = magnitude_bits & ((1u << f.mantissa_bits) - 1u);
  const std::uint32_t top_exponent = (1u << f.exponent_bits) - 1u;
  const std::uint32_t all_mantissa = (1u << f.mantissa_bits) - 1u;
  const double sign = negative ? -1.0 : 1.0;
  switch (f.specials) {
    case FloatSpecials::IEEE:
      if (exponent_field == top_exponent)
        return mantissa_field == 0 ? CodeMeaning{CodeClass::Inf, sign * INFINITY}
                                   : CodeMeaning{CodeClass::NaN, 0.0};
      break;
    case FloatSpecials::FiniteOneNaN:
      if (exponent_field == top_exponent && mantissa_field == all_mantissa)
        return {CodeClass::NaN, 0.0};
      break;
    case FloatSpecials::ExponentOnly:
      if (exponent_field == top_exponent) return {CodeClass::NaN, 0.0};
      return {CodeClass::Finite, std::ldexp(1.0, static_cast<int>(exponent_field) - f.bias)};
    case FloatSpecials::FiniteNoNaN: break;
  }
  // (-1)^s · (leading bit + mantissa / 2^m) · 2^(max(e, 1) - bias); the leading bit is 0 only
  // for the subnormal exponent field 0, which shares the scale of field 1.
  const double fraction =
      static_cast<double>(mantissa_field) / static_cast<double>(1u << f.mantissa_bits);
  const double significand = (exponent_field != 0 ? 1.0 : 0.0) + fraction;
  const int unbiased = std::max<int>(static_cast<int>(exponent_field), 1) - f.bias;
  return {CodeClass::Finite, sign * std::ldexp(significand, unbiased)};
}

// The canonical NaN our codec documents: IEEE quiet NaN (top mantissa bit), else the code with
// every magnitude bit set. Always with a clear sign bit.
std::uint32_t expected_nan_code(const Format& f) {
  const std::uint32_t top_exponent = (1u << f.exponent_bits) - 1u;
  if (f.specials == FloatSpecials::IEEE)
    return (top_exponent << f.mantissa_bits) | (1u << (f.mantissa_bits - 1));
  return (1u << (f.exponent_bits + f.mantissa_bits)) - 1u;
}

// Every finite value the encoder may land on, ascending. Signed floats: the non-negative half
// (the sign is applied separately, so -0 exists). Integers: every valid code.
struct Ladder {
  std::vector<double> values;
  std::vector<std::uint32_t> codes;
  std::optional<double> inf_rung;  // IEEE: where inf would sit with an unbounded exponent
  std::uint32_t inf_code = 0;
};

Ladder build_ladder(const Format& f) {
  const std::uint32_t code_count = 1u << f.bits;
  const std::uint32_t sign_mask = sign_mask_of(f);
  std::vector<std::pair<double, std::uint32_t>> rungs;
  for (std::uint32_t code = 0; code < code_count; ++code) {
    if (code & sign_mask) continue;
    CodeMeaning meaning = reference_meaning(f, code);
    if (meaning.what == CodeClass::Finite) rungs.emplace_back(meaning.value, code);
  }
  std::sort(rungs.begin(), rungs.end());
  Ladder ladder;
  for (auto& [value, code] : rungs) {
    ladder.values.push_back(value);
    ladder.codes.push_back(code);
  }
  if (f.is_float() && f.specials == FloatSpecials::IEEE) {
    // Max finite plus one quantum of the top binade (IEEE formats have m >= 1, so the two
    // largest rungs share that binade): 2^(emax + 1).
    const std::size_t n = ladder.values.size();
    ladder.inf_rung = ladder.values[n - 1] + (ladder.values[n - 1] - ladder.values[n - 2]);
    ladder.inf_code = ((1u << f.exponent_bits) - 1u) << f.mantissa_bits;
  }
  return ladder;
}

bool is_even_multiple(double value, double gap) { return std::fmod(value / gap, 2.0) == 0.0; }

// Encodes a non-NaN `x` with no call into qgemm: nearest rung, ties to the even multiple of the
// gap, then the overflow rule.
std::uint32_t oracle_encode(const Format& f, const Ladder& ladder, double x) {
  std::uint32_t sign = 0;
  double target = x;
  if (f.is_float() && f.is_signed) {
    sign = std::signbit(x) ? sign_mask_of(f) : 0u;
    target = std::fabs(x);
  }
  if (!f.is_signed && std::signbit(x)) target = 0.0;  // documented: negatives clamp up
  const std::vector<double>& v = ladder.values;
  if (target >= v.back()) {
    if (ladder.inf_rung) {
      const double midpoint = v.back() + (*ladder.inf_rung - v.back()) / 2;
      // At the midpoint the inf rung (2^(emax+1)) is the even multiple of the gap.
      if (target >= midpoint) return sign | ladder.inf_code;
    }
    return sign | ladder.codes.back();
  }
  if (target <= v.front()) return sign | ladder.codes.front();
  const std::size_t upper = std::upper_bound(v.begin(), v.end(), target) - v.begin();
  const double lo = v[upper - 1], hi = v[upper];
  const double midpoint = lo + (hi - lo) / 2;  // exact: rungs carry few significant bits
  std::size_t chosen = upper;
  if (target < midpoint) chosen = upper - 1;
  if (target == midpoint) chosen = is_even_multiple(lo, hi - lo) ? upper - 1 : upper;
  return sign | ladder.codes[chosen];
}

// ---------------------------------------------------------------------------------------------
// Formats under test.

std::vector<Format> codec_formats_up_to_8_bits() {
  std::vector<Format> out;
  for (const Format& f : qgemm::named_formats())
    if (f.bits <= 8) out.push_back(f);
  // Generic formats: other layouts, IEEE variants of finite ones, unsigned, odd biases, m = 0.
  for (const char* name :
       {"fp8_e3m4", "fp6_e2m3_ieee", "fp5_e2m2", "fp7_e3m3", "ufp8_e4m4", "fp8_e4m3_ieee",
        "fp8_e5m2_fn", "fp8_e4m3_finite", "fp6_e3m2_b2", "fp3_e1m1", "fp4_e1m2", "fp4_e3m0_fn",
        "fp4_e3m0", "ufp4_e4m0", "ufp6_e3m3_fn", "fp8_e2m5", "fp8_e6m1", "ufp5_e5m0_b10"})
    out.push_back(qgemm::parse_format(name));
  return out;
}

std::vector<Format> codec_formats_with_16_bits() {
  std::vector<Format> out = codec_formats_up_to_8_bits();
  out.push_back(qgemm::formats::fp16);
  out.push_back(qgemm::formats::bf16);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Every code.

TEST(FormatCodec, EveryCodeDecodesAsTheSpecSaysAndReencodesToItself) {
  for (const Format& f : codec_formats_with_16_bits()) {
    SCOPED_TRACE(f.name());
    const std::uint32_t code_count = 1u << f.bits;
    ASSERT_EQ(f.code_count(), code_count);
    int failures = 0;
    for (std::uint32_t code = 0; code < code_count && failures < 5; ++code) {
      const CodeMeaning meaning = reference_meaning(f, code);
      const bool valid = meaning.what != CodeClass::Invalid;
      if (qgemm::is_valid_code(f, code) != valid) {
        ADD_FAILURE() << "is_valid_code(" << code << ") = " << !valid;
        ++failures;
      }
      if (!valid) continue;
      const double decoded = qgemm::decode(f, code);
      const std::uint32_t reencoded = qgemm::encode(f, decoded);
      if (meaning.what == CodeClass::NaN) {
        // Every NaN pattern decodes to a NaN and encodes back to the one canonical NaN.
        if (!std::isnan(decoded) || reencoded != expected_nan_code(f)) {
          ADD_FAILURE() << "NaN code " << code << " decodes to " << decoded << ", re-encodes to "
                        << reencoded << " (canonical NaN " << expected_nan_code(f) << ")";
          ++failures;
        }
        continue;
      }
      // Bitwise comparison: keeps -0 apart from +0.
      const bool same_value =
          std::bit_cast<std::uint64_t>(decoded) ==
          std::bit_cast<std::uint64_t>(f.is_integer() ? meaning.value + 0.0 : meaning.value);
      if (!same_value || reencoded != code) {
        ADD_FAILURE() << "code " << code << ": decode " << hex_double(decoded) << ", spec "
                      << hex_double(meaning.value) << ", re-encodes to " << reencoded;
        ++failures;
      }
    }
    EXPECT_FALSE(qgemm::is_valid_code(f, code_count));
  }
}

TEST(FormatCodec, LimitsMatchTheEnumeratedValues) {
  for (const Format& f : codec_formats_with_16_bits()) {
    SCOPED_TRACE(f.name());
    const Ladder ladder = build_ladder(f);
    bool any_inf = false, any_nan = false;
    for (std::uint32_t code = 0; code < (1u << f.bits); ++code) {
      const CodeClass what = reference_meaning(f, code).what;
      any_inf = any_inf || what == CodeClass::Inf;
      any_nan = any_nan || what == CodeClass::NaN;
    }
    EXPECT_EQ(f.has_inf(), any_inf);
    EXPECT_EQ(f.has_nan(), any_nan);
    EXPECT_EQ(f.max_finite(), ladder.values.back());
    const double smallest_positive =
        *std::find_if(ladder.values.begin(), ladder.values.end(), [](double v) { return v > 0; });
    EXPECT_EQ(f.min_positive(), smallest_positive);
    if (f.is_integer()) {
      EXPECT_EQ(f.lowest(), ladder.values.front());
      EXPECT_EQ(f.min_normal(), 1.0);
      continue;
    }
    EXPECT_EQ(f.lowest(), f.is_signed ? -ladder.values.back() : ladder.values.front());
    // The smallest value whose exponent field is not zero (e8m0: code 0 is already normal).
    double smallest_normal = INFINITY;
    for (std::size_t i = 0; i < ladder.values.size(); ++i) {
      const bool normal =
          f.specials == FloatSpecials::ExponentOnly || (ladder.codes[i] >> f.mantissa_bits) != 0;
      if (normal) smallest_normal = std::min(smallest_normal, ladder.values[i]);
    }
    EXPECT_EQ(f.min_normal(), smallest_normal);
  }
}

// ---------------------------------------------------------------------------------------------
// Encoding arbitrary doubles against the oracle.

// Values that probe every rounding decision of the format: each gap's exact midpoint and its
// neighbouring doubles, random points inside gaps, the rungs themselves, the overflow threshold,
// values far beyond both ends, double subnormals, and a log-uniform sweep.
std::vector<double> probe_values(const Format& f, const Ladder& ladder, std::mt19937_64& rng) {
  std::vector<double> probes;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::vector<double>& v = ladder.values;
  const std::size_t gaps = v.size() - 1;
  const std::size_t gap_samples = std::min<std::size_t>(gaps, 3000);
  for (std::size_t s = 0; s < gap_samples; ++s) {
    const std::size_t i = gaps <= 3000 ? s : rng() % gaps;
    const double lo = v[i], hi = v[i + 1], mid = lo + (hi - lo) / 2;
    probes.insert(probes.end(),
                  {lo, hi, mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY),
                   lo + (hi - lo) * unit(rng), lo + (hi - lo) * unit(rng)});
  }
  const double top = v.back(), bottom = v.front();
  const double top_gap = top - v[v.size() - 2];
  const double overflow_mid = top + top_gap / 2;
  probes.insert(probes.end(),
                {overflow_mid, std::nextafter(overflow_mid, -INFINITY),
                 std::nextafter(overflow_mid, INFINITY), top + top_gap, top * (1 + 7 * unit(rng)),
                 1e300, std::numeric_limits<double>::max(), INFINITY, 5e-324, 1e-310,
                 std::numeric_limits<double>::min(), bottom - 10 * unit(rng), -1e300, -INFINITY});
  if (f.is_float()) {
    const double tiny = f.min_positive();
    probes.insert(probes.end(), {tiny / 2, std::nextafter(tiny / 2, 0.0),
                                 std::nextafter(tiny / 2, 1.0), tiny * unit(rng)});
  }
  std::uniform_real_distribution<double> log2_magnitude(-160.0, 160.0);
  for (int s = 0; s < 1500; ++s) probes.push_back(std::exp2(log2_magnitude(rng)));
  // Both signs of everything (integers and unsigned formats clamp the negative half).
  const std::size_t positive_count = probes.size();
  for (std::size_t i = 0; i < positive_count; ++i) probes.push_back(-probes[i]);
  probes.push_back(0.0);
  probes.push_back(-0.0);
  return probes;
}

TEST(FormatCodec, EncodeMatchesNearestRungOracle) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (QGEMM_TEST_SEED replays it)");
  std::mt19937_64 rng(seed);
  for (const Format& f : codec_formats_with_16_bits()) {
    SCOPED_TRACE(f.name());
    const Ladder ladder = build_ladder(f);
    int failures = 0;
    for (double x : probe_values(f, ladder, rng)) {
      const std::uint32_t expected = oracle_encode(f, ladder, x);
      const std::uint32_t got = qgemm::encode(f, x);
      // The float overload must agree with the oracle applied to the float's exact value.
      const float x_as_float = static_cast<float>(x);
      const std::uint32_t expected_from_float =
          oracle_encode(f, ladder, static_cast<double>(x_as_float));
      const std::uint32_t got_from_float = qgemm::encode(f, x_as_float);
      if (got != expected || got_from_float != expected_from_float) {
        ADD_FAILURE() << "encode(" << hex_double(x) << ") = " << got << " (float overload "
                      << got_from_float << "), oracle " << expected << " (float "
                      << expected_from_float << ")";
        if (++failures >= 5) break;
      }
    }
  }
}

TEST(FormatCodec, RoundingErrorStaysWithinHalfUlp) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Format& f : codec_formats_with_16_bits()) {
    SCOPED_TRACE(f.name());
    const Ladder ladder = build_ladder(f);
    std::uniform_real_distribution<double> in_range(f.lowest(), f.max_finite());
    for (int s = 0; s < 500; ++s) {
      const double x = in_range(rng);
      const double rounded = qgemm::round_to(f, x);
      ASSERT_EQ(rounded, qgemm::decode(f, qgemm::encode(f, x)));
      ASSERT_LE(std::fabs(rounded - x), qgemm::half_ulp(f, x)) << hex_double(x);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// fp32 / bf16 / fp16 against the machine's own conversions.

TEST(FormatCodec, Fp32AndBf16MatchHardwareBitPatterns) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int s = 0; s < 200000; ++s) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float value = std::bit_cast<float>(bits);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(qgemm::decode(qgemm::formats::fp32, bits)));
      continue;
    }
    ASSERT_EQ(qgemm::encode(qgemm::formats::fp32, value), bits) << value;
    ASSERT_EQ(qgemm::encode(qgemm::formats::fp32, static_cast<double>(value)), bits);
    ASSERT_EQ(qgemm::decode(qgemm::formats::fp32, bits), static_cast<double>(value));
    // bf16 is fp32 with the low 16 bits rounded off to nearest even (carry may reach inf).
    const std::uint32_t bf16_expected = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    ASSERT_EQ(qgemm::encode(qgemm::formats::bf16, value), bf16_expected)
        << std::hex << "fp32 bits 0x" << bits;
  }
  // Doubles into fp32: the compiler's double -> float conversion rounds to nearest even.
  std::uniform_real_distribution<double> log2_magnitude(-155.0, 130.0);
  for (int s = 0; s < 100000; ++s) {
    const double x = (rng() & 1 ? -1.0 : 1.0) * std::exp2(log2_magnitude(rng));
    ASSERT_EQ(qgemm::encode(qgemm::formats::fp32, x),
              std::bit_cast<std::uint32_t>(static_cast<float>(x)))
        << hex_double(x);
  }
}

#if defined(__FLT16_MAX__)
TEST(FormatCodec, Fp16MatchesCompilerFloat16) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log2_magnitude(-30.0, 20.0);
  for (int s = 0; s < 100000; ++s) {
    const double x = (rng() & 1 ? -1.0 : 1.0) * std::exp2(log2_magnitude(rng));
    const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    ASSERT_EQ(qgemm::encode(qgemm::formats::fp16, x), expected) << hex_double(x);
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// Literal boundary cases from the specs.

double decode_named(const char* name, std::uint32_t code) {
  return qgemm::decode(qgemm::parse_format(name), code);
}

TEST(FormatBoundaries, E4m3) {
  const Format& f = qgemm::formats::e4m3;  // OCP FP8 E4M3: no inf, S.1111.111 is NaN
  EXPECT_EQ(f.bits, 8);
  EXPECT_EQ(f.max_finite(), 448.0);
  EXPECT_EQ(qgemm::decode(f, 0x7E), 448.0);
  EXPECT_EQ(qgemm::decode(f, 0xFE), -448.0);
  EXPECT_TRUE(std::isnan(qgemm::decode(f, 0x7F)));
  EXPECT_TRUE(std::isnan(qgemm::decode(f, 0xFF)));
  EXPECT_EQ(qgemm::decode(f, 0x08), std::ldexp(1.0, -6));  // min normal
  EXPECT_EQ(qgemm::decode(f, 0x01), std::ldexp(1.0, -9));  // min subnormal
  EXPECT_EQ(qgemm::decode(f, 0x78), 256.0);
  // 448 < x <= 464 rounds to 448 anyway; above 464 the nearest rung (480) is the NaN code, and
  // saturation maps it (and everything up to inf) to 448.
  EXPECT_EQ(qgemm::encode(f, 464.0), 0x7Eu);
  EXPECT_EQ(qgemm::encode(f, 470.0), 0x7Eu);
  EXPECT_EQ(qgemm::encode(f, 480.0), 0x7Eu);
  EXPECT_EQ(qgemm::encode(f, 1e6), 0x7Eu);
  EXPECT_EQ(qgemm::encode(f, INFINITY), 0x7Eu);
  EXPECT_EQ(qgemm::encode(f, -INFINITY), 0xFEu);
  EXPECT_EQ(qgemm::encode(f, 400.0), 0x7Cu);  // tie 384 | 416 -> even mantissa 100 (384)
  EXPECT_EQ(qgemm::encode(f, 416.0), 0x7Du);
  EXPECT_EQ(qgemm::encode(f, 432.0), 0x7Eu);                 // tie 416 | 448 -> even mantissa 110
  EXPECT_EQ(qgemm::encode(f, std::ldexp(1.0, -10)), 0x00u);  // half of min: to 0
  EXPECT_EQ(qgemm::encode(f, std::ldexp(1.5, -10)), 0x01u);
  EXPECT_EQ(qgemm::encode(f, std::ldexp(3.0, -10)), 0x02u);   // tie 1 | 2 quanta -> 2
  EXPECT_EQ(qgemm::encode(f, -std::ldexp(1.0, -11)), 0x80u);  // tiny negative: -0
  EXPECT_EQ(qgemm::encode(f, std::nan("")), 0x7Fu);
  EXPECT_EQ(qgemm::encode(f, -std::nan("")), 0x7Fu);
}

TEST(FormatBoundaries, E5m2) {
  const Format& f = qgemm::formats::e5m2;  // OCP FP8 E5M2: IEEE-style inf and NaN
  EXPECT_EQ(f.max_finite(), 57344.0);
  EXPECT_EQ(qgemm::decode(f, 0x7B), 57344.0);
  EXPECT_EQ(qgemm::decode(f, 0x7C), INFINITY);
  EXPECT_EQ(qgemm::decode(f, 0xFC), -INFINITY);
  for (std::uint32_t nan : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu})
    EXPECT_TRUE(std::isnan(qgemm::decode(f, nan))) << nan;
  EXPECT_EQ(qgemm::decode(f, 0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(qgemm::decode(f, 0x04), std::ldexp(1.0, -14));
  EXPECT_EQ(qgemm::encode(f, 61439.0), 0x7Bu);  // below the midpoint to 65536
  EXPECT_EQ(qgemm::encode(f, 61440.0), 0x7Cu);  // the midpoint: ties to even, i.e. inf
  EXPECT_EQ(qgemm::encode(f, -61440.0), 0xFCu);
  EXPECT_EQ(qgemm::encode(f, 1e9), 0x7Cu);
  EXPECT_EQ(qgemm::encode(f, std::nan("")), 0x7Eu);
}

TEST(FormatBoundaries, Fp4AndFp6) {
  const double e2m1_values[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (std::uint32_t code = 0; code < 16; ++code) {
    const double value = qgemm::decode(qgemm::formats::e2m1, code);
    EXPECT_EQ(value, e2m1_values[code]) << code;
    EXPECT_EQ(std::signbit(value), code >= 8) << code;
  }
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m1, 5.0), 0x6u);    // tie 4 | 6 -> 4 (mantissa 0)
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m1, 2.5), 0x4u);    // tie 2 | 3 -> 2
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m1, 0.25), 0x0u);   // tie 0 | 0.5 -> 0
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m1, 0.75), 0x2u);   // tie .5 | 1 -> 1
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m1, 100.0), 0x7u);  // saturates
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m1, -INFINITY), 0xFu);
  EXPECT_EQ(qgemm::formats::e2m3.max_finite(), 7.5);
  EXPECT_EQ(decode_named("e2m3", 0x1F), 7.5);
  EXPECT_EQ(decode_named("e2m3", 0x01), 0.125);
  EXPECT_EQ(qgemm::encode(qgemm::formats::e2m3, 8.0), 0x1Fu);
  EXPECT_EQ(qgemm::formats::e3m2.max_finite(), 28.0);
  EXPECT_EQ(decode_named("e3m2", 0x1F), 28.0);
  EXPECT_EQ(decode_named("e3m2", 0x01), 0.0625);
  EXPECT_EQ(qgemm::encode(qgemm::formats::e3m2, 1e4), 0x1Fu);
}

TEST(FormatBoundaries, ScaleFormats) {
  const Format& e8m0 = qgemm::formats::e8m0;  // OCP MX scale: 2^(code - 127), 0xFF = NaN
  EXPECT_EQ(e8m0.bits, 8);
  EXPECT_EQ(qgemm::decode(e8m0, 0), std::ldexp(1.0, -127));
  EXPECT_EQ(qgemm::decode(e8m0, 127), 1.0);
  EXPECT_EQ(qgemm::decode(e8m0, 254), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(qgemm::decode(e8m0, 255)));
  EXPECT_EQ(qgemm::encode(e8m0, 1.0), 127u);
  EXPECT_EQ(qgemm::encode(e8m0, 1.4), 127u);
  EXPECT_EQ(qgemm::encode(e8m0, 1.5), 128u);  // tie 1 | 2 -> the larger power (see top)
  EXPECT_EQ(qgemm::encode(e8m0, 1e300), 254u);
  EXPECT_EQ(qgemm::encode(e8m0, 0.0), 0u);   // no zero: the smallest scale
  EXPECT_EQ(qgemm::encode(e8m0, -4.0), 0u);  // unsigned: negatives clamp to the smallest
  EXPECT_EQ(qgemm::encode(e8m0, std::nan("")), 255u);
  const Format& ue4m3 = qgemm::formats::ue4m3;  // NVFP4 block scale: e4m3 without the sign
  EXPECT_FALSE(ue4m3.is_signed);
  EXPECT_EQ(ue4m3.max_finite(), 448.0);
  EXPECT_EQ(qgemm::decode(ue4m3, 0x7E), 448.0);
  EXPECT_TRUE(std::isnan(qgemm::decode(ue4m3, 0x7F)));
  EXPECT_EQ(qgemm::encode(ue4m3, 1000.0), 0x7Eu);
  EXPECT_EQ(qgemm::encode(ue4m3, -3.0), 0x00u);
  EXPECT_EQ(ue4m3.lowest(), 0.0);
}

TEST(FormatBoundaries, WideFloats) {
  EXPECT_EQ(qgemm::formats::fp16.max_finite(), 65504.0);
  EXPECT_EQ(qgemm::decode(qgemm::formats::fp16, 0x7BFF), 65504.0);
  EXPECT_EQ(qgemm::formats::fp16.min_positive(), std::ldexp(1.0, -24));
  EXPECT_EQ(qgemm::formats::fp16.min_normal(), std::ldexp(1.0, -14));
  EXPECT_EQ(qgemm::encode(qgemm::formats::fp16, 65520.0), 0x7C00u);  // midpoint to 2^16: inf
  EXPECT_EQ(qgemm::encode(qgemm::formats::fp16, 65519.0), 0x7BFFu);
  EXPECT_EQ(qgemm::encode(qgemm::formats::fp16, std::nan("")), 0x7E00u);
  EXPECT_EQ(qgemm::formats::bf16.max_finite(), 3.3895313892515355e38);
  EXPECT_EQ(qgemm::decode(qgemm::formats::bf16, 0x7F7F), 3.3895313892515355e38);
  EXPECT_EQ(qgemm::encode(qgemm::formats::bf16, std::nan("")), 0x7FC0u);
  EXPECT_EQ(qgemm::formats::fp32.max_finite(),
            static_cast<double>(std::numeric_limits<float>::max()));
  EXPECT_EQ(qgemm::formats::fp32.min_positive(),
            static_cast<double>(std::numeric_limits<float>::denorm_min()));
  EXPECT_EQ(qgemm::encode(qgemm::formats::fp32, std::nan("")), 0x7FC00000u);
  EXPECT_EQ(qgemm::formats::e3m4.max_finite(), 15.5);
  EXPECT_EQ(qgemm::decode(qgemm::formats::e3m4, 0x70), INFINITY);
}

TEST(FormatBoundaries, Integers) {
  const Format& int4 = qgemm::formats::int4;
  EXPECT_EQ(int4.min_int, -8);
  EXPECT_EQ(int4.max_int, 7);
  EXPECT_EQ(qgemm::encode(int4, 7.6), 7u);
  EXPECT_EQ(qgemm::encode(int4, -8.6), 8u);
  EXPECT_EQ(qgemm::encode(int4, 2.5), 2u);  // ties to even
  EXPECT_EQ(qgemm::encode(int4, 3.5), 4u);
  EXPECT_EQ(qgemm::encode(int4, -2.5), 0xEu);
  EXPECT_EQ(qgemm::encode(int4, -0.0), 0u);
  EXPECT_EQ(qgemm::encode(int4, INFINITY), 7u);
  EXPECT_EQ(qgemm::decode(int4, 0xF), -1.0);
  EXPECT_EQ(qgemm::encode(qgemm::formats::uint4, -3.0), 0u);
  EXPECT_EQ(qgemm::encode(qgemm::formats::uint4, 20.0), 15u);
  EXPECT_EQ(qgemm::encode(qgemm::formats::uint8, 254.5), 254u);
  const Format ternary = qgemm::formats::ternary();
  EXPECT_EQ(ternary.bits, 2);
  EXPECT_EQ(qgemm::encode(ternary, -5.0), 3u);  // -1
  EXPECT_EQ(qgemm::encode(ternary, 0.7), 1u);
  EXPECT_EQ(qgemm::encode(ternary, -0.3), 0u);
  EXPECT_FALSE(qgemm::is_valid_code(ternary, 2));  // -2 is not ternary
  EXPECT_TRUE(qgemm::is_valid_code(ternary, 3));
}

TEST(FormatBoundaries, NegativeZeroKeepsItsSign) {
  for (const Format& f : {qgemm::formats::e4m3, qgemm::formats::e5m2, qgemm::formats::e2m1,
                          qgemm::formats::fp16, qgemm::formats::bf16, qgemm::formats::fp32}) {
    SCOPED_TRACE(f.name());
    const std::uint32_t negative_zero = 1u << (f.bits - 1);
    EXPECT_EQ(qgemm::encode(f, -0.0), negative_zero);
    EXPECT_EQ(qgemm::encode(f, -0.0f), negative_zero);
    EXPECT_EQ(qgemm::encode(f, 0.0), 0u);
    const double decoded = qgemm::decode(f, negative_zero);
    EXPECT_EQ(decoded, 0.0);
    EXPECT_TRUE(std::signbit(decoded));
  }
}

TEST(FormatBoundaries, NanIntoAFormatWithoutNanIsAnError) {
  for (const Format& f : {qgemm::formats::e2m1, qgemm::formats::e2m3, qgemm::formats::e3m2,
                          qgemm::formats::int4, qgemm::formats::uint8, qgemm::formats::ternary()}) {
    SCOPED_TRACE(f.name());
    for (double nan : {std::nan(""), -std::nan("")}) {
      try {
        qgemm::encode(f, nan);
        ADD_FAILURE() << "no error for NaN";
      } catch (const qgemm::Error& error) {
        EXPECT_EQ(error.code(), qgemm::ErrorCode::InvalidArgument);
        EXPECT_NE(std::string(error.what()).find("NaN"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find(f.name()), std::string::npos) << error.what();
      }
    }
    EXPECT_THROW(qgemm::encode(f, std::nanf("")), qgemm::Error);
  }
}

// ---------------------------------------------------------------------------------------------
// Names.

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

TEST(FormatNames, CanonicalNamesAndAliasesParseBack) {
  std::set<std::string> seen;
  for (const Format& f : qgemm::named_formats()) {
    const std::string name = f.name();
    SCOPED_TRACE(name);
    EXPECT_TRUE(seen.insert(name).second) << "duplicate canonical name";
    EXPECT_EQ(qgemm::parse_format(name), f);
    EXPECT_EQ(qgemm::parse_format(upper(name)), f);
    for (const std::string& alias : qgemm::format_aliases(f)) {
      EXPECT_TRUE(seen.insert(alias).second) << "alias " << alias << " names two formats";
      EXPECT_EQ(qgemm::parse_format(alias), f) << alias;
      EXPECT_EQ(qgemm::parse_format(upper(alias)), f) << alias;
    }
  }
  // The names the issue promises, and common spellings from checkpoints and frameworks.
  for (const char* required :
       {"int2", "int3", "int4", "int8", "uint1", "uint5", "uint8", "ternary", "e4m3", "e5m2",
        "e3m4", "e2m1", "e3m2", "e2m3", "e8m0", "ue4m3", "fp16", "bf16", "fp32"})
    EXPECT_TRUE(seen.count(required)) << required;
  EXPECT_EQ(qgemm::parse_format("float8_e4m3fn"), qgemm::formats::e4m3);
  EXPECT_EQ(qgemm::parse_format("E4M3FN"), qgemm::formats::e4m3);
  EXPECT_EQ(qgemm::parse_format("float8_e5m2"), qgemm::formats::e5m2);
  EXPECT_EQ(qgemm::parse_format("s4"), qgemm::formats::int4);
  EXPECT_EQ(qgemm::parse_format("u4"), qgemm::formats::uint4);
  EXPECT_EQ(qgemm::parse_format("bfloat16"), qgemm::formats::bf16);
  EXPECT_EQ(qgemm::parse_format("float8_e8m0fnu"), qgemm::formats::e8m0);
}

TEST(FormatNames, GenericNamesDescribeTheirLayoutAndRoundTrip) {
  const Format e4m3_ieee = qgemm::parse_format("fp8_e4m3_ieee");
  EXPECT_EQ(e4m3_ieee.specials, FloatSpecials::IEEE);
  EXPECT_EQ(e4m3_ieee.bias, 7);
  EXPECT_EQ(e4m3_ieee.max_finite(), 240.0);
  const Format fp5 = qgemm::parse_format("fp5_e2m2");
  EXPECT_EQ(fp5.bits, 5);
  EXPECT_EQ(fp5.specials, FloatSpecials::FiniteNoNaN);  // small formats default to finite
  EXPECT_EQ(qgemm::parse_format("fp7_e3m3").specials, FloatSpecials::IEEE);
  const Format unsigned_fp8 = qgemm::parse_format("ufp8_e4m4");
  EXPECT_FALSE(unsigned_fp8.is_signed);
  EXPECT_EQ(unsigned_fp8.bits, 8);
  EXPECT_EQ(qgemm::parse_format("fp6_e3m2_b2").bias, 2);
  EXPECT_EQ(qgemm::parse_format("fp6_e3m2_b2").max_finite(), 56.0);
  EXPECT_EQ(qgemm::parse_format("fp8_e4m3_fn"), qgemm::formats::e4m3);
  EXPECT_EQ(qgemm::parse_format("fp6_e2m3"), qgemm::formats::e2m3);
  EXPECT_EQ(qgemm::parse_format("fp16_e5m10"), qgemm::formats::fp16);
  EXPECT_EQ(qgemm::parse_format("ufp8_e8m0"), qgemm::formats::e8m0);
  for (const Format& f : codec_formats_up_to_8_bits()) {
    SCOPED_TRACE(f.name());
    EXPECT_EQ(qgemm::parse_format(f.name()), f);
  }
}

TEST(FormatNames, BadNamesGiveAnErrorNamingTheText) {
  for (const char* bad : {"", "bogus", "int9", "uint0", "int1", "Int12", "e9m2", "e4m24",
                          "fp8_e5m3", "fp8_e4m3_xyz", "fp8_e7m0", "e1m2_ieee", "fp2_e1m0_fn", "e4m",
                          "e4m3x", "mxfp4", "fp99_e4m3", "fp8_", "uint4 "}) {
    SCOPED_TRACE(bad);
    try {
      qgemm::parse_format(bad);
      ADD_FAILURE() << "accepted";
    } catch (const qgemm::Error& error) {
      EXPECT_EQ(error.code(), qgemm::ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(error.what()).find("'" + std::string(bad) + "'"), std::string::npos)
          << error.what();
    }
  }
}

}  // namespace
