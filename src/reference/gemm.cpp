// reference::gemm and reference::moe: the quantized GEMM as the scheme defines it.
//
// Both dequantize the packed operands exactly (src/quant), multiply in double (matmul_nt) and
// round once, at the very end, to the scheme's output format. Nothing here approximates: a
// backend that differs from these results by more than its own rounding is wrong.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/reference.hpp"

namespace qgemm::reference {
namespace {

// Messages are built only on failure: to_string of a scheme is not free.
void require_operands_match(const char* function, const Scheme& scheme, const PackedActivation& a,
                            const WeightQuant& weight_quant, std::int64_t weight_k,
                            const std::string& weight_name) {
  if (!(a.quant == scheme.activation))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("reference::{}: the activation was quantized as {} but the scheme is "
                            "{} (rule: operands are quantized with the scheme they are "
                            "multiplied under)",
                            function, to_string(Scheme{"", scheme.weight, a.quant, scheme.output}),
                            to_string(scheme)));
  if (!(weight_quant == scheme.weight))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("reference::{}: {} was quantized as {} but the scheme is {} (rule: "
                            "operands are quantized with the scheme they are multiplied under)",
                            function, weight_name,
                            to_string(Scheme{"", weight_quant, scheme.activation, scheme.output}),
                            to_string(scheme)));
  require(a.k == weight_k,
          "reference::{}: activation k = {} differs from {} k = {} (rule: A is "
          "[m, k] and W is [n, k] with the same k)",
          function, a.k, weight_name, weight_k);
}

void round_all_to(const Format& format, std::vector<double>& values) {
  for (double& value : values) value = round_to(format, value);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// Routing: sizes first, then every id and weight, naming the first bad entry.
void check_routing(const char* function, const MoeRouting& routing, std::int64_t tokens,
                   std::int64_t expert_count) {
  require(routing.tokens == tokens,
          "reference::{}: routing.tokens = {} but the activation has m = {} rows "
          "(rule: one routing entry per token)",
          function, routing.tokens, tokens);
  require(routing.top_k >= 1, "reference::{}: routing.top_k = {} (rule: top_k >= 1)",
          function, routing.top_k);
  const std::int64_t slots = routing.tokens * routing.top_k;
  require(static_cast<std::int64_t>(routing.expert_ids.size()) == slots,
          "reference::{}: routing.expert_ids has {} entries (rule: tokens * top_k "
          "= {} * {} = {})",
          function, routing.expert_ids.size(), routing.tokens, routing.top_k, slots);
  require(static_cast<std::int64_t>(routing.weights.size()) == slots,
          "reference::{}: routing.weights has {} entries (rule: tokens * top_k "
          "= {} * {} = {})",
          function, routing.weights.size(), routing.tokens, routing.top_k, slots);
  for (std::int64_t slot = 0; slot < slots; ++slot) {
    const std::int32_t id = routing.expert_ids[static_cast<std::size_t>(slot)];
    require(id >= 0 && id < expert_count,
            "reference::{}: routing.expert_ids[{}] (token {}, choice {}) = {} "
            "(rule: 0 <= id < experts = {})",
            function, slot, slot / routing.top_k, slot % routing.top_k, id, expert_count);
    const float weight = routing.weights[static_cast<std::size_t>(slot)];
    require(std::isfinite(weight),
            "reference::{}: routing.weights[{}] (token {}, choice {}) = {} (rule: "
            "finite)",
            function, slot, slot / routing.top_k, slot % routing.top_k, weight);
  }
}

// The slots routed to expert e and the rows of `a_values` ([tokens, k]) they read, in slot
// order.
struct RoutedRows {
  std::vector<std::int64_t> slots;
  std::vector<double> rows;  // [slots.size(), k]
};
RoutedRows routed_rows(const MoeRouting& routing, std::int64_t e,
                       const std::vector<double>& a_values, std::int64_t k) {
  RoutedRows routed;
  const std::int64_t slots = routing.tokens * routing.top_k;
  for (std::int64_t slot = 0; slot < slots; ++slot)
    if (routing.expert_ids[static_cast<std::size_t>(slot)] == e) routed.slots.push_back(slot);
  routed.rows.resize(routed.slots.size() * static_cast<std::size_t>(k));
  for (std::size_t r = 0; r < routed.slots.size(); ++r)
    std::copy_n(a_values.begin() + routed.slots[r] / routing.top_k * k, k,
                routed.rows.begin() + static_cast<std::int64_t>(r) * k);
  return routed;
}

// out[t] = Σ_j weights[t·top_k + j] · slot_outputs[t·top_k + j] ([slots, n]) in choice order
// (the formula's order, whatever order the experts were visited in), rounded once to `output`.
std::vector<double> weighted_sum(const MoeRouting& routing,
                                 const std::vector<double>& slot_outputs, std::int64_t n,
                                 const Format& output) {
  std::vector<double> c(static_cast<std::size_t>(routing.tokens * n), 0.0);
  for (std::int64_t t = 0; t < routing.tokens; ++t)
    for (int choice = 0; choice < routing.top_k; ++choice) {
      const std::int64_t slot = t * routing.top_k + choice;
      const double weight = routing.weights[static_cast<std::size_t>(slot)];
      for (std::int64_t j = 0; j < n; ++j) c[t * n + j] += weight * slot_outputs[slot * n + j];
    }
  round_all_to(output, c);
  return c;
}

// The activation between an expert's GEMMs (qgemm/moe.hpp), in double.
double glu(const GluActivation& activation, double gate, double up) {
  switch (activation.kind) {
    case GluKind::Silu: return silu(gate) * up;
    case GluKind::Gelu: return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case GluKind::ClampedSwiglu: {
      const double limit = activation.limit;
      const double g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
      return g / (1.0 + std::exp(-static_cast<double>(activation.alpha) * g)) * (u + 1.0);
    }
  }
  return 0.0;
}

// Expert e's bias row as doubles (empty without a bias), every value finite.
std::vector<double> expert_bias(const float* bias, std::int64_t e, std::int64_t n,
                                const char* name) {
  if (bias == nullptr) return {};
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const float v = bias[e * n + j];
    require(std::isfinite(v), "reference::moe_layer: {}[{}][{}] = {} (rule: finite)", name, e, j,
            v);
    values[static_cast<std::size_t>(j)] = v;
  }
  return values;
}

}  // namespace

