// libFuzzer target: number-format names (parse_format), named, aliases and generic
// [u]fpN_eXmY[_ieee|_fn|_finite][_bB]. A parsed format must be self-consistent: its canonical
// name parses back to it, its limits are ordered, and its codec round-trips every code.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "qgemm/format.hpp"

namespace {

using qgemm::Format;

std::string describe(const Format& f) { return "format " + f.name(); }

void check_fields(const Format& f) {
  FUZZ_CHECK(f.bits >= 1 && f.bits <= 32, describe(f));
  if (f.is_integer()) {
    FUZZ_CHECK(f.bits <= 8, describe(f));
    FUZZ_CHECK(f.min_int <= 0 && f.min_int < f.max_int, describe(f));
    return;
  }
  FUZZ_CHECK(f.exponent_bits >= 1 && f.exponent_bits <= 8, describe(f));
  FUZZ_CHECK(f.mantissa_bits >= 0 && f.mantissa_bits <= 23, describe(f));
  FUZZ_CHECK(f.bits == (f.is_signed ? 1 : 0) + f.exponent_bits + f.mantissa_bits, describe(f));
}

void check_names(const Format& f) {
  const std::string name = f.name();
  FUZZ_CHECK(!name.empty(), describe(f));
  const Format again = qgemm::parse_format(name);  // the canonical name must parse
  FUZZ_CHECK(again == f, "the canonical name " + name + " parses to " + again.name());
  for (const std::string& alias : qgemm::format_aliases(f))
    FUZZ_CHECK(qgemm::parse_format(alias) == f, "alias " + alias + " of " + name);
}

void check_limits(const Format& f) {
  const double max = f.max_finite(), lowest = f.lowest();
  const double min_normal = f.min_normal(), min_positive = f.min_positive();
  FUZZ_CHECK(std::isfinite(max) && max > 0, describe(f));
  FUZZ_CHECK(std::isfinite(lowest) && lowest <= max, describe(f));  // ufp1_e1m0: {1, NaN}
  if (f.is_integer())
    FUZZ_CHECK(lowest == f.min_int && max == f.max_int, describe(f));
  else
    FUZZ_CHECK(f.is_signed ? lowest == -max : lowest >= 0, describe(f));
  FUZZ_CHECK(min_positive > 0 && min_positive <= min_normal && min_normal <= max, describe(f));
}

// Every code (or a sample of 4096 for wide formats) decodes to a value that encodes back to it.
void check_codes(const Format& f) {
  const std::uint64_t count = f.bits >= 32 ? (std::uint64_t{1} << 32) : (std::uint64_t{1} << f.bits);
  const std::uint64_t step = count <= 4096 ? 1 : count / 4096 + 1;
  for (std::uint64_t c = 0; c < count; c += step) {
    for (std::uint64_t code64 : {c, count - 1 - c}) {
      const auto code = static_cast<std::uint32_t>(code64);
      if (!qgemm::is_valid_code(f, code)) continue;
      const double value = qgemm::decode(f, code);
      if (std::isnan(value)) {
        FUZZ_CHECK(f.has_nan(), describe(f) + ": a NaN code in a format without NaN");
        FUZZ_CHECK(std::isnan(qgemm::decode(f, qgemm::encode(f, value))), describe(f));
        continue;
      }
      if (std::isinf(value)) FUZZ_CHECK(f.has_inf(), describe(f) + ": inf without infinities");
      const std::uint32_t back = qgemm::encode(f, value);
      FUZZ_CHECK(back == code, describe(f) + ": code " + std::to_string(code) + " decodes to " +
                                   std::to_string(value) + ", which encodes to " +
                                   std::to_string(back));
    }
  }
}

// Rounding: idempotent, within range, and within half an ulp for values inside the range.
void check_rounding(const Format& f) {
  const double max = f.max_finite(), tiny = f.min_positive();
  const double values[] = {0.0,        1.0,        0.3,         1.0 / 3,      2.5,     1e-300,
                           1e300,      max,        max * 1.5,   max * 0.999,  tiny,    tiny * 0.5,
                           tiny * 0.75, tiny * 1.5, f.min_normal(), 7.0,       65504.0, 448.0,
                           std::numeric_limits<double>::infinity()};
  for (double magnitude : values) {
    for (double x : {magnitude, -magnitude}) {
      const double r = qgemm::round_to(f, x);
      FUZZ_CHECK(!std::isnan(r), describe(f) + ": NaN from " + std::to_string(x));
      FUZZ_CHECK(qgemm::round_to(f, r) == r, describe(f) + ": rounding is not idempotent");
      if (!f.has_inf())
        FUZZ_CHECK(r >= f.lowest() && r <= max, describe(f) + ": outside [lowest, max_finite]");
      const bool in_range = x >= f.lowest() && x <= max &&
                            (f.specials != qgemm::FloatSpecials::ExponentOnly || x >= tiny);
      if (in_range)
        FUZZ_CHECK(std::fabs(r - x) <= qgemm::half_ulp(f, x),
                   describe(f) + ": " + std::to_string(x) + " rounds to " + std::to_string(r) +
                       ", farther than half_ulp");
    }
  }
  // NaN encodes to the NaN code, or is an error (qgemm::Error) for a format without one.
  if (f.has_nan())
    FUZZ_CHECK(std::isnan(qgemm::round_to(f, std::numeric_limits<double>::quiet_NaN())),
               describe(f));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  qgemm::fuzz::expect_object_or_error([&] {
    const Format f = qgemm::parse_format(text);
    check_fields(f);
    check_names(f);
    check_limits(f);
    check_codes(f);
    check_rounding(f);
  });
  return 0;
}
