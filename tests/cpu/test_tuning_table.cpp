// Tests of tuning tables (src/dispatch/tuning_table.hpp): load, merge, mismatch, atomic save.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "dispatch/tuning_table.hpp"
#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::dispatch {
namespace {

MachineKey h200() { return {"NVIDIA H200", 132, "13.0", "580.65.06", qgemm_version()}; }

TuningEntry entry(const std::string& scheme, std::int64_t n, std::int64_t k, std::int64_t m,
                  const std::string& config, double us, const std::string& when) {
  return {make_tuning_key(scheme, n, k, m), config, us, when};
}

TuningTable random_table(std::mt19937_64& rng) {
  TuningTable t;
  t.machine = h200();
  std::uniform_int_distribution<int> preset(0, static_cast<int>(presets().size()) - 1);
  std::uniform_int_distribution<std::int64_t> size(1, 200);
  std::uniform_real_distribution<double> us(0.5, 5000.0);
  for (int i = 0; i < 20; ++i) {
    t.insert(entry(presets()[preset(rng)].name, 128 * size(rng), 128 * size(rng),
                   size(rng) * size(rng), "cfg" + std::to_string(size(rng)), us(rng),
                   "2026-12-02T10:00:00Z"));
  }
  return t;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/" + name + "-" + std::to_string(std::random_device{}());
}

TEST(TuningTable, MBucketIsTheNextPowerOfTwo) {
  const std::int64_t expected[][2] = {{1, 1},   {2, 2},   {3, 4},    {4, 4},      {5, 8},
                                      {63, 64}, {64, 64}, {65, 128}, {4097, 8192}};
  for (const auto& row : expected) EXPECT_EQ(m_bucket(row[0]), row[1]) << row[0];
  EXPECT_THROW(m_bucket(0), Error);
  EXPECT_THROW(m_bucket(-3), Error);
}

TEST(TuningTable, FindAcceptsAnySpellingOfTheSchemeAndBucketsM) {
  TuningTable t;
  t.machine = h200();
  t.insert(entry("w4a16", 4096, 4096, 16, "dense_64x128", 12.5, "2026-12-02T10:00:00Z"));
  const std::string text = to_string(parse_scheme("w4a16"));
  const TuningEntry* hit = t.find(text, 4096, 4096, 9);  // 9 is in bucket 16
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->config, "dense_64x128");
  EXPECT_EQ(t.find("w4a16", 4096, 4096, 17), nullptr);
  EXPECT_EQ(t.find("w4a16-zp", 4096, 4096, 16), nullptr);
  EXPECT_EQ(t.find("w4a16", 4096, 8192, 16), nullptr);
}

TEST(TuningTable, SaveLoadRoundTripIsExactAndLeavesNoTemporaryFile) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const TuningTable t = random_table(rng);
  ASSERT_FALSE(t.entries.empty());
  const std::string path = temp_path("qgemm_tuning");
  save_tuning_table(t, path);
  const TuningTable back = load_tuning_table(path);
  EXPECT_EQ(back.machine, t.machine);
  ASSERT_EQ(back.entries.size(), t.entries.size());
  for (std::size_t i = 0; i < t.entries.size(); ++i) {
    EXPECT_EQ(back.entries[i].key, t.entries[i].key);
    EXPECT_EQ(back.entries[i].config, t.entries[i].config);
    EXPECT_EQ(back.entries[i].microseconds, t.entries[i].microseconds);  // JSON keeps doubles
    EXPECT_EQ(back.entries[i].measured_at, t.entries[i].measured_at);
  }
  // Saving over an existing table replaces it, and only the table file remains.
  TuningTable smaller = t;
  smaller.entries.resize(1);
  save_tuning_table(smaller, path);
  EXPECT_EQ(load_tuning_table(path).entries.size(), 1u);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const std::string stem = std::filesystem::path(path).filename().string();
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    const std::string name = file.path().filename().string();
    EXPECT_FALSE(name.rfind(stem + ".tmp", 0) == 0) << "left behind: " << name;
  }
  std::filesystem::remove(path);
}

