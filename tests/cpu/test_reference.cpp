// reference::matmul_nt and reference::gemm against independent loops written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "qgemm/scheme.hpp"
#include "test_reference_support.hpp"

namespace {

using qgemm_test::fresh_test_seed;
using qgemm_test::random_doubles;
using qgemm_test::random_floats;

// The textbook triple loop, in K order: nothing shared with the blocked implementation.
std::vector<double> naive_matmul_nt(const std::vector<double>& a, const std::vector<double>& w,
                                    std::int64_t m, std::int64_t n, std::int64_t k) {
  std::vector<double> c(m * n);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t d = 0; d < k; ++d) sum += a[i * k + d] * w[j * k + d];
      c[i * n + j] = sum;
    }
  return c;
}

// Σ_d |a[i, d]| · |w[j, d]|: the scale of the rounding error of any summation order.
double magnitude_sum(const std::vector<double>& a, const std::vector<double>& w, std::int64_t i,
                     std::int64_t j, std::int64_t k) {
  double sum = 0;
  for (std::int64_t d = 0; d < k; ++d) sum += std::fabs(a[i * k + d] * w[j * k + d]);
  return sum;
}

void expect_matches_naive(std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t seed,
                          bool with_bias) {
  SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " seed=" << seed);
  std::mt19937_64 rng(seed);
  const auto a = random_doubles(rng, m * k);
  const auto w = random_doubles(rng, n * k);
  const auto bias = random_doubles(rng, n);
  const auto c =
      qgemm::reference::matmul_nt(a.data(), w.data(), m, n, k, with_bias ? bias.data() : nullptr);
  const auto expected = naive_matmul_nt(a, w, m, n, k);
  ASSERT_EQ(c.size(), static_cast<std::size_t>(m * n));
  int reported = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const double want = expected[i * n + j] + (with_bias ? bias[j] : 0.0);
      // Two summation orders of k terms differ by at most ~k·2^-53·Σ|a·w|.
      const double allowed = 4.0 * k * 0x1p-53 * (magnitude_sum(a, w, i, j, k) + 1.0);
      const double got = c[i * n + j];
      if (!(std::fabs(got - want) <= allowed) && reported++ < 5)
        ADD_FAILURE() << "C[" << i << ", " << j << "] = " << got << ", naive " << want
                      << ", allowed difference " << allowed;
    }
}

TEST(ReferenceMatmul, MatchesNaiveLoopOnRandomOddShapes) {
  const std::uint64_t seed = fresh_test_seed();
  std::mt19937_64 shapes(seed);
  std::uniform_int_distribution<std::int64_t> rows(1, 37), cols(1, 70), depth(1, 600);
  for (int trial = 0; trial < 12; ++trial)
    expect_matches_naive(rows(shapes), cols(shapes), depth(shapes), seed + trial, trial % 2 == 0);
}

TEST(ReferenceMatmul, MatchesNaiveLoopWhenSplitAcrossThreads) {
  const std::uint64_t seed = fresh_test_seed();
  // Large enough to use every thread: split by rows, then (few rows) by columns.
  expect_matches_naive(37, 131, 523, seed, true);
  expect_matches_naive(3, 1031, 777, seed + 1, false);
}

TEST(ReferenceMatmul, ResultDoesNotDependOnTheThreadSplit) {
  // Row i of a multi-row product must equal the same row computed alone (one thread).
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const std::int64_t m = 41, n = 257, k = 515;
  const auto a = random_doubles(rng, m * k);
  const auto w = random_doubles(rng, n * k);
  const auto all = qgemm::reference::matmul_nt(a.data(), w.data(), m, n, k);
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{17}, m - 1}) {
    const auto row = qgemm::reference::matmul_nt(a.data() + i * k, w.data(), 1, n, k);
    for (std::int64_t j = 0; j < n; ++j) ASSERT_EQ(row[j], all[i * n + j]) << "i=" << i;
  }
}

TEST(ReferenceMatmul, RejectsEmptyShapesAndNullOperands) {
  const std::vector<double> a(12, 1.5), w(12, -0.5);
  EXPECT_THROW(qgemm::reference::matmul_nt(a.data(), w.data(), 0, 3, 4), qgemm::Error);
  EXPECT_THROW(qgemm::reference::matmul_nt(a.data(), w.data(), 3, 3, 0), qgemm::Error);
  EXPECT_THROW(qgemm::reference::matmul_nt(nullptr, w.data(), 3, 3, 4), qgemm::Error);
  EXPECT_THROW(qgemm::reference::matmul_nt(a.data(), nullptr, 3, 3, 4), qgemm::Error);
  try {
    qgemm::reference::matmul_nt(a.data(), w.data(), 3, -2, 4);
    ADD_FAILURE() << "negative n accepted";
  } catch (const qgemm::Error& error) {
    EXPECT_NE(std::string(error.what()).find("n = -2"), std::string::npos) << error.what();
  }
}

