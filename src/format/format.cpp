// Host codec for every qgemm::Format: names, limits, exact encode (round to nearest even) and
// decode. See include/qgemm/format.hpp for the conventions.
#include "qgemm/format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "qgemm/error.hpp"

namespace qgemm {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Fixed names, canonical first in each row. Integers and fpN_eXmY are parsed generically.
struct NamedFormat {
  Format format;
  std::vector<std::string> names;
};
const std::vector<NamedFormat>& named_float_table() {
  static const std::vector<NamedFormat> table = {
      {formats::e4m3, {"e4m3", "e4m3fn", "fp8_e4m3", "float8_e4m3fn", "fp8"}},
      {formats::e5m2, {"e5m2", "fp8_e5m2", "float8_e5m2"}},
      {formats::e3m4, {"e3m4", "fp8_e3m4", "float8_e3m4"}},
      {formats::e2m1, {"e2m1", "fp4", "fp4_e2m1", "float4_e2m1fn"}},
      {formats::e2m3, {"e2m3", "fp6_e2m3", "float6_e2m3fn"}},
      {formats::e3m2, {"e3m2", "fp6_e3m2", "float6_e3m2fn"}},
      {formats::e8m0, {"e8m0", "ue8m0", "float8_e8m0fnu"}},
      {formats::ue4m3, {"ue4m3"}},
      {formats::fp16, {"fp16", "half", "float16", "f16"}},
      {formats::bf16, {"bf16", "bfloat16"}},
      {formats::fp32, {"fp32", "float", "float32", "f32"}},
  };
  return table;
}

const char* specials_suffix(FloatSpecials s) {
  switch (s) {
    case FloatSpecials::IEEE: return "ieee";
    case FloatSpecials::FiniteOneNaN: return "fn";
    case FloatSpecials::FiniteNoNaN: return "finite";
    case FloatSpecials::ExponentOnly: return "e8m0";
  }
  return "?";
}

// Default convention of a generic fpN_eXmY name: formats of 6 bits or fewer are finite (as the
// OCP MX element types), wider ones IEEE.
FloatSpecials default_specials(int total_bits) {
  return total_bits <= 6 ? FloatSpecials::FiniteNoNaN : FloatSpecials::IEEE;
}

bool parse_int(std::string_view text, int& value) {
  if (text.empty() || text.size() > 3) return false;
  value = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    value = value * 10 + (c - '0');
  }
  return true;
}

// "e4m3" -> (4, 3); false when the text is not of that shape.
bool parse_exponent_mantissa(std::string_view text, int& e, int& m) {
  if (text.size() < 4 || text[0] != 'e') return false;
  auto mpos = text.find('m');
  if (mpos == std::string_view::npos) return false;
  return parse_int(text.substr(1, mpos - 1), e) && parse_int(text.substr(mpos + 1), m);
}

// Exponent of the value's leading bit: |v| in [2^e, 2^(e+1)).
int exponent_of(double magnitude) {
  int exp2 = 0;
  std::frexp(magnitude, &exp2);
  return exp2 - 1;
}

int max_exponent_field(const Format& f) {
  int all_ones = (1 << f.exponent_bits) - 1;
  return f.specials == FloatSpecials::IEEE || f.specials == FloatSpecials::ExponentOnly
             ? all_ones - 1
             : all_ones;
}

std::uint32_t sign_bit(const Format& f) { return f.is_signed ? (1u << (f.bits - 1)) : 0u; }

std::uint32_t nan_code(const Format& f) {
  switch (f.specials) {
    case FloatSpecials::IEEE:  // quiet NaN: exponent all ones, top mantissa bit
      return (((1u << f.exponent_bits) - 1) << f.mantissa_bits) |
             (f.mantissa_bits > 0 ? 1u << (f.mantissa_bits - 1) : 0u);
    case FloatSpecials::FiniteOneNaN:
    case FloatSpecials::ExponentOnly: return (1u << (f.exponent_bits + f.mantissa_bits)) - 1;
    case FloatSpecials::FiniteNoNaN: break;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("value NaN: format {} has no NaN encoding", f.name()));
}

std::uint32_t encode_integer(const Format& f, double value) {
  double r = std::nearbyint(value);  // the default rounding mode: nearest, ties to even
  r = std::clamp(r, static_cast<double>(f.min_int), static_cast<double>(f.max_int));
  auto as_int = static_cast<std::int64_t>(r);
  return static_cast<std::uint32_t>(as_int) & static_cast<std::uint32_t>(f.code_count() - 1);
}

