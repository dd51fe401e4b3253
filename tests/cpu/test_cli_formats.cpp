// Tests of `qgemm formats` and `qgemm schemes` through the built binary (QGEMM_CLI): exit
// status, JSON shape, and that the printed tables are exact (every value reads back to the very
// double the codec decodes, -0 included).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "qgemm/format.hpp"
#include "qgemm/scheme.hpp"

namespace {

struct CliResult {
  int exit_status = -1;
  std::string out, err;
};

// Runs the qgemm binary with `args` (each passed as one shell word).
CliResult run_cli(const std::vector<std::string>& args) {
  char err_path[] = "/tmp/qgemm_cli_stderr_XXXXXX";
  const int err_fd = mkstemp(err_path);
  EXPECT_GE(err_fd, 0);
  close(err_fd);
  std::string command = std::string("'") + QGEMM_CLI + "'";
  for (const std::string& arg : args) command += " '" + arg + "'";
  command += std::string(" 2>'") + err_path + "'";
  CliResult result;
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (!pipe) return result;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err_file(err_path);
  std::stringstream err_text;
  err_text << err_file.rdbuf();
  result.err = err_text.str();
  std::remove(err_path);
  return result;
}

nlohmann::json run_json(const std::vector<std::string>& args) {
  const CliResult result = run_cli(args);
  EXPECT_EQ(result.exit_status, 0) << result.err;
  try {
    return nlohmann::json::parse(result.out);
  } catch (const nlohmann::json::exception& error) {
    ADD_FAILURE() << "not JSON (" << error.what() << "): " << result.out.substr(0, 200);
    return nullptr;
  }
}

std::uint64_t double_bits(double value) { return std::bit_cast<std::uint64_t>(value); }

// A table entry's value as a double: numbers as printed, the specials by name.
double entry_value(const nlohmann::json& entry) {
  const nlohmann::json& value = entry.at("value");
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (text == "nan") return NAN;
    if (text == "inf") return INFINITY;
    if (text == "-inf") return -INFINITY;
    ADD_FAILURE() << "unexpected value text " << text;
    return 0.0;
  }
  return value.get<double>();
}

TEST(CliFormats, E2m1TableHasTheOcpValues) {
  const nlohmann::json table = run_json({"formats", "--table", "e2m1", "--json"});
  ASSERT_TRUE(table.is_array());
  ASSERT_EQ(table.size(), 16u);
  const double expected[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(table[code].at("code").get<int>(), code);
    EXPECT_EQ(double_bits(entry_value(table[code])), double_bits(expected[code])) << code;
  }
  // -0 must be printed as a negative zero literal, not folded into 0.
  EXPECT_NE(run_cli({"formats", "--table", "e2m1", "--json"}).out.find("-0.0"), std::string::npos);
  // An alias names the same table.
  EXPECT_EQ(run_json({"formats", "--table", "FP4_E2M1", "--json"}), table);
}

TEST(CliFormats, E4m3TableHasTheOcpSpecials) {
  const nlohmann::json table = run_json({"formats", "--table", "e4m3", "--json"});
  ASSERT_EQ(table.size(), 256u);
  EXPECT_EQ(entry_value(table[0x7E]), 448.0);
  EXPECT_EQ(entry_value(table[0xFE]), -448.0);
  EXPECT_EQ(table[0x7F].at("value"), "nan");
  EXPECT_EQ(table[0xFF].at("value"), "nan");
  EXPECT_EQ(entry_value(table[0x01]), std::ldexp(1.0, -9));
  EXPECT_EQ(entry_value(table[0x08]), std::ldexp(1.0, -6));
  EXPECT_EQ(entry_value(table[0x3B]), 1.375);
  EXPECT_TRUE(std::signbit(entry_value(table[0x80])));
  const nlohmann::json e5m2 = run_json({"formats", "--table", "e5m2", "--json"});
  EXPECT_EQ(e5m2[0x7C].at("value"), "inf");
  EXPECT_EQ(e5m2[0xFC].at("value"), "-inf");
  EXPECT_EQ(entry_value(e5m2[0x7B]), 57344.0);
}

