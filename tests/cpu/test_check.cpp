// qgemm check (tools/harness/check): the error bounds hold element by element, every preset passes on
// the CPU backend, corrupted backends fail, faithful non-reference backends pass, and the CLI
// sub-commands exit with the documented statuses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "check/backend.hpp"
#include "check/check.hpp"
#include "check/error_bounds.hpp"
#include "check/moe_check.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "qgemm/scheme.hpp"
#include "test_reference_support.hpp"

namespace {

using qgemm::check::BackendPrecision;
using qgemm::check::GemmBackend;
using qgemm_test::fresh_test_seed;

// A shape every preset accepts: K a multiple of 128 (g128, fp8-block's 128x128 blocks and
// 1x128 activation groups), N a multiple of 128.
constexpr std::int64_t kSmallM = 8, kSmallN = 128, kSmallK = 256;

std::string describe(const qgemm::check::CheckResult& r) {
  return testing::PrintToString(qgemm::check::to_json(r));
}

// --- error bounds ----------------------------------------------------------------------------

// Weights like check's own (N(0, 0.02²), rare 8x outliers) and activations N(0, 1).
std::vector<float> llm_like_weight(std::mt19937_64& rng, std::size_t count) {
  std::normal_distribution<double> normal(0.0, 0.02);
  std::bernoulli_distribution outlier(1.0 / 256);
  std::vector<float> w(count);
  for (float& value : w) value = static_cast<float>(normal(rng) * (outlier(rng) ? 8.0 : 1.0));
  return w;
}

void expect_radii_cover_errors(const std::vector<float>& original,
                               const std::vector<double>& dequantized,
                               const std::vector<double>& radii, const char* tensor) {
  ASSERT_EQ(radii.size(), original.size());
  double error_sum = 0, radius_sum = 0;
  int reported = 0;
  for (std::size_t i = 0; i < radii.size(); ++i) {
    const double error = std::fabs(double{original[i]} - dequantized[i]);
    error_sum += error * error;
    radius_sum += radii[i] * radii[i];
    if (!(error <= radii[i] * (1 + 1e-12)) && reported++ < 5)
      ADD_FAILURE() << tensor << " element " << i << ": |error| " << error << " > radius "
                    << radii[i] << " (original " << original[i] << ", dequantized "
                    << dequantized[i] << ")";
  }
  // The bound is a worst case, but not a vacuous one: a uniform rounding error has RMS
  // radius / sqrt(3), so the ratio of the norms sits near 1.7; 4 would mean radii far too big.
  EXPECT_LE(std::sqrt(radius_sum), 4.0 * std::sqrt(error_sum)) << tensor;
}

TEST(CheckErrorBounds, RadiiCoverEveryElementOfEveryPreset) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (const qgemm::Preset& preset : qgemm::presets()) {
    SCOPED_TRACE(preset.name);
    const std::int64_t m = 6, n = 160, k = 512;  // n: a partial 128-row block for fp8-block
    const auto w = llm_like_weight(rng, n * k);
    const auto a = qgemm_test::random_floats(rng, m * k, 1.0);
    const auto packed_w = qgemm::quantize_weight(preset.scheme.weight, w.data(), n, k);
    const auto packed_a = qgemm::quantize_activation(preset.scheme.activation, a.data(), m, k);
    const auto w_values = qgemm::dequantize_weight(packed_w);
    const auto a_values = qgemm::dequantize_activation(packed_a);
    expect_radii_cover_errors(
        w, w_values, qgemm::check::weight_error_radii(packed_w, w.data(), w_values), "weight");
    expect_radii_cover_errors(a, a_values,
                              qgemm::check::activation_error_radii(packed_a, a.data(), a_values),
                              "activation");
  }
}

TEST(CheckErrorBounds, OutputRoundingBoundIsTheRootSumOfHalfSteps) {
  // bf16 has 8 significant bits: half a step is 2^-8 at 1.0, 2^-7 at 3.0, 2^-2 at -96.
  const std::vector<double> values = {1.0, 3.0, -96.0};
  const double expected = std::sqrt(std::ldexp(1.0, -16) + std::ldexp(1.0, -14) + 1.0 / 16);
  EXPECT_DOUBLE_EQ(qgemm::check::output_rounding_bound(qgemm::formats::bf16, values), expected);
}

