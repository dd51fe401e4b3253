#include "check/moe_check.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "check/error_bounds.hpp"
#include "qgemm/error.hpp"

namespace qgemm::check {
namespace {

// Errors of independent sign (each weight's rounding into the 16-bit operand, each h's
// deviation) add up to more than λ · sqrt(Σ bound²) with probability ≤ 2·exp(−λ²/2) ≈ 3e-14
// (Hoeffding), as in error_bounds.hpp; fp32 accumulation is taken at its worst case.
constexpr double kLambda = 8.0;
constexpr double kFp32 = 0x1p-24;

double glu(const GluActivation& glu, double gate, double up) {
  switch (glu.kind) {
    case GluKind::Silu: return gate / (1 + std::exp(-gate)) * up;
    case GluKind::Gelu: return 0.5 * gate * (1 + std::erf(gate / std::sqrt(2.0))) * up;
    case GluKind::ClampedSwiglu: {
      const double g = std::min<double>(gate, glu.limit);
      const double u = std::clamp<double>(up, -glu.limit, glu.limit);
      return g / (1 + std::exp(-glu.alpha * g)) * (u + 1);
    }
  }
  return 0;
}

}  // namespace

Format hidden_type(const MoeCase& c) {
  return c.scheme.activation.is_quantized() ? c.quantized_from : c.scheme.activation.format;
}

std::string describe(const MoeCase& c) {
  const std::string scheme = c.scheme.name.empty() ? to_string(c.scheme) : c.scheme.name;
  return fmt::format("{} M={} E={} top{} H={} I={} {}{} {}->{}", scheme, c.tokens, c.experts,
                     c.top_k, c.hidden, c.inter, glu_kind_name(c.glu.kind),
                     c.bias ? " bias" : "", hidden_type(c).name(), c.scheme.output.name());
}

void validate(const MoeCase& c) {
  auto fail = [](const std::string& rule) {
    throw Error(ErrorCode::InvalidArgument, "moe check: " + rule);
  };
  validate(c.scheme);
  const Format input = hidden_type(c);
  if (!(input == formats::bf16 || input == formats::fp16))
    fail(fmt::format("hidden states {} (rule: bf16 or fp16: the layer takes 16-bit activations, "
                     "and quantizes them itself where the scheme says)",
                     input.name()));
  if (c.tokens < 1 || c.tokens > 65536)
    fail(fmt::format("tokens = {} (rule: 1 to 65536)", c.tokens));
  if (c.experts < 1 || c.experts > 512)
    fail(fmt::format("experts = {} (rule: 1 to 512)", c.experts));
  if (c.top_k < 1 || c.top_k > c.experts || c.top_k > 16)
    fail(fmt::format("top_k = {} (rule: 1 to min(16, experts = {}))", c.top_k, c.experts));
  if (c.hidden < 1 || c.inter < 1 || c.hidden > 16384 || c.inter > 16384)
    fail(fmt::format("hidden = {}, inter = {} (rule: 1 to 16384 each)", c.hidden, c.inter));
  validate_shape(c.scheme, c.tokens, 2 * c.inter, c.hidden);
  validate_shape(c.scheme, c.tokens, c.hidden, c.inter);
}

MoeInputs draw_moe_inputs(const MoeCase& c, std::uint64_t seed) {
  validate(c);
  std::mt19937_64 rng(seed);
  MoeInputs in;
  in.shape = c;
  auto draw = [&](std::int64_t n, std::int64_t k) {
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
    std::vector<float> values(static_cast<std::size_t>(n * k));
    for (float& x : values) x = normal(rng);
    return quantize_weight(c.scheme.weight, values.data(), n, k);
  };
  for (int e = 0; e < c.experts; ++e) {
    in.gate_up.push_back(draw(2 * c.inter, c.hidden));
    in.down.push_back(draw(c.hidden, c.inter));
  }
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> hidden(static_cast<std::size_t>(c.tokens * c.hidden));
  for (float& x : hidden) x = unit(rng);
  ActivationQuant plain;
  plain.format = hidden_type(c);
  in.hidden_input = quantize_activation(plain, hidden.data(), c.tokens, c.hidden);
  if (c.scheme.activation.is_quantized()) {
    // From the 16-bit values the layer is given (exact in fp32).
    const std::vector<double> given = dequantize_activation(in.hidden_input);
    const std::vector<float> values(given.begin(), given.end());
    in.hidden = quantize_activation(c.scheme.activation, values.data(), c.tokens, c.hidden);
  } else {
    in.hidden = in.hidden_input;
  }
  in.routing.tokens = c.tokens;
  in.routing.top_k = c.top_k;
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  std::vector<int> order(static_cast<std::size_t>(c.experts));
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    // Distinct experts per token, as a router's top-k gives.
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < c.top_k; ++j) {
      in.routing.expert_ids.push_back(order[static_cast<std::size_t>(j)]);
      in.routing.weights.push_back(weight(rng));
    }
  }
  if (c.bias) {
    std::normal_distribution<float> normal(0.0f, 0.5f);
    in.gate_up_bias.resize(static_cast<std::size_t>(c.experts * 2 * c.inter));
    in.down_bias.resize(static_cast<std::size_t>(c.experts * c.hidden));
    for (float& x : in.gate_up_bias) x = normal(rng);
    for (float& x : in.down_bias) x = normal(rng);
  }
  return in;
}

