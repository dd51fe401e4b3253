// reference::moe against a direct per-token loop written here, and its routing validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "qgemm/scheme.hpp"
#include "test_reference_support.hpp"

namespace {

using qgemm::reference::MoeActivation;
using qgemm::reference::MoeRouting;
using qgemm_test::fresh_test_seed;
using qgemm_test::random_floats;

struct MoeProblem {
  qgemm::Scheme scheme;
  qgemm::PackedActivation a;
  std::vector<qgemm::PackedWeight> experts;
  MoeRouting routing;
};

// `rows` rows per expert (2n for SiLU-GLU). Routing: distinct experts per token, positive
// router weights that do not sum to one (the reference must not normalize them).
MoeProblem moe_problem(const std::string& scheme_text, std::int64_t tokens, std::int64_t rows,
                       std::int64_t k, int expert_count, int top_k, std::mt19937_64& rng) {
  MoeProblem p;
  p.scheme = qgemm::parse_scheme(scheme_text);
  const auto a = random_floats(rng, tokens * k, 1.0);
  p.a = qgemm::quantize_activation(p.scheme.activation, a.data(), tokens, k);
  for (int e = 0; e < expert_count; ++e) {
    const auto w = random_floats(rng, rows * k, 0.05);
    p.experts.push_back(qgemm::quantize_weight(p.scheme.weight, w.data(), rows, k));
  }
  p.routing.tokens = tokens;
  p.routing.top_k = top_k;
  std::uniform_real_distribution<float> router_weight(0.1f, 1.5f);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> ids(expert_count);
    for (int e = 0; e < expert_count; ++e) ids[e] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int j = 0; j < top_k; ++j) {
      p.routing.expert_ids.push_back(ids[j]);
      p.routing.weights.push_back(router_weight(rng));
    }
  }
  return p;
}

double sigmoid_weighted(double x) { return 0.5 * x * (1.0 + std::tanh(0.5 * x)); }  // SiLU

// For each token, each of its choices, each output column: the dot products themselves.
void expect_matches_direct_loop(const MoeProblem& p, MoeActivation activation,
                                const std::vector<double>& got) {
  const std::int64_t k = p.a.k, rows = p.experts.front().n;
  const bool gated = activation == MoeActivation::SiluGlu;
  const std::int64_t out_n = gated ? rows / 2 : rows;
  ASSERT_EQ(got.size(), static_cast<std::size_t>(p.routing.tokens * out_n));
  const auto a = qgemm::dequantize_activation(p.a);
  std::vector<std::vector<double>> w;
  for (const auto& expert : p.experts) w.push_back(qgemm::dequantize_weight(expert));
  auto dot = [&](std::int64_t t, int e, std::int64_t row, double& magnitude) {
    double sum = 0;
    for (std::int64_t d = 0; d < k; ++d) {
      sum += a[t * k + d] * w[e][row * k + d];
      magnitude += std::fabs(a[t * k + d] * w[e][row * k + d]);
    }
    return sum;
  };
  int reported = 0;
  for (std::int64_t t = 0; t < p.routing.tokens; ++t)
    for (std::int64_t j = 0; j < out_n; ++j) {
      double sum = 0, magnitude = 0;
      for (int choice = 0; choice < p.routing.top_k; ++choice) {
        const int e = p.routing.expert_ids[t * p.routing.top_k + choice];
        const double weight = p.routing.weights[t * p.routing.top_k + choice];
        double local_magnitude = 0;
        double value = dot(t, e, j, local_magnitude);
        if (gated) {
          double up_magnitude = 0;
          const double up = dot(t, e, out_n + j, up_magnitude);
          local_magnitude = local_magnitude * std::fabs(up) + up_magnitude * std::fabs(value);
          value = sigmoid_weighted(value) * up;
        }
        sum += weight * value;
        magnitude += std::fabs(weight) * local_magnitude;
      }
      const double want = qgemm::round_to(p.scheme.output, sum);
      const double have = got[t * out_n + j];
      if (have == want) continue;
      // A different summation order may land on the other side of a rounding midpoint.
      const double slack = 16.0 * k * 0x1p-53 * (magnitude + 1e-300);
      const bool near_midpoint =
          std::fabs(have - want) <= 2.0 * qgemm::half_ulp(p.scheme.output, sum) &&
          std::fabs(sum - 0.5 * (have + want)) <= slack;
      if (!near_midpoint && reported++ < 5)
        ADD_FAILURE() << "token " << t << " column " << j << ": " << have << ", direct loop "
                      << want << " (exact " << sum << ")";
    }
}