// backend_error_bounds: a faithful emulation of a bf16-operand, fp32-accumulating kernel stays
// inside every element's bound; one that loses or mis-scales the partial last group (the bugs
// the GPU partial-group tests look for) leaves it at most elements.
TEST(CheckErrorBounds, BackendBoundsHoldForFaithfulArithmeticAndCatchALostGroup) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const qgemm::Scheme scheme = qgemm::parse_scheme("w4a16");
  const std::int64_t m = 7, n = 96, k = 2880, last_group = 2816;  // 22.5 groups of 128
  const auto w = llm_like_weight(rng, n * k);
  const auto a = qgemm_test::random_floats(rng, m * k, 1.0);
  const auto packed_a = qgemm::quantize_activation(scheme.activation, a.data(), m, k);
  const auto packed_w = qgemm::quantize_weight(scheme.weight, w.data(), n, k);
  const auto a_values = qgemm::dequantize_activation(packed_a);
  const auto w_values = qgemm::dequantize_weight(packed_w);
  const auto reference = qgemm::reference::gemm(scheme, packed_a, packed_w);
  std::vector<double> magnitude(w_values.size());
  for (std::size_t i = 0; i < w_values.size(); ++i) magnitude[i] = std::fabs(w_values[i]);
  qgemm::check::OperandRounding rounding;
  rounding.weight = 0x1p-9;  // bf16
  const auto bounds = qgemm::check::backend_error_bounds(a_values, w_values, magnitude, m, n, k,
                                                         rounding, scheme.output, reference);
  // The emulated kernel: weights rounded to bf16, products summed in float in K order, the
  // sum rounded to bf16. `weight_factor(c)` scales weight column c (1: faithful).
  auto emulate = [&](auto weight_factor) {
    std::vector<double> out(static_cast<std::size_t>(m * n));
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (std::int64_t c = 0; c < k; ++c) {
          const double weight =
              qgemm::round_to(qgemm::formats::bf16, w_values[j * k + c]) * weight_factor(c);
          sum += static_cast<float>(a_values[r * k + c] * weight);
        }
        out[r * n + j] = qgemm::round_to(qgemm::formats::bf16, sum);
      }
    return out;
  };
  auto outside = [&](const std::vector<double>& got) {
    std::size_t count = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      count += !(std::fabs(got[i] - reference[i]) <= bounds[i]);
    return count;
  };
  EXPECT_EQ(outside(emulate([](std::int64_t) { return 1.0; })), 0u);
  const std::size_t lost =
      outside(emulate([&](std::int64_t c) { return c < last_group ? 1.0 : 0.0; }));
  const std::size_t doubled =
      outside(emulate([&](std::int64_t c) { return c < last_group ? 1.0 : 2.0; }));
  EXPECT_GT(lost, reference.size() / 2) << "a lost last group must leave the bounds";
  EXPECT_GT(doubled, reference.size() / 2) << "a wrong last-group scale must leave the bounds";
}

// --- every preset on the CPU backend -----------------------------------------------------------

TEST(Check, EveryPresetPassesOnTheCpuBackend) {
  auto backend = qgemm::check::make_cpu_backend();
  for (const qgemm::Preset& preset : qgemm::presets()) {
    const std::uint64_t seed = fresh_test_seed();
    const auto r =
        qgemm::check::run_check(preset.scheme, kSmallM, kSmallN, kSmallK, *backend, seed);
    EXPECT_TRUE(r.pass) << preset.name << ": " << describe(r);
    // Quantization must have done something, and the tolerance must be a number.
    EXPECT_GT(r.error_vs_exact, 0.0) << preset.name;
    EXPECT_TRUE(std::isfinite(r.tolerance_vs_exact)) << preset.name;
    EXPECT_EQ(r.error_vs_reference, 0.0) << preset.name << ": the CPU backend is the reference";
    EXPECT_GT(r.gflops, 0.0);
  }
}