std::uint32_t encode_exponent_only(const Format& f, double magnitude) {
  // Nearest power of two, ties (1.5 · 2^e) to the even significand, i.e. up.
  int min_exp = -f.bias, max_exp = max_exponent_field(f) - f.bias;
  if (!(magnitude > 0)) return 0;
  if (std::isinf(magnitude)) return static_cast<std::uint32_t>(max_exp + f.bias);
  int e = exponent_of(magnitude);
  double significand = std::ldexp(magnitude, -e);  // [1, 2)
  if (std::nearbyint(significand) >= 2.0) ++e;
  e = std::clamp(e, min_exp, max_exp);
  return static_cast<std::uint32_t>(e + f.bias);
}

std::uint32_t encode_float(const Format& f, double value) {
  if (std::isnan(value)) return nan_code(f);
  bool negative = std::signbit(value);
  if (!f.is_signed && negative) value = 0.0;  // clamp: an unsigned format has no negatives
  double magnitude = std::fabs(value);
  if (f.specials == FloatSpecials::ExponentOnly) return encode_exponent_only(f, magnitude);
  std::uint32_t sign = negative && f.is_signed ? sign_bit(f) : 0u;
  const int m = f.mantissa_bits;
  const int min_exp = 1 - f.bias;
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1;
  auto overflow = [&]() -> std::uint32_t {
    if (f.has_inf()) return sign | (exp_all_ones << m);
    return sign | encode_float(f, f.max_finite());
  };
  if (std::isinf(magnitude)) return overflow();
  if (magnitude == 0.0) return sign;
  int e = std::max(exponent_of(magnitude), min_exp);
  // The quantum at this exponent is 2^(e - m); scaling by a power of two is exact.
  double significand = std::nearbyint(std::ldexp(magnitude, m - e));  // ties to even
  if (significand >= std::ldexp(1.0, m + 1)) {  // rounding carried into the next binade
    significand = std::ldexp(significand, -1);
    ++e;
  }
  if (std::ldexp(significand, e - m) > f.max_finite()) return overflow();
  auto mantissa_field = static_cast<std::uint32_t>(significand);
  std::uint32_t exponent_field = 0;
  if (mantissa_field >= (1u << m)) {  // normal: drop the implicit leading one
    exponent_field = static_cast<std::uint32_t>(e + f.bias);
    mantissa_field -= 1u << m;
  }
  return sign | (exponent_field << m) | mantissa_field;
}

}  // namespace

std::string Format::name() const {
  if (is_integer()) {
    if (is_signed && min_int == -1 && bits == 2) return "ternary";
    return fmt::format("{}int{}", is_signed ? "" : "u", bits);
  }
  for (const auto& entry : named_float_table())
    if (entry.format == *this) return entry.names.front();
  std::string base = fmt::format("fp{}_e{}m{}", bits, exponent_bits, mantissa_bits);
  if (!is_signed) base = "u" + base;
  // parse_format makes every unsigned mantissa-less format exponent-only (as e8m0).
  const FloatSpecials implied =
      !is_signed && mantissa_bits == 0 ? FloatSpecials::ExponentOnly : default_specials(bits);
  // A base that is an alias of a fixed name (fp8_e4m3 = e4m3fn) must spell out its specials.
  bool base_is_alias = false;
  for (const auto& entry : named_float_table())
    for (const auto& alias : entry.names) base_is_alias = base_is_alias || alias == base;
  if (specials != implied || base_is_alias) base += "_" + std::string(specials_suffix(specials));
  if (bias != (1 << (exponent_bits - 1)) - 1) base += fmt::format("_b{}", bias);
  return base;
}

double Format::max_finite() const {
  if (is_integer()) return max_int;
  const int m = mantissa_bits;
  if (specials == FloatSpecials::ExponentOnly)
    return std::ldexp(1.0, max_exponent_field(*this) - bias);
  if (specials == FloatSpecials::FiniteOneNaN && m == 0)  // the top exponent is the NaN
    return std::ldexp(1.0, max_exponent_field(*this) - 1 - bias);
  double all_ones_mantissa = 2.0 - std::ldexp(1.0, -m);
  double significand = specials == FloatSpecials::FiniteOneNaN
                           ? all_ones_mantissa - std::ldexp(1.0, -m)  // top code is the NaN
                           : all_ones_mantissa;
  return std::ldexp(significand, max_exponent_field(*this) - bias);
}