TEST(CliFormats, EveryTableIsCompleteAndExact) {
  std::vector<qgemm::Format> formats;
  for (const qgemm::Format& f : qgemm::named_formats())
    if (f.bits <= 8) formats.push_back(f);
  for (const char* generic : {"fp5_e2m2", "ufp8_e4m4", "fp6_e2m3_ieee"})
    formats.push_back(qgemm::parse_format(generic));
  for (const qgemm::Format& f : formats) {
    SCOPED_TRACE(f.name());
    const nlohmann::json table = run_json({"formats", "--table", f.name(), "--json"});
    ASSERT_TRUE(table.is_array());
    // Floats: every code. Integers: every value of [min_int, max_int] (ternary has 3 of 4 codes).
    const std::size_t expected_entries =
        f.is_integer() ? static_cast<std::size_t>(f.max_int - f.min_int + 1) : (1u << f.bits);
    EXPECT_EQ(table.size(), expected_entries);
    std::uint32_t previous = 0;
    for (std::size_t i = 0; i < table.size(); ++i) {
      const auto code = table[i].at("code").get<std::uint32_t>();
      if (i > 0) {
        EXPECT_GT(code, previous);
      }
      previous = code;
      const double printed = entry_value(table[i]);
      const double decoded = qgemm::decode(f, code);
      if (std::isnan(decoded)) {
        EXPECT_TRUE(std::isnan(printed)) << code;
      } else {
        EXPECT_EQ(double_bits(printed), double_bits(decoded)) << code;
      }
    }
  }
}

TEST(CliFormats, TextTableListsEveryCode) {
  const CliResult result = run_cli({"formats", "--table", "fp5_e2m2"});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  std::size_t lines = 0;
  for (char c : result.out) lines += c == '\n';
  EXPECT_EQ(lines, 32u + 3u);  // title, header, rule, one line per code
  EXPECT_NE(result.out.find("0x1F"), std::string::npos);
}

TEST(CliFormats, WideOrUnknownFormatsAreClearErrors) {
  const CliResult wide = run_cli({"formats", "--table", "fp16", "--json"});
  EXPECT_NE(wide.exit_status, 0);
  EXPECT_TRUE(wide.out.empty()) << wide.out.substr(0, 100);
  EXPECT_NE(wide.err.find("fp16"), std::string::npos) << wide.err;
  EXPECT_NE(wide.err.find("8 bits"), std::string::npos) << wide.err;
  const CliResult unknown = run_cli({"formats", "--table", "fp9_e9m9x", "--json"});
  EXPECT_NE(unknown.exit_status, 0);
  EXPECT_NE(unknown.err.find("'fp9_e9m9x'"), std::string::npos) << unknown.err;
}

TEST(CliFormats, ListDescribesEveryNamedFormat) {
  const nlohmann::json list = run_json({"formats", "--json"});
  const std::vector<qgemm::Format> named = qgemm::named_formats();
  ASSERT_EQ(list.size(), named.size());
  for (std::size_t i = 0; i < named.size(); ++i) {
    const qgemm::Format& f = named[i];
    const nlohmann::json& entry = list[i];
    SCOPED_TRACE(f.name());
    EXPECT_EQ(entry.at("name"), f.name());
    EXPECT_EQ(entry.at("aliases").get<std::vector<std::string>>(), qgemm::format_aliases(f));
    EXPECT_EQ(entry.at("kind"), f.is_integer() ? "integer" : "float");
    EXPECT_EQ(entry.at("bits").get<int>(), f.bits);
    EXPECT_EQ(entry.at("max_finite").get<double>(), f.max_finite());
    EXPECT_EQ(entry.at("min_normal").get<double>(), f.min_normal());
    EXPECT_EQ(entry.at("min_positive").get<double>(), f.min_positive());
    EXPECT_EQ(entry.at("has_inf").get<bool>(), f.has_inf());
    EXPECT_EQ(entry.at("has_nan").get<bool>(), f.has_nan());
    if (f.is_float()) {
      EXPECT_EQ(entry.at("exponent_bits").get<int>(), f.exponent_bits);
      EXPECT_EQ(entry.at("mantissa_bits").get<int>(), f.mantissa_bits);
      EXPECT_EQ(entry.at("bias").get<int>(), f.bias);
    }
  }
  // Spot checks against the specs, not the codec.
  const std::vector<std::pair<std::string, double>> spec_max = {
      {"e4m3", 448.0}, {"e5m2", 57344.0}, {"e2m1", 6.0}, {"fp16", 65504.0}};
  for (const auto& [name, max_finite] : spec_max) {
    bool found = false;
    for (const nlohmann::json& entry : list) {
      if (entry.at("name") != name) continue;
      found = true;
      EXPECT_EQ(entry.at("max_finite").get<double>(), max_finite) << name;
    }
    EXPECT_TRUE(found) << name;
  }
  EXPECT_EQ(run_cli({"formats"}).exit_status, 0);
}