TEST(Check, SameSeedSameResultOtherSeedOtherInputs) {
  auto backend = qgemm::check::make_cpu_backend();
  const qgemm::Scheme scheme = qgemm::parse_scheme("w4a8-fp8");
  const std::uint64_t seed = fresh_test_seed();
  const auto first = qgemm::check::run_check(scheme, 5, 256, 384, *backend, seed);
  const auto again = qgemm::check::run_check(scheme, 5, 256, 384, *backend, seed);
  const auto other = qgemm::check::run_check(scheme, 5, 256, 384, *backend, seed + 1);
  EXPECT_EQ(first.error_vs_exact, again.error_vs_exact) << "seed " << seed;
  EXPECT_EQ(first.tolerance_vs_exact, again.tolerance_vs_exact) << "seed " << seed;
  EXPECT_NE(first.error_vs_exact, other.error_vs_exact) << "seed " << seed;
}

TEST(Check, RejectsShapesTheSchemeCannotServeAndUnknownBackends) {
  auto backend = qgemm::check::make_cpu_backend();
  const std::string message = qgemm_test::error_message_of(
      [&] { qgemm::check::run_check(qgemm::parse_scheme("w4a16"), 4, 64, 0, *backend, 1); });
  EXPECT_NE(message.find("K=0"), std::string::npos) << message;
  // A group that does not divide K is served (a shorter last group), not refused.
  EXPECT_TRUE(qgemm::check::run_check(qgemm::parse_scheme("w4a16"), 4, 64, 200, *backend, 1).pass);
  const std::string backend_message =
      qgemm_test::error_message_of([] { qgemm::check::parse_backend_choice("tpu"); });
  EXPECT_NE(backend_message.find("'tpu'"), std::string::npos) << backend_message;
}

TEST(Check, GpuBackendIsRefusedWithAReasonWithoutAGpu) {
  const qgemm::check::GpuProbe probe = qgemm::check::probe_gpu();
  EXPECT_FALSE(probe.detail.empty());
  if (!probe.usable) {
    try {
      qgemm::check::select_backend(qgemm::check::BackendChoice::Gpu);
      ADD_FAILURE() << "a GPU backend was selected without a usable GPU";
    } catch (const qgemm::Error& error) {
      const std::string message = error.what();
      EXPECT_EQ(error.code(), qgemm::ErrorCode::NoDevice) << message;
      EXPECT_NE(message.find("gpu backend: no usable GPU/driver"), std::string::npos) << message;
    }
    const auto automatic = qgemm::check::select_backend(qgemm::check::BackendChoice::Auto);
    EXPECT_EQ(automatic.backend->name(), "cpu");
    EXPECT_FALSE(automatic.reason.empty());
  } else {
    EXPECT_EQ(qgemm::check::select_backend(qgemm::check::BackendChoice::Auto).backend->name(),
              "gpu");
  }
}

// --- backends that are wrong, and one that is right without being the reference ----------------

// Runs reference::gemm on a copy of the weight whose scales `corrupt` rewrites: a stand-in for
// a kernel that misreads its scales.
class ScaleCorruptingBackend : public GemmBackend {
 public:
  ScaleCorruptingBackend(double factor, bool claims_reference)
      : factor_(factor), claims_reference_(claims_reference) {}
  std::string name() const override { return "corrupted"; }
  std::string description() const override { return "scales multiplied by a factor"; }
  bool is_reference() const override { return claims_reference_; }
  std::vector<double> gemm(const qgemm::Scheme& scheme, const qgemm::PackedActivation& a,
                           const qgemm::PackedWeight& w) override {
    qgemm::PackedWeight corrupted = w;
    const qgemm::Format& format = w.quant.scale_format;
    const int width = format.storage_bytes();
    for (std::size_t i = 0; i < corrupted.scales.size(); i += width) {
      std::uint32_t code = 0;
      for (int b = 0; b < width; ++b) code |= std::uint32_t{corrupted.scales[i + b]} << (8 * b);
      code = qgemm::encode(format, qgemm::decode(format, code) * factor_);
      for (int b = 0; b < width; ++b) corrupted.scales[i + b] = (code >> (8 * b)) & 0xFF;
    }
    return qgemm::reference::gemm(scheme, a, corrupted);
  }

 private:
  double factor_;
  bool claims_reference_;
};