double Format::lowest() const {
  if (is_integer()) return min_int;
  if (!is_signed) return specials == FloatSpecials::ExponentOnly ? std::ldexp(1.0, -bias) : 0.0;
  return -max_finite();
}

double Format::min_normal() const {
  if (is_integer()) return 1.0;
  if (specials == FloatSpecials::ExponentOnly) return std::ldexp(1.0, -bias);
  return std::ldexp(1.0, 1 - bias);
}

double Format::min_positive() const {
  if (is_integer()) return 1.0;
  if (specials == FloatSpecials::ExponentOnly) return std::ldexp(1.0, -bias);
  return std::ldexp(1.0, 1 - bias - mantissa_bits);
}

Format parse_format(std::string_view text) {
  const std::string name = lower(text);
  auto fail = [&](const std::string& why) -> Format {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("format '{}' is not a number format: {}; known: int1..int8, "
                            "uint1..uint8, ternary, e4m3, e5m2, e3m4, e2m1, e2m3, e3m2, e8m0, "
                            "ue4m3, fp16, bf16, fp32, fpN_eXmY[_ieee|_fn|_finite]",
                            text, why));
  };
  for (const auto& entry : named_float_table())
    for (const auto& alias : entry.names)
      if (alias == name) return entry.format;
  if (name == "ternary" || name == "int1.58") return formats::ternary();
  // int<b>, uint<b>, s<b>, u<b>, i<b>
  for (std::string_view prefix : {"uint", "int", "u", "s", "i"}) {
    if (name.rfind(prefix, 0) != 0) continue;
    int bits = 0;
    if (!parse_int(std::string_view(name).substr(prefix.size()), bits)) break;
    if (bits < 1 || bits > 8) return fail(fmt::format("integer width {} is outside 1..8", bits));
    bool is_signed = prefix != "uint" && prefix != "u";
    if (is_signed && bits == 1)
      return fail("int1 has no positive value; use uint1 with a zero point");
    return Format::integer(bits, is_signed);
  }
  // [u]fpN_eXmY[_ieee|_fn|_finite][_bB], or a bare eXmY
  std::string_view rest = name;
  bool is_signed = true;
  if (rest.rfind("ufp", 0) == 0) {
    is_signed = false;
    rest.remove_prefix(1);
  }
  int declared_bits = -1;
  if (rest.rfind("fp", 0) == 0) {
    auto underscore = rest.find('_');
    if (underscore == std::string_view::npos ||
        !parse_int(rest.substr(2, underscore - 2), declared_bits))
      return fail("expected fpN_eXmY");
    rest.remove_prefix(underscore + 1);
  }
  auto underscore = rest.find('_');
  std::string_view em = rest.substr(0, underscore);
  int e = 0, m = 0;
  if (!parse_exponent_mantissa(em, e, m)) return fail("not a known name");
  if (e < 1 || e > 8 || m < 0 || m > 23 || e + m + (is_signed ? 1 : 0) > 32)
    return fail(fmt::format("exponent bits {} must be 1..8 and mantissa bits {} 0..23", e, m));
  int total = e + m + (is_signed ? 1 : 0);
  if (declared_bits >= 0 && declared_bits != total)
    return fail(
        fmt::format("fp{} does not match e{}m{} ({} bits with sign)", declared_bits, e, m, total));
  Format f = Format::floating(e, m, default_specials(total), is_signed);
  while (underscore != std::string_view::npos) {
    rest.remove_prefix(underscore + 1);
    underscore = rest.find('_');
    std::string_view option = rest.substr(0, underscore);
    int bias = 0;
    if (option == "ieee")
      f.specials = FloatSpecials::IEEE;
    else if (option == "fn")
      f.specials = FloatSpecials::FiniteOneNaN;
    else if (option == "finite")
      f.specials = FloatSpecials::FiniteNoNaN;
    else if (option.size() > 1 && option[0] == 'b' && parse_int(option.substr(1), bias))
      f.bias = bias;
    else
      return fail(fmt::format("unknown option '{}'", option));
  }
  if (!is_signed && m == 0) f.specials = FloatSpecials::ExponentOnly;  // as e8m0
  if (f.specials == FloatSpecials::IEEE && e < 2)
    return fail("an IEEE format needs at least 2 exponent bits");
  if (f.specials == FloatSpecials::IEEE && m < 1)  // else the top exponent holds only inf
    return fail("an IEEE format needs at least 1 mantissa bit to encode NaN");
  if (f.specials == FloatSpecials::FiniteOneNaN && e + m < 2)
    return fail("a finite-with-NaN format needs at least 2 bits besides the sign");
  return f;
}