// --- reference::gemm ------------------------------------------------------------------------

struct QuantizedProblem {
  qgemm::Scheme scheme;
  qgemm::PackedActivation a;
  qgemm::PackedWeight w;
  std::vector<double> a_values, w_values;  // dequantized (the quantizer's exact inverse)
};

QuantizedProblem quantized_problem(const std::string& scheme_text, std::int64_t m, std::int64_t n,
                                   std::int64_t k, std::mt19937_64& rng) {
  QuantizedProblem p;
  p.scheme = qgemm::parse_scheme(scheme_text);
  const auto a = random_floats(rng, m * k, 1.0);
  const auto w = random_floats(rng, n * k, 0.05);
  p.a = qgemm::quantize_activation(p.scheme.activation, a.data(), m, k);
  p.w = qgemm::quantize_weight(p.scheme.weight, w.data(), n, k);
  p.a_values = qgemm::dequantize_activation(p.a);
  p.w_values = qgemm::dequantize_weight(p.w);
  return p;
}

// `got` must be `exact` rounded to `output`; where `exact` sits within `slack` of a rounding
// midpoint either neighbour is accepted (the summation order differs from the reference's).
void expect_rounded_value(const qgemm::Format& output, double exact, double slack, double got,
                          const std::string& where, int& reported) {
  const double want = qgemm::round_to(output, exact);
  if (got == want) return;
  const double step = qgemm::half_ulp(output, exact);
  const bool near_midpoint =
      std::fabs(got - want) <= 2.0 * step && std::fabs(exact - 0.5 * (got + want)) <= slack;
  if (!near_midpoint && reported++ < 5)
    ADD_FAILURE() << where << " = " << got << ", expected " << want << " (exact " << exact << ")";
}

TEST(ReferenceGemm, EqualsRoundedDirectLoopWithBias) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (const std::string scheme_text : {"w4a16", "w8a8-fp8", "nvfp4", "gptq-w4a16-g128"}) {
    SCOPED_TRACE(scheme_text);
    const std::int64_t m = 7, n = 37, k = 256;
    QuantizedProblem p = quantized_problem(scheme_text, m, n, k, rng);
    const auto bias = random_floats(rng, n, 0.5);
    const auto c = qgemm::reference::gemm(p.scheme, p.a, p.w, bias.data());
    ASSERT_EQ(c.size(), static_cast<std::size_t>(m * n));
    int reported = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = bias[j], magnitude = std::fabs(bias[j]);
        for (std::int64_t d = 0; d < k; ++d) {
          sum += p.a_values[i * k + d] * p.w_values[j * k + d];
          magnitude += std::fabs(p.a_values[i * k + d] * p.w_values[j * k + d]);
        }
        expect_rounded_value(p.scheme.output, sum, 4.0 * k * 0x1p-53 * magnitude, c[i * n + j],
                             "C[" + std::to_string(i) + ", " + std::to_string(j) + "]", reported);
      }
  }
}

