// reference::matmul_nt and reference::gemm against independent loops written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "qgemm/scheme.hpp"

namespace {

std::uint64_t fresh_test_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

std::vector<double> random_doubles(std::mt19937_64& rng, std::size_t count) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> values(count);
  for (double& value : values) value = normal(rng);
  return values;
}

std::vector<float> random_floats(std::mt19937_64& rng, std::size_t count, double sigma) {
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<float> values(count);
  for (float& value : values) value = static_cast<float>(normal(rng));
  return values;
}

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
  const auto c = qgemm::reference::matmul_nt(a.data(), w.data(), m, n, k,
                                             with_bias ? bias.data() : nullptr);
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

}  // namespace