TEST(CliSchemes, JsonListsEveryPresetWithAParseableTextForm) {
  const nlohmann::json list = run_json({"schemes", "--json"});
  const std::vector<qgemm::Preset>& presets = qgemm::presets();
  ASSERT_EQ(list.size(), presets.size());
  for (std::size_t i = 0; i < presets.size(); ++i) {
    const qgemm::Preset& preset = presets[i];
    const nlohmann::json& entry = list[i];
    SCOPED_TRACE(preset.name);
    EXPECT_EQ(entry.at("name"), preset.name);
    EXPECT_EQ(entry.at("description"), preset.description);
    EXPECT_TRUE(qgemm::parse_scheme(entry.at("text").get<std::string>()) == preset.scheme);
    EXPECT_EQ(entry.at("weight").at("format"), preset.scheme.weight.format.name());
    EXPECT_EQ(entry.at("weight").at("scale_format"), preset.scheme.weight.scale_format.name());
    EXPECT_EQ(entry.at("activation").at("format"), preset.scheme.activation.format.name());
    EXPECT_EQ(entry.at("activation").at("quantized").get<bool>(),
              preset.scheme.activation.is_quantized());
    EXPECT_EQ(entry.at("output"), preset.scheme.output.name());
  }
  // A few presets spelled out by the issue.
  int spelled_out_found = 0;
  for (const nlohmann::json& entry : list) {
    const std::string name = entry.at("name").get<std::string>();
    spelled_out_found += name == "w4a16" || name == "fp8-block" || name == "mxfp4-a8";
    if (entry.at("name") == "w4a16") {
      EXPECT_EQ(entry.at("weight").at("format"), "uint4");
      EXPECT_EQ(entry.at("weight").at("group"), 128);
      EXPECT_EQ(entry.at("weight").at("scale_format"), "bf16");
    }
    if (entry.at("name") == "fp8-block") {
      EXPECT_EQ(entry.at("weight").at("granularity"), "block");
      EXPECT_EQ(entry.at("weight").at("block"), nlohmann::json::array({128, 128}));
      EXPECT_EQ(entry.at("activation").at("group"), 128);
    }
    if (entry.at("name") == "mxfp4-a8") {
      EXPECT_EQ(entry.at("weight").at("format"), "e2m1");
      EXPECT_EQ(entry.at("weight").at("scale_format"), "e8m0");
      EXPECT_EQ(entry.at("activation").at("format"), "e4m3");
    }
  }
  EXPECT_EQ(spelled_out_found, 3);
}

TEST(CliSchemes, ExpandsGivenSchemesAndRejectsUnknownOnes) {
  const nlohmann::json one = run_json({"schemes", "nvfp4", "--json"});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].at("weight").at("global_scale"), true);
  const nlohmann::json custom = run_json({"schemes", "w=int4:g64:s=fp16;a=bf16;o=fp16", "--json"});
  ASSERT_EQ(custom.size(), 1u);
  EXPECT_EQ(custom[0].at("weight").at("group"), 64);
  const CliResult text = run_cli({"schemes"});
  EXPECT_EQ(text.exit_status, 0);
  for (const qgemm::Preset& preset : qgemm::presets())
    EXPECT_NE(text.out.find(preset.name), std::string::npos) << preset.name;
  const CliResult unknown = run_cli({"schemes", "w5a17"});
  EXPECT_NE(unknown.exit_status, 0);
  EXPECT_NE(unknown.err.find("w5a17"), std::string::npos) << unknown.err;
}

}  // namespace