TEST(Check, BackendWithSignFlippedScalesFails) {
  for (const char* scheme_text : {"w4a16", "w8a8-fp8", "nvfp4-a16"}) {
    for (bool claims_reference : {false, true}) {
      SCOPED_TRACE(testing::Message() << scheme_text << " claims_reference=" << claims_reference);
      ScaleCorruptingBackend flipped(-1.0, claims_reference);
      const auto scheme = qgemm::parse_scheme(scheme_text);
      if (!scheme.weight.scale_format.is_signed) {
        // ue4m3 scales have no sign bit: scale them 4x instead.
        ScaleCorruptingBackend scaled(4.0, claims_reference);
        const auto r = qgemm::check::run_check(scheme, 16, 256, 512, scaled, fresh_test_seed());
        EXPECT_FALSE(r.pass) << describe(r);
        EXPECT_GT(r.error_vs_exact, r.tolerance_vs_exact) << describe(r);
        continue;
      }
      const auto r = qgemm::check::run_check(scheme, 16, 256, 512, flipped, fresh_test_seed());
      EXPECT_FALSE(r.pass) << describe(r);
      // Both criteria catch it on their own.
      EXPECT_GT(r.error_vs_exact, r.tolerance_vs_exact) << describe(r);
      EXPECT_GT(r.error_vs_reference, r.tolerance_vs_reference) << describe(r);
    }
  }
}

TEST(Check, ScalesThreePercentOffFailAgainstTheReference) {
  // Too small to break the quantization tolerance, far outside a backend's own rounding.
  ScaleCorruptingBackend inflated(1.03, false);
  const auto r = qgemm::check::run_check(qgemm::parse_scheme("w8a16"), 32, 256, 512, inflated,
                                         fresh_test_seed());
  EXPECT_FALSE(r.pass) << describe(r);
  EXPECT_GT(r.error_vs_reference, r.tolerance_vs_reference) << describe(r);
}

// The reference's output, off by a factor: a kernel with a small systematic error.
class ScaledOutputBackend : public GemmBackend {
 public:
  explicit ScaledOutputBackend(double factor) : factor_(factor) {}
  std::string name() const override { return "scaled-output"; }
  std::string description() const override { return "reference output times a factor"; }
  bool is_reference() const override { return false; }
  std::vector<double> gemm(const qgemm::Scheme& scheme, const qgemm::PackedActivation& a,
                           const qgemm::PackedWeight& w) override {
    auto c = qgemm::reference::gemm(scheme, a, w);
    for (double& v : c) v = qgemm::round_to(scheme.output, v * factor_);
    return c;
  }

 private:
  double factor_;
};

// Exact results, but one element written outside C (a store past N into a row gap): the check
// fails on that alone, and it sees the placement the run asked for.
class OutsideWritingBackend : public GemmBackend {
 public:
  std::string name() const override { return "outside-writing"; }
  std::string description() const override { return "the reference, plus one write past C"; }
  bool is_reference() const override { return false; }
  std::vector<double> gemm(const qgemm::Scheme& scheme, const qgemm::PackedActivation& a,
                           const qgemm::PackedWeight& w) override {
    seen = placement_;
    return qgemm::reference::gemm(scheme, a, w);
  }
  std::int64_t outside_writes() const override { return 1; }
  qgemm::check::MatrixPlacement seen;
};

TEST(Check, AWriteOutsideCFailsAndPlacementsAreChecked) {
  OutsideWritingBackend backend;
  const qgemm::check::MatrixPlacement placement{2, 1, 3, 1};
  const auto r = qgemm::check::run_check(qgemm::parse_scheme("w4a16"), 8, 255, 256, backend,
                                         fresh_test_seed(), placement);
  EXPECT_LE(r.error_vs_reference, r.tolerance_vs_reference) << describe(r);
  EXPECT_EQ(r.outside_writes, 1);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(backend.seen.c_pad, 3);
  EXPECT_EQ(backend.seen.a_offset, 1);
  EXPECT_NE(qgemm::check::to_json(r).find("\"outside_writes\":1"), std::string::npos);
  for (const qgemm::check::MatrixPlacement& bad :
       {qgemm::check::MatrixPlacement{-1, 0, 0, 0}, qgemm::check::MatrixPlacement{0, 0, 0, 4097}}) {
    try {
      qgemm::check::run_check(qgemm::parse_scheme("w4a16"), 8, 64, 64, backend, 1, bad);
      ADD_FAILURE() << "a placement out of range was accepted";
    } catch (const qgemm::Error& error) {
      EXPECT_NE(std::string(error.what()).find("(rule: 0 to 4096 elements)"), std::string::npos)
          << error.what();
    }
  }
}