MoeExpected expect_moe_layer(const Scheme& scheme, const PackedActivation& hidden,
                             const Format& input, const std::vector<PackedWeight>& gate_up,
                             const std::vector<PackedWeight>& down,
                             const reference::MoeRouting& routing, const GluActivation& activation,
                             const float* gate_up_bias, const float* down_bias) {
  const std::int64_t h = hidden.k, inter = down.front().k, slots = routing.tokens * routing.top_k;
  MoeExpected x;
  x.values = reference::moe_layer(scheme, hidden, gate_up, down, routing, activation, input,
                                  gate_up_bias, down_bias);
  const std::vector<double> a = dequantize_activation(hidden);
  std::vector<std::vector<double>> gu(gate_up.size()), dn(down.size());
  const double u_in = unit_roundoff(input);
  // Each product's independent roundings: the weight's into the operand, and a quantized
  // activation's code · scale into it.
  const double u_products =
      scheme.activation.is_quantized() ? std::sqrt(2.0) * u_in : u_in;
  x.bounds.assign(x.values.size(), 0.0);
  for (std::int64_t s = 0; s < slots; ++s) {
    const auto e = static_cast<std::size_t>(routing.expert_ids[static_cast<std::size_t>(s)]);
    const double w = routing.weights[static_cast<std::size_t>(s)];
    if (w == 0.0) continue;
    if (gu[e].empty()) gu[e] = dequantize_weight(gate_up[e]), dn[e] = dequantize_weight(down[e]);
    const double* a_row = a.data() + (s / routing.top_k) * h;
    // Per gate_up row r: g, the squared bounds of its independent errors (each weight's
    // rounding, u·|a_k w_k|; the rounding flip of g, 2u·|g|), its accumulation error at worst,
    // and a worst bound on |Δg| for the GLU's slopes.
    const auto rows = static_cast<std::size_t>(2 * inter);
    std::vector<double> g(rows), g_squares(rows), g_accumulation(rows), dg(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      double sum = gate_up_bias ? gate_up_bias[e * rows + r] : 0.0;
      double magnitude = 0.0, squares = 0.0;
      for (std::int64_t k = 0; k < h; ++k) {
        const double product = a_row[k] * gu[e][r * static_cast<std::size_t>(h) + k];
        sum += product;
        magnitude += std::fabs(product);
        squares += product * product;
      }
      g[r] = sum;
      g_squares[r] = u_products * u_products * squares + 4.0 * u_in * u_in * sum * sum;
      g_accumulation[r] = static_cast<double>(h) * kFp32 * magnitude;
      dg[r] = kLambda * std::sqrt(g_squares[r]) + g_accumulation[r];
    }
    // Per h_j: through the GLU's slopes, plus its own rounding flip, 2u·|h|.
    std::vector<double> hv(static_cast<std::size_t>(inter)), h_squares(hv.size()),
        h_accumulation(hv.size());
    for (std::size_t jj = 0; jj < hv.size(); ++jj) {
      const std::size_t up_row = jj + static_cast<std::size_t>(inter);
      const double gate = g[jj], up = g[up_row];
      const double slope_gate = 1.2 * (std::fabs(up) + 1 + dg[up_row]);
      const double slope_up = std::fabs(gate) + dg[jj];
      hv[jj] = glu(activation, gate, up);
      h_squares[jj] = slope_gate * slope_gate * g_squares[jj] +
                      slope_up * slope_up * g_squares[up_row] + 4.0 * u_in * u_in * hv[jj] * hv[jj];
      h_accumulation[jj] =
          slope_gate * g_accumulation[jj] + slope_up * g_accumulation[up_row] + 1e-6 * u_in;
    }
    // Per output n: the h errors carried by D, D's own rounding (u·|D h|), fp32 accumulation.
    for (std::int64_t n = 0; n < h; ++n) {
      double squares = 0, accumulation = 0, magnitude = 0;
      for (std::size_t jj = 0; jj < hv.size(); ++jj) {
        const double d = std::fabs(dn[e][static_cast<std::size_t>(n) * hv.size() + jj]);
        squares += d * d * (h_squares[jj] + u_in * u_in * hv[jj] * hv[jj]);
        accumulation += d * h_accumulation[jj];
        magnitude += d * std::fabs(hv[jj]);
      }
      x.bounds[static_cast<std::size_t>((s / routing.top_k) * h + n)] +=
          w * (kLambda * std::sqrt(squares) + accumulation +
               static_cast<double>(inter) * kFp32 * magnitude);
    }
  }
  // An fp32 output rounds as the reference's does (the absolute 1e-6 covers it).
  const double u_out = scheme.output == formats::fp32 ? 0.0 : unit_roundoff(scheme.output);
  for (std::size_t i = 0; i < x.bounds.size(); ++i)
    x.bounds[i] += 2.0 * u_out * std::fabs(x.values[i]) + 1e-6;
  return x;
}

