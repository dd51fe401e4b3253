// qgemm formats: the number formats qgemm knows, and the value of every code of one of them.
//
//   qgemm formats [--json]                 every named format with its layout and limits
//   qgemm formats --table NAME [--json]    every code of a format of at most 8 bits
//
// The table JSON is a list of {"code": int, "value": number | "nan" | "inf" | "-inf"}; numbers
// are printed by Json in the shortest form that reads back to the same double, so the
// table is exact (and -0 prints as -0.0). Integer codes outside the format's range (int2 code 2
// of ternary) are omitted. Everything shown comes from the codec (qgemm::decode and the Format
// fields); nothing here re-derives a format's bit layout.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "text_table.hpp"

namespace qgemm::cli {
namespace {

// Keys in the order written (name first), for readers of the JSON.
using Json = nlohmann::ordered_json;

constexpr int kMaxTableBits = 8;

const char* kind_name(const Format& f) { return f.is_integer() ? "integer" : "float"; }

const char* specials_name(FloatSpecials specials) {
  switch (specials) {
    case FloatSpecials::IEEE: return "ieee";
    case FloatSpecials::FiniteOneNaN: return "finite-one-nan";
    case FloatSpecials::FiniteNoNaN: return "finite-no-nan";
    case FloatSpecials::ExponentOnly: return "exponent-only";
  }
  return "?";
}

Json nan_code_json(const Format& f) {
  if (!f.has_nan()) return nullptr;
  return encode(f, std::numeric_limits<double>::quiet_NaN());
}

Json describe_json(const Format& f) {
  Json out;
  out["name"] = f.name();
  out["aliases"] = format_aliases(f);
  out["kind"] = kind_name(f);
  out["signed"] = f.is_signed;
  out["bits"] = f.bits;
  const bool fp = f.is_float();
  out["exponent_bits"] = fp ? Json(f.exponent_bits) : nullptr;
  out["mantissa_bits"] = fp ? Json(f.mantissa_bits) : nullptr;
  out["bias"] = fp ? Json(f.bias) : nullptr;
  out["specials"] = fp ? Json(specials_name(f.specials)) : nullptr;
  out["min_int"] = fp ? nullptr : Json(f.min_int);
  out["max_int"] = fp ? nullptr : Json(f.max_int);
  out["max_finite"] = f.max_finite();
  out["lowest"] = f.lowest();
  out["min_normal"] = f.min_normal();
  out["min_positive"] = f.min_positive();
  out["has_inf"] = f.has_inf();
  out["has_nan"] = f.has_nan();
  out["nan_code"] = nan_code_json(f);
  return out;
}

std::string layout_text(const Format& f) {
  if (f.is_integer()) return fmt::format("[{}, {}]", f.min_int, f.max_int);
  return fmt::format("{}e{}m{}", f.is_signed ? "s" : "", f.exponent_bits, f.mantissa_bits);
}

// Shortest text that reads back to the same double ("-0", "0.5", "5.877471754111438e-39").
std::string value_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", value);
}

Json value_json(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

void print_format_list(bool json) {
  const std::vector<Format> all = named_formats();
  if (json) {
    Json out = Json::array();
    for (const Format& f : all) out.push_back(describe_json(f));
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::vector<std::vector<std::string>> rows = {{"name", "kind", "bits", "layout", "bias",
                                                 "specials", "max", "min normal", "min positive",
                                                 "inf", "nan", "aliases"}};
  for (const Format& f : all) {
    std::string aliases;
    for (const std::string& alias : format_aliases(f))
      aliases += (aliases.empty() ? "" : " ") + alias;
    rows.push_back({f.name(), kind_name(f), std::to_string(f.bits), layout_text(f),
                    f.is_float() ? std::to_string(f.bias) : "-",
                    f.is_float() ? specials_name(f.specials) : "-", value_text(f.max_finite()),
                    value_text(f.min_normal()), value_text(f.min_positive()),
                    f.has_inf() ? "yes" : "no", f.has_nan() ? "yes" : "no", aliases});
  }
  print_text_table(rows);
}

void print_code_table(const std::string& name, bool json) {
  const Format f = parse_format(name);
  require(f.bits <= kMaxTableBits,
          "--table {}: format {} has {} bits; a code table lists formats of at most "
          "{} bits ({} codes)",
          name, f.name(), f.bits, kMaxTableBits, 1u << kMaxTableBits);
  const std::uint32_t code_count = f.code_count();
  if (json) {
    Json out = Json::array();
    for (std::uint32_t code = 0; code < code_count; ++code) {
      if (!is_valid_code(f, code)) continue;
      const double value = decode(f, code);
      // Integer formats print integers; floats print doubles (so -0 stays -0.0).
      out.push_back(
          {{"code", code},
           {"value", f.is_integer() ? Json(static_cast<std::int64_t>(value)) : value_json(value)}});
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  const int hex_digits = (f.bits + 3) / 4;
  std::vector<std::vector<std::string>> rows = {{"code", "hex", "bits", "value"}};
  for (std::uint32_t code = 0; code < code_count; ++code) {
    if (!is_valid_code(f, code)) continue;
    std::string bits;
    for (int b = f.bits - 1; b >= 0; --b) bits += (code >> b) & 1u ? '1' : '0';
    rows.push_back({std::to_string(code), fmt::format("0x{:0{}X}", code, hex_digits), bits,
                    value_text(decode(f, code))});
  }
  fmt::print("{} ({} bits, {}):\n", f.name(), f.bits, layout_text(f));
  print_text_table(rows);
}

struct FormatsOptions {
  bool json = false;
  std::string table;
};

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<FormatsOptions>();
  CLI::App* command = app.add_subcommand(
      "formats", "List the number formats, or every code of one format (--table NAME)");
  command->add_flag("--json", options->json, "Print JSON instead of a text table");
  command->add_option("--table", options->table,
                      "Print every code of this format (at most 8 bits; names, aliases and "
                      "fpN_eXmY accepted)");
  command->callback([options, &status] {
    if (options->table.empty())
      print_format_list(options->json);
    else
      print_code_table(options->table, options->json);
    status = 0;
  });
});

}  // namespace
}  // namespace qgemm::cli