std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a, const PackedWeight& w,
                         const float* bias) {
  validate(scheme);
  require_operands_match("gemm", scheme, a, w.quant, w.k, "weight");
  std::vector<double> bias_values;
  if (bias != nullptr) {
    bias_values.resize(static_cast<std::size_t>(w.n));
    for (std::int64_t j = 0; j < w.n; ++j) {
      require(std::isfinite(bias[j]),
              "reference::gemm: bias[{}] = {} is not finite (rule: finite bias)", j, bias[j]);
      bias_values[static_cast<std::size_t>(j)] = bias[j];
    }
  }
  const std::vector<double> a_values = dequantize_activation(a);
  const std::vector<double> w_values = dequantize_weight(w);
  std::vector<double> c = matmul_nt(a_values.data(), w_values.data(), a.m, w.n, w.k,
                                    bias != nullptr ? bias_values.data() : nullptr);
  round_all_to(scheme.output, c);
  return c;
}

std::vector<double> moe(const Scheme& scheme, const PackedActivation& a,
                        const std::vector<PackedWeight>& experts, const MoeRouting& routing,
                        MoeActivation activation) {
  validate(scheme);
  require(!experts.empty(), "reference::moe: experts is empty (rule: at least one expert)");
  const std::int64_t expert_n = experts.front().n, k = experts.front().k;
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const PackedWeight& expert = experts[e];
    require_operands_match("moe", scheme, a, expert.quant, expert.k, fmt::format("expert {}", e));
    require(expert.n == expert_n,
            "reference::moe: expert {} has n = {} but expert 0 has n = {} (rule: "
            "every expert has the same shape)",
            e, expert.n, expert_n);
  }
  const bool gated = activation == MoeActivation::SiluGlu;
  require(!gated || expert_n % 2 == 0,
          "reference::moe: SiLU-GLU experts have n = {} rows (rule: an even number, "
          "gate rows 0..n/2-1 then up rows n/2..n-1)",
          expert_n);
  const std::int64_t out_n = gated ? expert_n / 2 : expert_n;

  const auto expert_count = static_cast<std::int64_t>(experts.size());
  check_routing("moe", routing, a.m, expert_count);
  const std::int64_t slots = routing.tokens * routing.top_k;

  const std::vector<double> a_values = dequantize_activation(a);
  // expert(a_t) for every (token, choice) slot, then the weighted sum in choice order: the
  // order of the formula, whatever order the experts are visited in.
  std::vector<double> slot_outputs(static_cast<std::size_t>(slots * out_n));
  for (std::int64_t e = 0; e < expert_count; ++e) {
    const RoutedRows routed = routed_rows(routing, e, a_values, k);
    if (routed.slots.empty()) continue;
    const auto rows = static_cast<std::int64_t>(routed.slots.size());
    const std::vector<double> w_values = dequantize_weight(experts[static_cast<std::size_t>(e)]);
    const std::vector<double> product =
        matmul_nt(routed.rows.data(), w_values.data(), rows, expert_n, k);
    for (std::int64_t r = 0; r < rows; ++r) {
      const double* row = product.data() + r * expert_n;
      double* out = slot_outputs.data() + routed.slots[static_cast<std::size_t>(r)] * out_n;
      for (std::int64_t j = 0; j < out_n; ++j)
        out[j] = gated ? silu(row[j]) * row[out_n + j] : row[j];
    }
  }
  return weighted_sum(routing, slot_outputs, out_n, scheme.output);
}