// K that the groups do not divide (a shorter last group, issue #14, item 5): the reference
// equals the same problem with every row's last group filled up to G, the weight with copies of
// the group's own values (same scales and codes) and the activations with zeros (same scales,
// products 0), exactly; and it is the rounded direct loop over the dequantized operands.
TEST(ReferenceGemm, PartialLastGroupsEqualTheFilledUpProblem) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  struct Case {
    const char* scheme;
    std::int64_t k, group;  // the group of both operands' cells along K
  };
  for (const Case& c :
       {Case{"w4a16", 2880, 128}, Case{"gptq-w4a16-g128", 2880, 128}, Case{"fp8-block", 2880, 128},
        Case{"w4a8-fp8", 2880, 128}, Case{"mxfp4-a16", 2896, 32}, Case{"mxfp8-mxfp4", 2896, 32},
        Case{"nvfp4", 2904, 16}}) {
    SCOPED_TRACE(testing::Message() << c.scheme << " K=" << c.k);
    const qgemm::Scheme scheme = qgemm::parse_scheme(c.scheme);
    const std::int64_t m = 3, n = 37, k = c.k;
    const std::int64_t full_k = (k + c.group - 1) / c.group * c.group, last = full_k - c.group;
    ASSERT_NE(full_k, k);
    const auto a = random_floats(rng, m * k, 1.0);
    const auto w = random_floats(rng, n * k, 0.05);
    std::vector<float> a_full(m * full_k, 0.0f), w_full(n * full_k);
    for (std::int64_t r = 0; r < m; ++r)
      std::copy(a.begin() + r * k, a.begin() + (r + 1) * k, a_full.begin() + r * full_k);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t d = 0; d < full_k; ++d)
        w_full[j * full_k + d] = w[j * k + (d < k ? d : last + (d - k) % (k - last))];
    const auto qa = qgemm::quantize_activation(scheme.activation, a.data(), m, k);
    const auto qw = qgemm::quantize_weight(scheme.weight, w.data(), n, k);
    const auto c_partial = qgemm::reference::gemm(scheme, qa, qw);
    const auto c_full = qgemm::reference::gemm(
        scheme, qgemm::quantize_activation(scheme.activation, a_full.data(), m, full_k),
        qgemm::quantize_weight(scheme.weight, w_full.data(), n, full_k));
    ASSERT_EQ(c_partial.size(), c_full.size());
    for (std::size_t i = 0; i < c_partial.size(); ++i)
      ASSERT_EQ(c_partial[i], c_full[i]) << "C[" << i / n << ", " << i % n << "]";
    const auto a_values = qgemm::dequantize_activation(qa);
    const auto w_values = qgemm::dequantize_weight(qw);
    int reported = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (std::int64_t d = 0; d < k; ++d) {
          sum += a_values[i * k + d] * w_values[j * k + d];
          magnitude += std::fabs(a_values[i * k + d] * w_values[j * k + d]);
        }
        expect_rounded_value(scheme.output, sum, 4.0 * k * 0x1p-53 * magnitude,
                             c_partial[i * n + j],
                             "C[" + std::to_string(i) + ", " + std::to_string(j) + "]", reported);
      }
  }
}

TEST(ReferenceGemm, WithoutBiasIsTheSameProductMinusBias) {
  // The bias enters once, after the product: C(bias) - bias and C(no bias) agree to rounding.
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  QuantizedProblem p = quantized_problem("w=int8:ch:s=fp32;a=bf16;o=fp32", 5, 19, 64, rng);
  const auto bias = random_floats(rng, 19, 3.0);
  const auto with_bias = qgemm::reference::gemm(p.scheme, p.a, p.w, bias.data());
  const auto without = qgemm::reference::gemm(p.scheme, p.a, p.w);
  for (std::size_t i = 0; i < with_bias.size(); ++i) {
    const double b = bias[i % 19];
    EXPECT_NEAR(with_bias[i] - b, without[i], 1e-6 * (std::fabs(b) + std::fabs(without[i])));
    EXPECT_NE(with_bias[i], without[i]);
  }
}

TEST(ReferenceGemm, RejectsMismatchedOperands) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  QuantizedProblem p = quantized_problem("w4a16", 3, 8, 256, rng);
  QuantizedProblem other_k = quantized_problem("w4a16", 3, 8, 128, rng);
  auto message_of = [](auto&& call) { return qgemm_test::error_message_of(call); };
  EXPECT_NE(message_of([&] { qgemm::reference::gemm(p.scheme, other_k.a, p.w); }).find("k = 128"),
            std::string::npos);
  const qgemm::Scheme fp8 = qgemm::parse_scheme("w8a8-fp8");
  EXPECT_NE(message_of([&] { qgemm::reference::gemm(fp8, p.a, p.w); }).find("activation"),
            std::string::npos);
  qgemm::Scheme other_weight = p.scheme;
  other_weight.activation = p.a.quant;
  other_weight.weight.group = 64;
  EXPECT_NE(message_of([&] { qgemm::reference::gemm(other_weight, p.a, p.w); }).find("weight"),
            std::string::npos);
  std::vector<float> bias(8, 0.25f);
  bias[5] = std::nanf("");
  EXPECT_NE(
      message_of([&] { qgemm::reference::gemm(p.scheme, p.a, p.w, bias.data()); }).find("bias[5]"),
      std::string::npos);
}

}  // namespace