TEST(Check, HalfAPercentSystematicErrorFailsForAnFp32Backend) {
  // 0.5 % is well inside the quantization error of w4a16 but far outside what fp32
  // accumulation and one bf16 rounding explain.
  ScaledOutputBackend off(1.005);
  const auto r =
      qgemm::check::run_check(qgemm::parse_scheme("w4a16"), 32, 256, 1024, off, fresh_test_seed());
  EXPECT_FALSE(r.pass) << describe(r);
  EXPECT_LE(r.error_vs_exact, r.tolerance_vs_exact) << describe(r);
  EXPECT_GT(r.error_vs_reference, r.tolerance_vs_reference) << describe(r);
}

// A faithful GPU-like backend: dequantized operands rounded to `operand_format`, products
// accumulated in fp32 in K order, one rounding to the output format.
class FloatAccumulatingBackend : public GemmBackend {
 public:
  explicit FloatAccumulatingBackend(qgemm::Format operand_format)
      : operand_format_(operand_format) {}
  std::string name() const override { return "fp32-accumulate"; }
  std::string description() const override { return "fp32 accumulation, CPU"; }
  bool is_reference() const override { return false; }
  BackendPrecision precision() const override { return {operand_format_, qgemm::formats::fp32}; }
  std::vector<double> gemm(const qgemm::Scheme& scheme, const qgemm::PackedActivation& a,
                           const qgemm::PackedWeight& w) override {
    auto a_values = qgemm::dequantize_activation(a);
    auto w_values = qgemm::dequantize_weight(w);
    for (double& v : a_values) v = qgemm::round_to(operand_format_, v);
    for (double& v : w_values) v = qgemm::round_to(operand_format_, v);
    std::vector<double> c(static_cast<std::size_t>(a.m * w.n));
    for (std::int64_t i = 0; i < a.m; ++i)
      for (std::int64_t j = 0; j < w.n; ++j) {
        float sum = 0.0f;
        for (std::int64_t d = 0; d < a.k; ++d)
          sum +=
              static_cast<float>(a_values[i * a.k + d]) * static_cast<float>(w_values[j * a.k + d]);
        c[i * w.n + j] = qgemm::round_to(scheme.output, sum);
      }
    return c;
  }

 private:
  qgemm::Format operand_format_;
};

TEST(Check, FaithfulNonReferenceBackendsPass) {
  FloatAccumulatingBackend fp32_operands(qgemm::formats::fp32);
  FloatAccumulatingBackend bf16_operands(qgemm::formats::bf16);
  for (const char* scheme_text : {"w4a16", "w8a8-fp8", "w=int8:ch:s=fp32;a=bf16;o=fp32"}) {
    SCOPED_TRACE(scheme_text);
    const auto scheme = qgemm::parse_scheme(scheme_text);
    const auto r32 =
        qgemm::check::run_check(scheme, 16, 256, 1024, fp32_operands, fresh_test_seed());
    EXPECT_TRUE(r32.pass) << describe(r32);
    EXPECT_GT(r32.tolerance_vs_reference, 0.0);
    const auto r16 =
        qgemm::check::run_check(scheme, 16, 256, 1024, bf16_operands, fresh_test_seed());
    EXPECT_TRUE(r16.pass) << describe(r16);
  }
}

// --- the CLI -----------------------------------------------------------------------------------

struct CommandOutput {
  int status = -1;
  std::string out;
};

CommandOutput run_cli(const std::string& arguments) {
  const std::string command = std::string(QGEMM_CLI) + " " + arguments + " 2>/dev/null";
  CommandOutput result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (std::size_t read = std::fread(buffer, 1, sizeof(buffer), pipe))
    result.out.append(buffer, read);
  const int wait_status = pclose(pipe);
  result.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  return result;
}