TEST(ReferenceMoe, PlainExpertsMatchDirectPerTokenLoop) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (const std::string scheme_text : {"w4a16", "w8a8-fp8"}) {
    SCOPED_TRACE(scheme_text);
    const MoeProblem p = moe_problem(scheme_text, 11, 40, 256, 6, 2, rng);
    const auto c = qgemm::reference::moe(p.scheme, p.a, p.experts, p.routing);
    expect_matches_direct_loop(p, MoeActivation::None, c);
  }
}

TEST(ReferenceMoe, GateUpSiluGluMatchesDirectPerTokenLoop) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (const std::string scheme_text : {"w4a16", "mxfp4-a16"}) {
    SCOPED_TRACE(scheme_text);
    const MoeProblem p = moe_problem(scheme_text, 9, 2 * 24, 128, 5, 3, rng);
    const auto c =
        qgemm::reference::moe(p.scheme, p.a, p.experts, p.routing, MoeActivation::SiluGlu);
    expect_matches_direct_loop(p, MoeActivation::SiluGlu, c);
  }
}

TEST(ReferenceMoe, TopOneWithUnitWeightIsTheDenseGemmOfThatExpert) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  MoeProblem p = moe_problem("w4a16-zp", 6, 32, 128, 3, 1, rng);
  for (auto& id : p.routing.expert_ids) id = 2;
  for (auto& weight : p.routing.weights) weight = 1.0f;
  const auto moe = qgemm::reference::moe(p.scheme, p.a, p.experts, p.routing);
  const auto dense = qgemm::reference::gemm(p.scheme, p.a, p.experts[2]);
  EXPECT_EQ(moe, dense);
}

class ReferenceMoeRouting : public testing::Test {
 protected:
  void SetUp() override {
    seed_ = fresh_test_seed();
    std::mt19937_64 rng(seed_);
    p_ = moe_problem("w4a16", 4, 16, 128, 3, 2, rng);
  }
  std::string message(const MoeRouting& routing,
                      MoeActivation activation = MoeActivation::None) const {
    return qgemm_test::error_message_of(
        [&] { qgemm::reference::moe(p_.scheme, p_.a, p_.experts, routing, activation); });
  }
  std::uint64_t seed_ = 0;
  MoeProblem p_;
};

TEST_F(ReferenceMoeRouting, RejectsExpertIdsOutOfRange) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  MoeRouting routing = p_.routing;
  routing.expert_ids[5] = 3;
  EXPECT_NE(message(routing).find("expert_ids[5] (token 2, choice 1) = 3"), std::string::npos)
      << message(routing);
  routing.expert_ids[5] = -1;
  EXPECT_NE(message(routing).find("= -1"), std::string::npos) << message(routing);
}

TEST_F(ReferenceMoeRouting, RejectsSizesThatDoNotMatch) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  MoeRouting routing = p_.routing;
  routing.expert_ids.pop_back();
  EXPECT_NE(message(routing).find("expert_ids has 7 entries"), std::string::npos)
      << message(routing);
  routing = p_.routing;
  routing.weights.push_back(0.5f);
  EXPECT_NE(message(routing).find("weights has 9 entries"), std::string::npos) << message(routing);
  routing = p_.routing;
  routing.tokens = 5;
  EXPECT_NE(message(routing).find("tokens = 5"), std::string::npos) << message(routing);
  routing = p_.routing;
  routing.top_k = 0;
  EXPECT_NE(message(routing).find("top_k = 0"), std::string::npos) << message(routing);
}

TEST_F(ReferenceMoeRouting, RejectsNonFiniteWeightsOddGateUpAndMixedExperts) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  MoeRouting routing = p_.routing;
  routing.weights[2] = std::numeric_limits<float>::infinity();
  EXPECT_NE(message(routing).find("weights[2]"), std::string::npos) << message(routing);

  std::mt19937_64 rng(seed_ + 1);
  MoeProblem odd = moe_problem("w4a16", 4, 15, 128, 3, 2, rng);
  const std::string odd_message = qgemm_test::error_message_of([&] {
    qgemm::reference::moe(odd.scheme, odd.a, odd.experts, odd.routing, MoeActivation::SiluGlu);
  });
  EXPECT_NE(odd_message.find("n = 15"), std::string::npos) << odd_message;

  std::vector<qgemm::PackedWeight> mixed = p_.experts;
  mixed[1] = odd.experts[1];
  const std::string mixed_message = qgemm_test::error_message_of(
      [&] { qgemm::reference::moe(p_.scheme, p_.a, mixed, p_.routing); });
  EXPECT_NE(mixed_message.find("expert 1 has n = 15"), std::string::npos) << mixed_message;

  const std::string empty_message =
      qgemm_test::error_message_of([&] { qgemm::reference::moe(p_.scheme, p_.a, {}, p_.routing); });
  EXPECT_NE(empty_message.find("experts is empty"), std::string::npos) << empty_message;
}

}  // namespace