std::vector<double> moe_layer(const Scheme& scheme, const PackedActivation& a,
                              const std::vector<PackedWeight>& gate_up,
                              const std::vector<PackedWeight>& down, const MoeRouting& routing,
                              const GluActivation& activation, const Format& intermediate,
                              const float* gate_up_bias, const float* down_bias) {
  validate(scheme);
  require(!gate_up.empty() && gate_up.size() == down.size(),
          "reference::moe_layer: {} gate_up and {} down experts (rule: one or more, equal counts)",
          gate_up.size(), down.size());
  const auto expert_count = static_cast<std::int64_t>(gate_up.size());
  const std::int64_t h = a.k, inter = down.front().k;
  for (std::int64_t e = 0; e < expert_count; ++e) {
    const PackedWeight& up = gate_up[static_cast<std::size_t>(e)];
    const PackedWeight& dn = down[static_cast<std::size_t>(e)];
    require_operands_match("moe_layer", scheme, a, up.quant, up.k,
                           fmt::format("gate_up expert {}", e));
    require(up.n == 2 * inter && dn.n == h && dn.k == inter && dn.quant == scheme.weight,
            "reference::moe_layer: expert {}: gate_up {}x{}, down {}x{} (rule: gate_up [2I, H], "
            "down [H, I] with H = {}, I = {}, both quantized as the scheme)",
            e, up.n, up.k, dn.n, dn.k, h, inter);
  }
  check_routing("moe_layer", routing, a.m, expert_count);
  const std::int64_t slots = routing.tokens * routing.top_k;

  const std::vector<double> a_values = dequantize_activation(a);
  std::vector<double> slot_outputs(static_cast<std::size_t>(slots * h));
  for (std::int64_t e = 0; e < expert_count; ++e) {
    const RoutedRows routed = routed_rows(routing, e, a_values, h);
    if (routed.slots.empty()) continue;
    const auto rows = static_cast<std::int64_t>(routed.slots.size());
    const std::vector<double> up_bias = expert_bias(gate_up_bias, e, 2 * inter, "gate_up_bias");
    const std::vector<double> g =
        matmul_nt(routed.rows.data(), dequantize_weight(gate_up[static_cast<std::size_t>(e)]).data(),
                  rows, 2 * inter, h, up_bias.empty() ? nullptr : up_bias.data());
    std::vector<double> act(static_cast<std::size_t>(rows * inter));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < inter; ++j)
        act[static_cast<std::size_t>(r * inter + j)] = round_to(
            intermediate,
            glu(activation,
                round_to(intermediate, g[static_cast<std::size_t>(r * 2 * inter + j)]),
                round_to(intermediate, g[static_cast<std::size_t>(r * 2 * inter + inter + j)])));
    const std::vector<double> dn_bias = expert_bias(down_bias, e, h, "down_bias");
    const std::vector<double> y =
        matmul_nt(act.data(), dequantize_weight(down[static_cast<std::size_t>(e)]).data(), rows,
                  h, inter, dn_bias.empty() ? nullptr : dn_bias.data());
    for (std::int64_t r = 0; r < rows; ++r)
      std::copy_n(y.begin() + r * h, h,
                  slot_outputs.begin() + routed.slots[static_cast<std::size_t>(r)] * h);
  }
  return weighted_sum(routing, slot_outputs, h, scheme.output);
}

}  // namespace qgemm::reference