TEST(CheckCli, W4a16OnTheCpuBackendPassesAndPrintsJson) {
  const CommandOutput text = run_cli("check --scheme w4a16 --m 64 --n 512 --k 1024 --backend cpu");
  EXPECT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("seed"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("PASS"), std::string::npos) << text.out;

  const CommandOutput json_run =
      run_cli("check --scheme w4a16 --m 64 --n 512 --k 1024 --backend cpu --json");
  ASSERT_EQ(json_run.status, 0) << json_run.out;
  const auto json = nlohmann::json::parse(json_run.out);
  EXPECT_EQ(qgemm::parse_scheme(json.at("scheme").get<std::string>()),
            qgemm::parse_scheme("w4a16"));
  EXPECT_EQ(json.at("m"), 64);
  EXPECT_EQ(json.at("n"), 512);
  EXPECT_EQ(json.at("k"), 1024);
  EXPECT_EQ(json.at("backend"), "cpu");
  EXPECT_TRUE(json.at("seed").is_number_unsigned());
  EXPECT_TRUE(json.at("pass").get<bool>());
  const double error = json.at("errors").at("vs_exact");
  EXPECT_GT(error, 0.0);
  EXPECT_LE(error, json.at("tolerances").at("vs_exact").get<double>());
  EXPECT_GT(json.at("time_ms").get<double>(), 0.0);
  EXPECT_GT(json.at("gflops").get<double>(), 0.0);
}

TEST(CheckCli, SeedIsHonouredAndBadArgumentsAreRefused) {
  const CommandOutput first =
      run_cli("check --scheme w8a8-int8 --m 4 --n 128 --k 128 --seed 99 --json");
  const CommandOutput second =
      run_cli("check --scheme w8a8-int8 --m 4 --n 128 --k 128 --seed 99 --json");
  ASSERT_EQ(first.status, 0) << first.out;
  const auto a = nlohmann::json::parse(first.out), b = nlohmann::json::parse(second.out);
  EXPECT_EQ(a.at("seed"), 99);
  EXPECT_EQ(a.at("errors"), b.at("errors"));
  EXPECT_EQ(run_cli("check --scheme no-such-scheme --m 4 --n 128 --k 128").status, 2);
  EXPECT_EQ(run_cli("check --scheme w4a16 --m 0 --n 128 --k 128").status, 2);
  EXPECT_NE(run_cli("check --scheme w4a16 --m 4 --n 128 --k 128 --backend tpu").status, 0);
}

// qgemm sweep (issue #19): random configurations, each in its own process, counted; every
// configuration the rules accept is checked (none is "refused" by the library), the JSON adds
// up, a seed replays the same draw, and bad arguments exit 2.
TEST(SweepCli, CountsEveryConfigurationAndReplaysItsSeed) {
  const CommandOutput first = run_cli("sweep --n 4 --seed 11 --backend cpu --max-work 3e8 --json");
  ASSERT_EQ(first.status, 0) << first.out;
  const auto a = nlohmann::json::parse(first.out);
  EXPECT_EQ(a.at("configurations"), 4);
  EXPECT_EQ(a.at("pass").get<int>() + a.at("refused").get<int>(), 4);
  EXPECT_EQ(a.at("wrong"), 0);
  EXPECT_EQ(a.at("crash"), 0);
  EXPECT_EQ(a.at("hang"), 0);
  const CommandOutput text = run_cli("sweep --n 4 --seed 11 --backend cpu --max-work 3e8");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("[4/4]"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("pass " + std::to_string(a.at("pass").get<int>())), std::string::npos)
      << text.out;
  // The same seed draws the same four configurations.
  const CommandOutput again = run_cli("sweep --n 4 --seed 11 --backend cpu --max-work 3e8");
  EXPECT_EQ(again.out, text.out);
  // Three at once: the same cases and verdicts, each line whole (in the order they end).
  const CommandOutput parallel =
      run_cli("sweep --n 4 --seed 11 --backend cpu --max-work 3e8 --jobs 3");
  ASSERT_EQ(parallel.status, 0) << parallel.out;
  const auto sorted_lines = [](const std::string& out) {
    std::vector<std::string> lines;
    std::istringstream stream(out);
    for (std::string line; std::getline(stream, line);) lines.push_back(line);
    std::sort(lines.begin(), lines.end());
    return lines;
  };
  EXPECT_EQ(sorted_lines(parallel.out), sorted_lines(text.out)) << parallel.out;
  EXPECT_EQ(run_cli("sweep --n 2 --backend cpu --jobs 0").status, 2);
  EXPECT_EQ(run_cli("sweep --n 0 --backend cpu").status, 2);
  EXPECT_EQ(run_cli("sweep --n 2 --backend cpu --timeout 0").status, 2);
}