std::vector<Format> named_formats() {
  std::vector<Format> out;
  for (int bits = 2; bits <= 8; ++bits) out.push_back(Format::integer(bits, true));
  for (int bits = 1; bits <= 8; ++bits) out.push_back(Format::integer(bits, false));
  out.push_back(formats::ternary());
  for (const auto& entry : named_float_table()) out.push_back(entry.format);
  return out;
}

std::vector<std::string> format_aliases(const Format& format) {
  if (format.is_integer()) {
    if (format == formats::ternary()) return {"int1.58"};
    std::string b = std::to_string(format.bits);
    return format.is_signed ? std::vector<std::string>{"s" + b, "i" + b}
                            : std::vector<std::string>{"u" + b};
  }
  for (const auto& entry : named_float_table())
    if (entry.format == format) return {entry.names.begin() + 1, entry.names.end()};
  return {};
}

std::uint32_t encode(const Format& format, double value) {
  if (format.is_integer()) {
    if (std::isnan(value))
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("value NaN: format {} has no NaN encoding", format.name()));
    return encode_integer(format, value);
  }
  return encode_float(format, value);
}

std::uint32_t encode(const Format& format, float value) {
  return encode(format, static_cast<double>(value));
}

double decode(const Format& f, std::uint32_t code) {
  if (f.is_integer()) {
    if (!f.is_signed) return static_cast<double>(code);
    auto value = static_cast<std::int64_t>(code);
    if (code & (1u << (f.bits - 1))) value -= std::int64_t{1} << f.bits;
    return static_cast<double>(value);
  }
  const int m = f.mantissa_bits;
  const std::uint32_t mantissa_mask = (1u << m) - 1;
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1;
  const bool negative = f.is_signed && (code & sign_bit(f));
  const std::uint32_t exponent_field = (code >> m) & exp_all_ones;
  const std::uint32_t mantissa_field = code & mantissa_mask;
  const double sign = negative ? -1.0 : 1.0;
  switch (f.specials) {
    case FloatSpecials::ExponentOnly:
      if (exponent_field == exp_all_ones) return std::numeric_limits<double>::quiet_NaN();
      return std::ldexp(1.0, static_cast<int>(exponent_field) - f.bias);
    case FloatSpecials::IEEE:
      if (exponent_field == exp_all_ones)
        return mantissa_field == 0 ? sign * std::numeric_limits<double>::infinity()
                                   : std::numeric_limits<double>::quiet_NaN();
      break;
    case FloatSpecials::FiniteOneNaN:
      if (exponent_field == exp_all_ones && mantissa_field == mantissa_mask)
        return std::numeric_limits<double>::quiet_NaN();
      break;
    case FloatSpecials::FiniteNoNaN: break;
  }
  if (exponent_field == 0)
    return sign * std::ldexp(static_cast<double>(mantissa_field), 1 - f.bias - m);
  return sign * std::ldexp(static_cast<double>(mantissa_field | (1u << m)),
                           static_cast<int>(exponent_field) - f.bias - m);
}

bool is_valid_code(const Format& format, std::uint32_t code) {
  if (format.bits < 32 && code >= format.code_count()) return false;
  if (format.is_integer()) {
    double v = decode(format, code);
    return v >= format.min_int && v <= format.max_int;
  }
  return true;
}

double round_to(const Format& format, double value) {
  return decode(format, encode(format, value));
}

double half_ulp(const Format& f, double value) {
  if (f.is_integer()) return 0.5;
  double magnitude = std::fabs(value);
  if (f.specials == FloatSpecials::ExponentOnly) {
    // Between 2^e and 2^(e+1) the worst error is half the gap.
    int e = magnitude > 0 ? exponent_of(magnitude) : -f.bias;
    return std::ldexp(1.0, std::max(e, -f.bias) - 1);
  }
  int e = magnitude > 0 ? std::max(exponent_of(magnitude), 1 - f.bias) : 1 - f.bias;
  return std::ldexp(1.0, e - f.mantissa_bits - 1);
}

}  // namespace qgemm
