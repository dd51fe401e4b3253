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

  // Routing: sizes first, then every id and weight, naming the first bad entry.
  require(routing.tokens == a.m,
          "reference::moe: routing.tokens = {} but the activation has m = {} rows "
          "(rule: one routing entry per token)",
          routing.tokens, a.m);
  require(routing.top_k >= 1, "reference::moe: routing.top_k = {} (rule: top_k >= 1)",
          routing.top_k);
  const std::int64_t slots = routing.tokens * routing.top_k;
  require(static_cast<std::int64_t>(routing.expert_ids.size()) == slots,
          "reference::moe: routing.expert_ids has {} entries (rule: tokens * top_k "
          "= {} * {} = {})",
          routing.expert_ids.size(), routing.tokens, routing.top_k, slots);
  require(static_cast<std::int64_t>(routing.weights.size()) == slots,
          "reference::moe: routing.weights has {} entries (rule: tokens * top_k "
          "= {} * {} = {})",
          routing.weights.size(), routing.tokens, routing.top_k, slots);
  const auto expert_count = static_cast<std::int64_t>(experts.size());
  for (std::int64_t slot = 0; slot < slots; ++slot) {
    const std::int32_t id = routing.expert_ids[static_cast<std::size_t>(slot)];
    require(id >= 0 && id < expert_count,
            "reference::moe: routing.expert_ids[{}] (token {}, choice {}) = {} "
            "(rule: 0 <= id < experts = {})",
            slot, slot / routing.top_k, slot % routing.top_k, id, expert_count);
    const float weight = routing.weights[static_cast<std::size_t>(slot)];
    require(std::isfinite(weight),
            "reference::moe: routing.weights[{}] (token {}, choice {}) = {} (rule: "
            "finite)",
            slot, slot / routing.top_k, slot % routing.top_k, weight);
  }

  const std::vector<double> a_values = dequantize_activation(a);
  // expert(a_t) for every (token, choice) slot, then the weighted sum in choice order: the
  // order of the formula, whatever order the experts are visited in.
  std::vector<double> slot_outputs(static_cast<std::size_t>(slots * out_n));
  for (std::int64_t e = 0; e < expert_count; ++e) {
    std::vector<std::int64_t> routed_slots;
    for (std::int64_t slot = 0; slot < slots; ++slot)
      if (routing.expert_ids[static_cast<std::size_t>(slot)] == e) routed_slots.push_back(slot);
    if (routed_slots.empty()) continue;
    const auto rows = static_cast<std::int64_t>(routed_slots.size());
    std::vector<double> gathered(static_cast<std::size_t>(rows * k));
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t token = routed_slots[static_cast<std::size_t>(r)] / routing.top_k;
      std::copy_n(a_values.begin() + token * k, k, gathered.begin() + r * k);
    }
    const std::vector<double> w_values = dequantize_weight(experts[static_cast<std::size_t>(e)]);
    const std::vector<double> product =
        matmul_nt(gathered.data(), w_values.data(), rows, expert_n, k);
    for (std::int64_t r = 0; r < rows; ++r) {
      const double* row = product.data() + r * expert_n;
      double* out = slot_outputs.data() + routed_slots[static_cast<std::size_t>(r)] * out_n;
      for (std::int64_t j = 0; j < out_n; ++j)
        out[j] = gated ? silu(row[j]) * row[out_n + j] : row[j];
    }
  }
  std::vector<double> c(static_cast<std::size_t>(routing.tokens * out_n), 0.0);
  for (std::int64_t t = 0; t < routing.tokens; ++t) {
    double* out = c.data() + t * out_n;
    for (int choice = 0; choice < routing.top_k; ++choice) {
      const std::int64_t slot = t * routing.top_k + choice;
      const double weight = routing.weights[static_cast<std::size_t>(slot)];
      const double* expert_out = slot_outputs.data() + slot * out_n;
      for (std::int64_t j = 0; j < out_n; ++j) out[j] += weight * expert_out[j];
    }
  }
  round_all_to(scheme.output, c);
  return c;
}

}  // namespace qgemm::reference