// The MoE layer check (qgemm check --moe): the reference passes against itself; layers that
// are wrong in the ways a grouped kernel can be (one choice of one token sent to the wrong
// expert, the down GEMM's bias dropped, the gate and up halves exchanged, one token's row off
// by a quarter, as a misapplied router weight would be) each put elements outside their
// bounds; bad shapes are named.
class WrongMoeBackend : public GemmBackend {
 public:
  enum class Fault { None, SwappedExpert, NoDownBias, GateUpExchanged, OneRowOff };
  explicit WrongMoeBackend(Fault fault) : fault_(fault) {}
  std::string name() const override { return "wrong-moe"; }
  std::string description() const override { return "reference::moe_layer with a fault"; }
  bool is_reference() const override { return false; }
  std::vector<double> gemm(const qgemm::Scheme& scheme, const qgemm::PackedActivation& a,
                           const qgemm::PackedWeight& w) override {
    return qgemm::reference::gemm(scheme, a, w);
  }
  std::vector<double> moe_layer(const qgemm::check::MoeInputs& inputs) override {
    qgemm::check::MoeInputs in = inputs;
    const qgemm::check::MoeCase& c = in.shape;
    switch (fault_) {
      case Fault::None: break;
      case Fault::SwappedExpert:
        in.routing.expert_ids[1] = (in.routing.expert_ids[1] + 1) % c.experts;
        break;
      case Fault::NoDownBias: in.down_bias.assign(in.down_bias.size(), 0.0f); break;
      case Fault::GateUpExchanged:
        for (qgemm::PackedWeight& w : in.gate_up) {
          const std::size_t half = w.codes.size() / 2;
          std::rotate(w.codes.begin(), w.codes.begin() + half, w.codes.end());
          const std::size_t scale_half = w.scales.size() / 2;
          std::rotate(w.scales.begin(), w.scales.begin() + scale_half, w.scales.end());
        }
        break;
      case Fault::OneRowOff: break;
    }
    std::vector<double> out = GemmBackend::moe_layer(in);
    if (fault_ == Fault::OneRowOff)
      for (std::int64_t j = 0; j < c.hidden; ++j)
        out[static_cast<std::size_t>(c.hidden + j)] =
            qgemm::round_to(c.scheme.output, out[static_cast<std::size_t>(c.hidden + j)] * 1.25);
    return out;
  }

 private:
  Fault fault_;
};

