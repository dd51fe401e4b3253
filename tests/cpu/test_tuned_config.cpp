// Tests of the selection layer's use of tuning tables (src/dispatch/tuned_config.hpp): bucket
// matching, configs that cannot serve, tables of another machine, the active table.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dispatch/dense_config.hpp"
#include "dispatch/tuned_config.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/tuning.hpp"

namespace qgemm::dispatch {
namespace {

const GpuLimits kH200 = GpuLimits::of_arch(jit::Arch::sm_90a, 132);

// A small random w4a16 weight's layout metadata (what the Engine's prepared weight carries).
layout::MmaWeight w4a16_weight(std::int64_t n, std::int64_t k, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> values(static_cast<std::size_t>(n * k));
  for (float& v : values) v = normal(rng);
  return layout::mma_metadata(quantize_weight(parse_scheme("w4a16").weight, values.data(), n, k));
}

TuningEntry entry_for(const Scheme& scheme, std::int64_t n, std::int64_t k, std::int64_t m,
                      const std::string& config) {
  return {make_tuning_key(scheme, n, k, m), config, 10.0, "2026-12-02T10:00:00Z"};
}

runtime::DeviceInfo fake_device() {
  runtime::DeviceInfo device;
  device.index = 0;
  device.name = "Test GPU 9000";
  device.major = 9;
  device.minor = 0;
  device.sm_count = 66;
  return device;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/" + name + "-" + std::to_string(std::random_device{}());
}

TEST(TunedConfig, CallSchemeOfEveryA16PresetIsThePresetItself) {
  int checked = 0;
  for (const Preset& preset : presets()) {
    if (preset.scheme.activation.is_quantized()) continue;
    const Scheme call =
        call_scheme(preset.scheme.weight, preset.scheme.activation.format, preset.scheme.output);
    EXPECT_EQ(to_string(call), to_string(preset.scheme)) << preset.name;
    EXPECT_EQ(make_tuning_key(call, 256, 512, 3), make_tuning_key(preset.name, 256, 512, 3))
        << preset.name;
    ++checked;
  }
  EXPECT_GT(checked, 3);
}

TEST(TunedConfig, ReturnsTheTableConfigExactlyWhenItCanServeTheBucket) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const layout::MmaWeight weight = w4a16_weight(256, 512, seed);
  const Scheme scheme = parse_scheme("w4a16");
  const std::int64_t ms[] = {1, 3, 16, 40, 200};
  int served = 0, refused = 0;
  for (const DenseGemmConfig& config : dense_gemm_configs()) {
    for (std::int64_t m : ms) {
      TuningTable table;
      table.entries.push_back(entry_for(scheme, weight.n, weight.k, m, config.name));
      const bool can_serve = !config.unsupported_reason(m, weight, formats::bf16, kH200);
      std::string why;
      const std::string chosen =
          lookup_dense_config(table, scheme, m, weight, formats::bf16, kH200, &why);
      SCOPED_TRACE(config.name + " m=" + std::to_string(m));
      if (can_serve) {
        EXPECT_EQ(chosen, config.name);
        EXPECT_TRUE(why.empty()) << why;
        ++served;
      } else {
        EXPECT_EQ(chosen, "");
        EXPECT_NE(why.find("cannot serve"), std::string::npos) << why;
        ++refused;
      }
    }
  }
  // Both branches ran (streamed configs cannot serve M > 16; every config serves M = 1).
  EXPECT_GT(served, 0);
  EXPECT_GT(refused, 0);
}

TEST(TunedConfig, MatchesOnlyItsOwnBucketSchemeAndShape) {
  const layout::MmaWeight weight = w4a16_weight(256, 512, 7);
  const Scheme scheme = parse_scheme("w4a16");
  TuningTable table;
  table.entries.push_back(entry_for(scheme, 256, 512, 128, "dequant-cublas"));
  // Bucket 128 holds M 65..128.
  EXPECT_EQ(lookup_dense_config(table, scheme, 65, weight, formats::bf16, kH200), "dequant-cublas");
  EXPECT_EQ(lookup_dense_config(table, scheme, 128, weight, formats::bf16, kH200),
            "dequant-cublas");
  std::string why;
  EXPECT_EQ(lookup_dense_config(table, scheme, 64, weight, formats::bf16, kH200, &why), "");
  EXPECT_NE(why.find("no entry"), std::string::npos) << why;
  EXPECT_EQ(lookup_dense_config(table, scheme, 129, weight, formats::bf16, kH200), "");
  // Another scheme (zero points) or another shape: no entry.
  EXPECT_EQ(lookup_dense_config(table, parse_scheme("w4a16-zp"), 100, weight, formats::bf16, kH200),
            "");
  const layout::MmaWeight wider = w4a16_weight(320, 512, 8);
  EXPECT_EQ(lookup_dense_config(table, scheme, 100, wider, formats::bf16, kH200), "");
}

TEST(TunedConfig, UnknownConfigNameFallsBack) {
  const layout::MmaWeight weight = w4a16_weight(128, 256, 3);
  const Scheme scheme = parse_scheme("w4a16");
  TuningTable table;
  table.entries.push_back(entry_for(scheme, 128, 256, 1, "no-such-config"));
  std::string why;
  EXPECT_EQ(lookup_dense_config(table, scheme, 1, weight, formats::bf16, kH200, &why), "");
  EXPECT_NE(why.find("no-such-config"), std::string::npos) << why;
}

TEST(TunedConfig, ActiveTableAppliesOnItsMachineOnly) {
  const runtime::DeviceInfo device = fake_device();
  const layout::MmaWeight weight = w4a16_weight(128, 256, 11);
  const Scheme scheme = call_scheme(parse_scheme("w4a16").weight, formats::bf16, formats::bf16);
  TuningTable table;
  table.machine = machine_key(device);
  table.entries.push_back(entry_for(scheme, 128, 256, 1, "dequant-cublas"));
  const std::string path = temp_path("qgemm_tuned");
  save_tuning_table(table, path);

  use_tuning_table(path);
  EXPECT_EQ(tuned_dense_config(device, scheme, 1, weight, formats::bf16), "dequant-cublas");
  EXPECT_EQ(tuned_dense_config(device, scheme, 2, weight, formats::bf16), "");  // bucket 2

  // Another GPU: ignored, with one warning naming the field.
  table.machine.gpu = "Some Other GPU";
  save_tuning_table(table, path);
  use_tuning_table(path);
  testing::internal::CaptureStderr();
  EXPECT_EQ(tuned_dense_config(device, scheme, 1, weight, formats::bf16), "");
  EXPECT_EQ(tuned_dense_config(device, scheme, 1, weight, formats::bf16), "");
  const std::string log = testing::internal::GetCapturedStderr();
  const auto first = log.find("Some Other GPU");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_NE(log.find("the table is for GPU"), std::string::npos) << log;
  EXPECT_EQ(log.find("Some Other GPU", first + 1), std::string::npos) << "warned twice: " << log;

  // Another qgemm version: ignored too.
  table.machine = machine_key(device);
  table.machine.qgemm = "0.0.0-other";
  save_tuning_table(table, path);
  use_tuning_table(path);
  testing::internal::CaptureStderr();
  EXPECT_EQ(tuned_dense_config(device, scheme, 1, weight, formats::bf16), "");
  EXPECT_NE(testing::internal::GetCapturedStderr().find("0.0.0-other"), std::string::npos);

  // Turned off: the heuristics serve.
  use_tuning_table("");
  EXPECT_EQ(tuned_dense_config(device, scheme, 1, weight, formats::bf16), "");
  std::remove(path.c_str());
}

TEST(TunedConfig, AskingForAMissingOrInvalidTableIsAnError) {
  try {
    use_tuning_table("/nonexistent-dir/table.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::IoError);
  }
  const std::string path = temp_path("qgemm_tuned_bad");
  {
    std::FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr);
    std::fputs("{\"format\": \"something else\"}", file);
    std::fclose(file);
  }
  EXPECT_THROW(use_tuning_table(path), Error);
  // A failed install leaves no table active.
  const layout::MmaWeight weight = w4a16_weight(128, 256, 5);
  EXPECT_EQ(tuned_dense_config(fake_device(), parse_scheme("w4a16"), 1, weight, formats::bf16), "");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace qgemm::dispatch
