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


// reference::moe_layer against a per-slot loop written here: g = a·GUᵀ + bias rounded to the
// intermediate type, h = glu(gate, up) rounded again, y = h·Dᵀ + bias, Σ_j w_j·y rounded once.
// Each GLU is written out here on its own (SiLU through tanh, GELU through erf, the clamped
// SwiGLU of gpt-oss), so a wrong formula, a swapped gate and up, or a missing bias fails.
TEST(ReferenceMoeLayer, MatchesADirectPerSlotLoopForEveryGlu) {
  const std::uint64_t seed = fresh_test_seed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const std::int64_t tokens = 7, h = 96, inter = 40;
  const int experts = 5, top_k = 2;
  for (qgemm::GluKind kind :
       {qgemm::GluKind::Silu, qgemm::GluKind::Gelu, qgemm::GluKind::ClampedSwiglu}) {
    SCOPED_TRACE(qgemm::glu_kind_name(kind));
    qgemm::GluActivation glu;
    glu.kind = kind;
    glu.alpha = 1.702f;
    glu.limit = 1.5f;  // small enough that the clamps bite on unit-scale values
    const qgemm::Scheme scheme = qgemm::parse_scheme("w4a16");
    const auto a_values = random_floats(rng, tokens * h, 1.0);
    const qgemm::PackedActivation a = qgemm::quantize_activation(scheme.activation, a_values.data(), tokens, h);
    std::vector<qgemm::PackedWeight> gate_up, down;
    for (int e = 0; e < experts; ++e) {
      const auto gu = random_floats(rng, 2 * inter * h, 0.15);
      const auto dn = random_floats(rng, h * inter, 0.2);
      gate_up.push_back(qgemm::quantize_weight(scheme.weight, gu.data(), 2 * inter, h));
      down.push_back(qgemm::quantize_weight(scheme.weight, dn.data(), h, inter));
    }
    const auto up_bias = random_floats(rng, experts * 2 * inter, 0.5);
    const auto down_bias = random_floats(rng, experts * h, 0.5);
    const MoeProblem routed = moe_problem("w4a16", tokens, 8, 16, experts, top_k, rng);
    const std::vector<double> got = qgemm::reference::moe_layer(
        scheme, a, gate_up, down, routed.routing, glu, qgemm::formats::bf16, up_bias.data(),
        down_bias.data());
    ASSERT_EQ(got.size(), static_cast<std::size_t>(tokens * h));

    const auto av = qgemm::dequantize_activation(a);
    auto bf16 = [](double x) { return qgemm::round_to(qgemm::formats::bf16, x); };
    auto glu_of = [&](double gate, double up) {
      switch (kind) {
        case qgemm::GluKind::Silu: return sigmoid_weighted(gate) * up;
        case qgemm::GluKind::Gelu: return 0.5 * gate * std::erfc(-gate / std::sqrt(2.0)) * up;
        case qgemm::GluKind::ClampedSwiglu: {
          const double g = gate > 1.5 ? 1.5 : gate;
          const double u = up > 1.5 ? 1.5 : (up < -1.5 ? -1.5 : up);
          return g * 0.5 * (1.0 + std::tanh(0.5 * 1.702 * g)) * (u + 1.0);
        }
      }
      return 0.0;
    };
    int reported = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<double> sum(static_cast<std::size_t>(h), 0.0), magnitude(sum.size(), 0.0);
      for (int j = 0; j < top_k; ++j) {
        const int e = routed.routing.expert_ids[t * top_k + j];
        const double w = routed.routing.weights[t * top_k + j];
        const auto gu = qgemm::dequantize_weight(gate_up[e]);
        const auto dn = qgemm::dequantize_weight(down[e]);
        std::vector<double> act(static_cast<std::size_t>(inter));
        for (std::int64_t i = 0; i < inter; ++i) {
          double gate = up_bias[e * 2 * inter + i], up = up_bias[e * 2 * inter + inter + i];
          for (std::int64_t d = 0; d < h; ++d) {
            gate += av[t * h + d] * gu[i * h + d];
            up += av[t * h + d] * gu[(inter + i) * h + d];
          }
          act[i] = bf16(glu_of(bf16(gate), bf16(up)));
        }
        for (std::int64_t n = 0; n < h; ++n) {
          double y = down_bias[e * h + n];
          for (std::int64_t i = 0; i < inter; ++i) y += act[i] * dn[n * inter + i];
          sum[n] += w * y;
          magnitude[n] += std::fabs(w) * (std::fabs(y) + 1.0);
        }
      }
      for (std::int64_t n = 0; n < h; ++n) {
        // Different summation orders may flip an intermediate rounding: one bf16 step of one
        // activation value moves y by at most 2^-8 of its magnitude.
        const double want = qgemm::round_to(qgemm::formats::bf16, sum[n]);
        if (std::fabs(got[t * h + n] - want) <= std::ldexp(magnitude[n], -8)) continue;
        if (reported++ < 5)
          ADD_FAILURE() << "token " << t << " column " << n << ": " << got[t * h + n]
                        << ", direct loop " << want;
      }
    }
  }
}

TEST(ReferenceMoeLayer, RejectsMismatchedExpertsAndBadBiases) {
  std::mt19937_64 rng(7);
  const qgemm::Scheme scheme = qgemm::parse_scheme("w4a16");
  const auto a_values = random_floats(rng, 2 * 64, 1.0);
  const qgemm::PackedActivation a = qgemm::quantize_activation(scheme.activation, a_values.data(), 2, 64);
  const auto gu = random_floats(rng, 2 * 32 * 64, 0.1);
  const auto dn = random_floats(rng, 64 * 32, 0.1);
  const auto wrong = random_floats(rng, 64 * 48, 0.1);
  std::vector<qgemm::PackedWeight> gate_up = {qgemm::quantize_weight(scheme.weight, gu.data(), 64, 64)};
  std::vector<qgemm::PackedWeight> down = {qgemm::quantize_weight(scheme.weight, dn.data(), 64, 32)};
  std::vector<qgemm::PackedWeight> down_wrong = {qgemm::quantize_weight(scheme.weight, wrong.data(), 64, 48)};
  MoeRouting routing;
  routing.tokens = 2;
  routing.top_k = 1;
  routing.expert_ids = {0, 0};
  routing.weights = {1.0f, 0.5f};
  const qgemm::GluActivation glu;
  EXPECT_NO_THROW(qgemm::reference::moe_layer(scheme, a, gate_up, down, routing, glu,
                                              qgemm::formats::bf16));
  try {
    qgemm::reference::moe_layer(scheme, a, gate_up, down_wrong, routing, glu, qgemm::formats::bf16);
    ADD_FAILURE() << "gate_up 64 rows against down K = 48 was accepted";
  } catch (const qgemm::Error& error) {
    EXPECT_NE(std::string(error.what()).find("gate_up [2I, H]"), std::string::npos) << error.what();
  }
  std::vector<float> bias(64, 0.0f);
  bias[5] = std::numeric_limits<float>::infinity();
  try {
    qgemm::reference::moe_layer(scheme, a, gate_up, down, routing, glu, qgemm::formats::bf16,
                                bias.data());
    ADD_FAILURE() << "an infinite bias was accepted";
  } catch (const qgemm::Error& error) {
    EXPECT_NE(std::string(error.what()).find("gate_up_bias[0][5]"), std::string::npos)
        << error.what();
  }
}

}  // namespace
