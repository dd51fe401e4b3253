// Tests of the bench's host side (tools/harness/bench/inputs.hpp): seeded draws, the output sample, row
// slices of packed operands, the sampled reference and the error measure.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "bench/inputs.hpp"
#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"

namespace qgemm::bench {
namespace {

TEST(BenchInputs, RandomNormalIsAFunctionOfTheSeedWithTheAskedSpread) {
  const std::vector<float> a = random_normal(300000, 42, 0.5);
  EXPECT_EQ(a, random_normal(300000, 42, 0.5));
  EXPECT_NE(a, random_normal(300000, 43, 0.5));
  double sum = 0, squares = 0;
  for (float v : a) sum += v, squares += double(v) * v;
  const double mean = sum / a.size(), variance = squares / a.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(variance), 0.5, 0.01);
  EXPECT_NE(derive_seed(1, 2, 3), derive_seed(1, 2, 4));
  EXPECT_NE(derive_seed(1, 2, 3), derive_seed(1, 3, 2));
}

TEST(BenchInputs, SampleCoversEdgesWithAlignedDisjointBands) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t m = std::uniform_int_distribution<std::int64_t>(1, 9000)(rng);
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(1, 30000)(rng);
    const std::int64_t alignment = std::vector<std::int64_t>{1, 16, 128}[trial % 3];
    const OutputSample s = sample_output(m, n, alignment);
    SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n));
    // Rows: all up to 64, else 32; ascending, distinct, first and last included.
    ASSERT_EQ(s.rows.size(), static_cast<std::size_t>(std::min<std::int64_t>(m, m <= 64 ? m : 32)));
    EXPECT_EQ(s.rows.front(), 0);
    EXPECT_EQ(s.rows.back(), m - 1);
    for (std::size_t i = 1; i < s.rows.size(); ++i) EXPECT_LT(s.rows[i - 1], s.rows[i]);
    // Bands: inside [0, n), start aligned, disjoint, ascending; column 0 and column n - 1 in.
    ASSERT_FALSE(s.bands.empty());
    EXPECT_EQ(s.bands.front().first, 0);
    EXPECT_EQ(s.bands.back().second, n);
    for (std::size_t i = 0; i < s.bands.size(); ++i) {
      EXPECT_LT(s.bands[i].first, s.bands[i].second);
      EXPECT_EQ(s.bands[i].first % alignment, 0);
      if (i) EXPECT_LT(s.bands[i - 1].second, s.bands[i].first);
    }
    EXPECT_LE(s.columns(), n);
    // Bands of width w start near 0, n / 2 and n - w: gaps remain once n > 4 w.
    if (n > 5 * std::max<std::int64_t>(64, alignment)) {
      EXPECT_LT(s.columns(), n);  // a real sample, not the whole width
    }
  }
}

PackedWeight random_weight(const Scheme& scheme, std::int64_t n, std::int64_t k,
                           std::uint64_t seed) {
  const std::vector<float> values = random_normal(n * k, seed, 0.02);
  return quantize_weight(scheme.weight, values.data(), n, k);
}

TEST(BenchInputs, WeightRowSlicesDequantizeToTheSameRows) {
  // Groups with midpoint and integer zeros, channels, 2-D blocks, one tensor scale, NVFP4's
  // global scale, MX's e8m0 scales.
  const char* schemes[] = {
      "w4a16",  "w4a16-zp",  "w8a8-fp8",  "fp8-block",
      "bitnet", "nvfp4-a16", "mxfp4-a16", "w=uint4:g64:s=fp16:zp=float;a=bf16;o=bf16"};
  const std::int64_t n = 300, k = 256;
  for (const char* text : schemes) {
    SCOPED_TRACE(text);
    const Scheme scheme = parse_scheme(text);
    const PackedWeight weight = random_weight(scheme, n, k, 17);
    const std::vector<double> full = dequantize_weight(weight);
    const std::int64_t step = scale_row_alignment(weight);
    for (auto [begin, end] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {0, n},
             {0, 1},
             {step, std::min(n, 3 * step)},
             {n / step * step == n ? n - step : n / step * step, n}}) {
      SCOPED_TRACE("rows " + std::to_string(begin) + ".." + std::to_string(end));
      const PackedWeight slice = slice_weight_rows(weight, begin, end);
      ASSERT_EQ(slice.n, end - begin);
      const std::vector<double> part = dequantize_weight(slice);
      for (std::int64_t r = 0; r < end - begin; ++r)
        for (std::int64_t j = 0; j < k; ++j)
          ASSERT_EQ(part[r * k + j], full[(begin + r) * k + j]) << r << "," << j;
    }
  }
}

TEST(BenchInputs, WeightSliceMustStartAScaleRow) {
  const PackedWeight weight = random_weight(parse_scheme("fp8-block"), 256, 256, 3);
  ASSERT_EQ(scale_row_alignment(weight), 128);
  EXPECT_THROW(slice_weight_rows(weight, 64, 192), Error);
  EXPECT_THROW(slice_weight_rows(weight, 0, 257), Error);
  EXPECT_THROW(slice_weight_rows(weight, 5, 5), Error);
}