TEST(MoeCheck, BoundsPassTheReferenceAndCatchEachFault) {
  qgemm::check::MoeCase c;
  c.scheme = qgemm::parse_scheme("w4a16");
  c.tokens = 5;
  c.experts = 6;
  c.top_k = 2;
  c.hidden = 256;
  c.inter = 128;
  c.bias = true;
  using Fault = WrongMoeBackend::Fault;
  for (Fault fault : {Fault::None, Fault::SwappedExpert, Fault::NoDownBias,
                      Fault::GateUpExchanged, Fault::OneRowOff}) {
    SCOPED_TRACE(static_cast<int>(fault));
    WrongMoeBackend backend(fault);
    const auto r = qgemm::check::run_moe_check(c, backend, fresh_test_seed());
    EXPECT_EQ(r.non_finite, 0);
    if (fault == Fault::None) {
      EXPECT_TRUE(r.pass) << r.outside;
      EXPECT_EQ(r.worst, 0.0);
    } else {
      EXPECT_FALSE(r.pass);
      EXPECT_GT(r.outside, 0) << "worst " << r.worst << " of its bound";
    }
  }
  for (auto [field, value] : {std::pair{"top_k", 7}, std::pair{"experts", 0}}) {
    qgemm::check::MoeCase bad = c;
    (std::string(field) == "top_k" ? bad.top_k : bad.experts) = value;
    try {
      qgemm::check::validate(bad);
      ADD_FAILURE() << field << " = " << value << " was accepted";
    } catch (const qgemm::Error& error) {
      EXPECT_NE(std::string(error.what()).find(std::string(field) + " = " + std::to_string(value)),
                std::string::npos)
          << error.what();
    }
  }
  // Quantized activations: the layer quantizes its 16-bit hidden states itself (from
  // quantized_from, which must be 16-bit); the faultless layer passes, a swapped expert not.
  qgemm::check::MoeCase quantized = c;
  quantized.scheme = qgemm::parse_scheme("w4a8-fp8");
  quantized.quantized_from = qgemm::formats::fp16;
  EXPECT_EQ(qgemm::check::hidden_type(quantized), qgemm::formats::fp16);
  for (Fault fault : {Fault::None, Fault::SwappedExpert}) {
    WrongMoeBackend backend(fault);
    const auto r = qgemm::check::run_moe_check(quantized, backend, fresh_test_seed());
    EXPECT_EQ(r.pass, fault == Fault::None) << r.outside;
  }
  const auto drawn = qgemm::check::draw_moe_inputs(quantized, 5);
  EXPECT_EQ(drawn.hidden_input.quant.format, qgemm::formats::fp16);
  EXPECT_EQ(drawn.hidden.quant, quantized.scheme.activation);
  quantized.quantized_from = qgemm::formats::fp32;
  try {
    qgemm::check::validate(quantized);
    ADD_FAILURE() << "hidden states in fp32 were accepted";
  } catch (const qgemm::Error& error) {
    EXPECT_NE(std::string(error.what()).find("hidden states fp32"), std::string::npos)
        << error.what();
  }
}

TEST(CheckCli, MoeLayerPassesOnTheCpuBackendAndSweepDrawsLayers) {
  const CommandOutput r = run_cli(
      "check --moe --scheme mxfp4-a16 --m 3 --k 720 --n 360 --experts 4 --top-k 2 --glu "
      "clamped-swiglu --bias --backend cpu --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json.at("pass"), true);
  EXPECT_EQ(json.at("glu"), "clamped-swiglu");
  EXPECT_EQ(json.at("inter"), 360);
  EXPECT_EQ(run_cli("check --moe --scheme w4a16 --m 3 --k 64 --n 64 --glu relu --backend cpu")
                .status,
            2);
  const CommandOutput sweep = run_cli("sweep --n 4 --moe --seed 3 --backend cpu --max-work 3e8");
  ASSERT_EQ(sweep.status, 0) << sweep.out;
  EXPECT_NE(sweep.out.find("] pass     moe "), std::string::npos) << sweep.out;
}

// Issue #14, item 5: K = 2880 = 22.5 groups of 128, the last group of 64 values.
TEST(CheckCli, PartialLastGroupPassesOnTheCpuBackend) {
  const CommandOutput r =
      run_cli("check --scheme w4a16 --m 7 --n 640 --k 2880 --backend cpu --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json.at("k"), 2880);
  EXPECT_TRUE(json.at("pass").get<bool>());
  EXPECT_GT(json.at("errors").at("vs_exact").get<double>(), 0.0);  // 4-bit: never exact
}

TEST(CheckCli, GpuBackendWithoutAGpuExitsWithStatus3) {
  if (qgemm::check::probe_gpu().usable) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(run_cli("check --scheme w4a16 --m 4 --n 128 --k 128 --backend gpu").status, 3);
}

TEST(CheckCli, DemoPrintsErrorAndThroughput) {
  const CommandOutput demo = run_cli("demo --m 4 --n 256 --k 512");
  EXPECT_EQ(demo.status, 0) << demo.out;
  EXPECT_NE(demo.out.find("GFLOP/s"), std::string::npos) << demo.out;
  EXPECT_NE(demo.out.find("vs the exact product"), std::string::npos) << demo.out;
}

}  // namespace