MoeCheckResult run_moe_check(const MoeCase& c, GemmBackend& backend, std::uint64_t seed) {
  const MoeInputs in = draw_moe_inputs(c, seed);
  MoeCheckResult result;
  result.shape = c;
  result.backend = backend.name();
  result.seed = seed;
  const auto started = std::chrono::steady_clock::now();
  const std::vector<double> got = backend.moe_layer(in);
  result.time_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  const MoeExpected x = expect_moe_layer(
      c.scheme, in.hidden, hidden_type(c), in.gate_up, in.down, in.routing, c.glu,
      in.gate_up_bias.empty() ? nullptr : in.gate_up_bias.data(),
      in.down_bias.empty() ? nullptr : in.down_bias.data());
  if (got.size() != x.values.size())
    throw Error(ErrorCode::Internal, fmt::format("moe check: backend {} returned {} values for "
                                                 "[{}, {}]",
                                                 backend.name(), got.size(), c.tokens, c.hidden));
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - x.values[i]);
    norm += x.values[i] * x.values[i];
    if (std::isfinite(got[i])) {
      error += d * d;
      result.worst = std::max(result.worst, d / x.bounds[i]);
    } else {
      ++result.non_finite;
    }
    if (!(d <= x.bounds[i])) ++result.outside;  // written so that NaN counts
  }
  result.relative = norm > 0 ? std::sqrt(error / norm) : std::sqrt(error);
  result.pass = result.outside == 0;
  return result;
}

std::string to_json(const MoeCheckResult& r) {
  nlohmann::json json;
  json["moe"] = describe(r.shape);
  json["scheme"] = to_string(r.shape.scheme);
  json["tokens"] = r.shape.tokens;
  json["experts"] = r.shape.experts;
  json["top_k"] = r.shape.top_k;
  json["hidden"] = r.shape.hidden;
  json["inter"] = r.shape.inter;
  json["glu"] = glu_kind_name(r.shape.glu.kind);
  json["bias"] = r.shape.bias;
  json["backend"] = r.backend;
  json["seed"] = r.seed;
  json["outside"] = r.outside;
  json["non_finite"] = r.non_finite;
  json["worst"] = r.worst;
  json["relative"] = r.relative;
  json["pass"] = r.pass;
  json["time_ms"] = r.time_ms;
  return json.dump();
}

}  // namespace qgemm::check