TEST(BenchInputs, ActivationRowSelectionKeepsEachRowsScales) {
  // Unquantized, per token, per-tensor static, MX groups, NVFP4 (with its tensor scale).
  const ActivationQuant quants[] = {
      parse_scheme("w4a16").activation, parse_scheme("w8a8-fp8").activation,
      parse_scheme("w=e4m3:t:s=fp32;a=e4m3:t:s=fp32;o=bf16").activation,
      parse_scheme("mxfp8-mxfp4").activation, parse_scheme("nvfp4").activation};
  const std::int64_t m = 40, k = 128;
  const std::vector<float> values = random_normal(m * k, 5, 1.0);
  const std::vector<std::int64_t> rows = {0, 3, 17, 39};
  for (const ActivationQuant& quant : quants) {
    const PackedActivation full = quantize_activation(quant, values.data(), m, k);
    const std::vector<double> all = dequantize_activation(full);
    const PackedActivation some = select_activation_rows(full, rows);
    ASSERT_EQ(some.m, static_cast<std::int64_t>(rows.size()));
    const std::vector<double> picked = dequantize_activation(some);
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::int64_t j = 0; j < k; ++j)
        ASSERT_EQ(picked[r * k + j], all[rows[r] * k + j]) << r << "," << j;
  }
}

TEST(BenchInputs, SampledReferenceIsTheFullReferenceAtTheSampledPlaces) {
  const std::int64_t m = 70, n = 640, k = 256;  // m > 64 and n > 3 bands: a real sample
  for (const char* text : {"w4a16", "fp8-block", "nvfp4"}) {
    SCOPED_TRACE(text);
    const Scheme scheme = parse_scheme(text);
    const PackedWeight weight = random_weight(scheme, n, k, 23);
    const std::vector<float> a = random_normal(m * k, 29, 1.0);
    const PackedActivation activation = quantize_activation(scheme.activation, a.data(), m, k);
    const OutputSample sample = sample_output(m, n, scale_row_alignment(weight));
    ASSERT_LT(sample.size(), m * n);
    const std::vector<double> full = reference::gemm(scheme, activation, weight);
    const std::vector<double> part = sampled_reference(scheme, activation, weight, sample);
    ASSERT_EQ(static_cast<std::int64_t>(part.size()), sample.size());
    std::size_t index = 0;
    for (std::int64_t row : sample.rows)
      for (const auto& [begin, end] : sample.bands)
        for (std::int64_t column = begin; column < end; ++column)
          ASSERT_EQ(part[index++], full[row * n + column]) << row << "," << column;
  }
}

TEST(BenchInputs, SampledBf16ProductIsTheExactProductAtTheSampledPlaces) {
  const std::int64_t m = 66, n = 700, k = 64;
  const ActivationQuant bf16 = parse_scheme("w4a16").activation;
  const std::vector<float> a_values = random_normal(m * k, 1, 1.0);
  const std::vector<float> w_values = random_normal(n * k, 2, 0.02);
  const PackedActivation a = quantize_activation(bf16, a_values.data(), m, k);
  const PackedActivation w = quantize_activation(bf16, w_values.data(), n, k);
  const OutputSample sample = sample_output(m, n, 1);
  const std::vector<double> part = sampled_bf16_product(a.codes, w.codes, k, sample);
  const std::vector<double> a_exact = dequantize_activation(a), w_exact = dequantize_activation(w);
  const std::vector<double> full = reference::matmul_nt(a_exact.data(), w_exact.data(), m, n, k);
  std::size_t index = 0;
  for (std::int64_t row : sample.rows)
    for (const auto& [begin, end] : sample.bands)
      for (std::int64_t column = begin; column < end; ++column)
        ASSERT_DOUBLE_EQ(part[index++], full[row * n + column]);
}

TEST(BenchInputs, RelativeErrorFlagsUnwrittenOutputs) {
  const std::vector<double> expected = {1.0, -2.0, 3.0};
  EXPECT_EQ(relative_frobenius_error(expected, expected), 0.0);
  EXPECT_NEAR(relative_frobenius_error({1.1, -2.2, 3.3}, expected), 0.1, 1e-12);
  EXPECT_TRUE(std::isnan(
      relative_frobenius_error({1.0, std::numeric_limits<double>::quiet_NaN(), 3.0}, expected)));
  EXPECT_TRUE(std::isnan(
      relative_frobenius_error({1.0, std::numeric_limits<double>::infinity(), 3.0}, expected)));
  EXPECT_TRUE(std::isinf(relative_frobenius_error({1.0, 0.0}, {0.0, 0.0})));
  EXPECT_THROW(relative_frobenius_error({1.0}, expected), Error);
}

TEST(BenchInputs, TolerancesSeparateRoundingFromWrongResults) {
  for (Backend backend : all_backends()) {
    const double tolerance = error_tolerance(backend);
    EXPECT_GT(tolerance, 1e-3) << to_string(backend);  // above a bf16 output rounding
    EXPECT_LT(tolerance, 0.1) << to_string(backend);   // far below an O(1) wrong result
  }
  // Fast accumulation is allowed more than the promoted one.
  EXPECT_GT(error_tolerance(Backend::CublasLtFp8), error_tolerance(Backend::CublasLtFp8Exact));
}

TEST(BenchInputs, Fp8BaselineIsPerTensorE4m3) {
  const Scheme scheme = fp8_baseline_scheme();
  EXPECT_EQ(scheme.weight.format, formats::e4m3);
  EXPECT_EQ(scheme.weight.granularity, WeightGranularity::PerTensor);
  EXPECT_EQ(scheme.activation.format, formats::e4m3);
  EXPECT_EQ(scheme.activation.scaling, ActivationScaling::StaticTensor);
  EXPECT_EQ(scheme.output, formats::bf16);
  // One fp32 scale per tensor: what cuBLASLt's scale pointers take.
  const PackedWeight w = random_weight(scheme, 64, 64, 1);
  EXPECT_EQ(w.scales.size(), 4u);
  EXPECT_EQ(engine_activation_format(scheme), formats::bf16);
  EXPECT_EQ(engine_activation_format(parse_scheme("gptq-w4a16-g128")), formats::fp16);
}

}  // namespace
}  // namespace qgemm::bench