TEST(TuningTable, SaveToAnUnwritablePlaceIsAnIoError) {
  TuningTable t;
  t.machine = h200();
  try {
    save_tuning_table(t, "/nonexistent-dir/table.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::IoError);
    EXPECT_NE(std::string(error.what()).find("/nonexistent-dir/table.json"), std::string::npos);
  }
}

TEST(TuningTable, MergeKeepsTheNewerMeasurementAndEverythingElse) {
  TuningTable base;
  base.machine = h200();
  base.insert(entry("w4a16", 4096, 4096, 1, "old_a", 10.0, "2026-12-01T10:00:00Z"));
  base.insert(entry("w4a16", 4096, 4096, 64, "keep_b", 20.0, "2026-12-01T10:00:00Z"));
  base.insert(entry("nvfp4", 8192, 8192, 1, "newer_c", 30.0, "2026-12-03T10:00:00Z"));
  TuningTable incoming;
  incoming.machine = h200();
  incoming.insert(entry("w4a16", 4096, 4096, 1, "new_a", 9.0, "2026-12-02T10:00:00Z"));
  incoming.insert(entry("nvfp4", 8192, 8192, 1, "older_c", 25.0, "2026-12-02T10:00:00Z"));
  incoming.insert(entry("w8a8-fp8", 4096, 14336, 8, "added_d", 40.0, "2026-12-02T10:00:00Z"));
  merge_into(base, incoming);
  ASSERT_EQ(base.entries.size(), 4u);
  EXPECT_EQ(base.find("w4a16", 4096, 4096, 1)->config, "new_a");
  EXPECT_EQ(base.find("w4a16", 4096, 4096, 1)->microseconds, 9.0);
  EXPECT_EQ(base.find("w4a16", 4096, 4096, 64)->config, "keep_b");
  EXPECT_EQ(base.find("nvfp4", 8192, 8192, 1)->config, "newer_c");
  EXPECT_EQ(base.find("w8a8-fp8", 4096, 14336, 5)->config, "added_d");
}

TEST(TuningTable, MergeOfDifferentMachinesIsRefused) {
  TuningTable base;
  base.machine = h200();
  TuningTable other = base;
  other.machine.gpu = "NVIDIA A100-SXM4-80GB";
  other.insert(entry("w4a16", 4096, 4096, 1, "x", 1.0, "2026-12-02T10:00:00Z"));
  try {
    merge_into(base, other);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("A100"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(base.entries.empty());
}

TEST(TuningTable, TableOfAnotherMachineIsNeverAppliedAndSaysWhy) {
  TuningTable t;
  t.machine = h200();
  t.insert(entry("w4a16", 4096, 4096, 1, "x", 1.0, "2026-12-02T10:00:00Z"));
  const std::string path = temp_path("qgemm_tuning_mismatch");
  save_tuning_table(t, path);

  std::string reason;
  ASSERT_TRUE(load_applicable_table(path, h200(), reason).has_value()) << reason;
  EXPECT_TRUE(mismatch_reason(h200(), h200()).empty());

  struct Variant {
    const char* field;
    MachineKey machine;
    const char* fragment;
  };
  MachineKey gpu = h200(), sms = h200(), cuda = h200(), driver = h200(), version = h200();
  gpu.gpu = "NVIDIA H100 80GB HBM3";
  sms.sm_count = 114;
  cuda.cuda = "12.8";
  driver.driver = "570.1";
  version.qgemm = "0.0.1-other";
  for (const Variant& v :
       {Variant{"gpu", gpu, "H100"}, Variant{"sm", sms, "114"}, Variant{"cuda", cuda, "12.8"},
        Variant{"driver", driver, "570.1"}, Variant{"qgemm", version, "0.0.1-other"}}) {
    SCOPED_TRACE(v.field);
    reason.clear();
    EXPECT_FALSE(load_applicable_table(path, v.machine, reason).has_value());
    EXPECT_NE(reason.find(v.fragment), std::string::npos) << reason;
    EXPECT_NE(reason.find("not used"), std::string::npos) << reason;
  }
  // Two differences give two clauses.
  MachineKey both = gpu;
  both.cuda = "12.8";
  const std::string two = mismatch_reason(h200(), both);
  EXPECT_NE(two.find("H100"), std::string::npos);
  EXPECT_NE(two.find("12.8"), std::string::npos);

  reason.clear();
  EXPECT_FALSE(load_applicable_table(path + ".missing", h200(), reason).has_value());
  EXPECT_NE(reason.find(".missing"), std::string::npos) << reason;
  std::filesystem::remove(path);
}

TEST(TuningTable, LoadErrorsNameTheFileAndTheField) {
  const nlohmann::json good = nlohmann::json::parse(to_json_text([] {
    TuningTable t;
    t.machine = h200();
    t.insert(entry("w4a16", 4096, 4096, 1, "x", 1.5, "2026-12-02T10:00:00Z"));
    t.insert(entry("w4a16", 4096, 4096, 2, "y", 2.5, "2026-12-02T10:00:00Z"));
    return t;
  }()));
  ASSERT_NO_THROW(parse_tuning_table(good.dump(), "t.json"));
  struct Bad {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* field;
  };
  const std::vector<Bad> cases = {
      {"format", [](auto& j) { j["format"] = "something-else"; }, "format"},
      {"version", [](auto& j) { j["format_version"] = 99; }, "format_version"},
      {"no machine", [](auto& j) { j.erase("machine"); }, "machine"},
      {"no gpu", [](auto& j) { j["machine"].erase("gpu"); }, "machine.gpu"},
      {"sm zero", [](auto& j) { j["machine"]["sm_count"] = 0; }, "machine.sm_count"},
      {"cuda number", [](auto& j) { j["machine"]["cuda"] = 13; }, "machine.cuda"},
      {"no driver", [](auto& j) { j["machine"].erase("driver"); }, "machine.driver"},
      {"entries object", [](auto& j) { j["entries"] = nlohmann::json::object(); }, "entries"},
      {"bad scheme", [](auto& j) { j["entries"][1]["scheme"] = "w9a16"; }, "entries[1].scheme"},
      {"n negative", [](auto& j) { j["entries"][0]["n"] = -4; }, "entries[0].n"},
      {"bucket 3", [](auto& j) { j["entries"][1]["m_bucket"] = 3; }, "entries[1].m_bucket"},
      {"us zero", [](auto& j) { j["entries"][0]["us"] = 0.0; }, "entries[0].us"},
      {"us text", [](auto& j) { j["entries"][0]["us"] = "fast"; }, "entries[0].us"},
      {"no config", [](auto& j) { j["entries"][1].erase("config"); }, "entries[1].config"},
      {"bad time", [](auto& j) { j["entries"][0]["measured_at"] = "yesterday"; },
       "entries[0].measured_at"},
      {"duplicate", [](auto& j) { j["entries"][1]["m_bucket"] = 1; }, "entries[1]"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json doc = good;
    c.edit(doc);
    try {
      parse_tuning_table(doc.dump(), "t.json");
      ADD_FAILURE() << "no error for " << doc.dump();
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("t.json"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string(c.field) + ":"), std::string::npos) << message;
    }
  }
  EXPECT_THROW(parse_tuning_table("{not json", "t.json"), Error);
  EXPECT_THROW(parse_tuning_table("[1, 2]", "t.json"), Error);
}

// Found by fuzzing (tests/fuzz/fuzz_tuning_table.cpp, issue #19): a number beyond a double's
// range made the JSON reader throw its out_of_range (not a parse_error), which escaped as
// something other than qgemm::Error, past load_applicable_table, out of an Engine's constructor.
TEST(TuningTable, ANumberBeyondADoubleIsAnErrorNamingTheFile) {
  for (const char* text : {"99e99999999", R"({"format": "qgemm-tuning-table", "x": -1e400})"}) {
    SCOPED_TRACE(text);
    try {
      parse_tuning_table(text, "t.json");
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(error.what()).find("t.json"), std::string::npos) << error.what();
    }
  }
  const std::string path = ::testing::TempDir() + "qgemm-overflow-table.json";
  { std::ofstream(path) << "[1e999]"; }
  std::string reason;
  EXPECT_FALSE(load_applicable_table(path, h200(), reason).has_value());
  EXPECT_NE(reason.find("not valid JSON"), std::string::npos) << reason;
  std::remove(path.c_str());
}

TEST(TuningTable, TimestampNowHasTheStoredFormat) {
  const std::string now = utc_timestamp_now();
  ASSERT_EQ(now.size(), 20u) << now;
  EXPECT_EQ(now[4], '-');
  EXPECT_EQ(now[10], 'T');
  EXPECT_EQ(now.back(), 'Z');
  EXPECT_GE(now, std::string("2024-01-01T00:00:00Z"));
}

}  // namespace
}  // namespace qgemm::dispatch
