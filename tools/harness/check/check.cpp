#include "check/check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "check/error_bounds.hpp"
#include "common/log.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "quant/parallel.hpp"  // the quantizer's row-parallel loop, reused

namespace qgemm::check {
namespace {

constexpr double kWeightSigma = 0.02;  // typical of LLM linear layers
constexpr double kOutlierProbability = 1.0 / 512;
constexpr double kOutlierFactor = 8.0;  // the outliers that make group scaling matter
constexpr double kMinTimedMs = 200.0;   // time repeated runs for at least this long ...
constexpr int kMaxTimedRuns = 10;       // ... or this many, after the first run
constexpr double kSingleRunMs = 100.0;  // a first run this long is timed alone

struct RandomInputs {
  std::vector<float> activation;  // [m, k]
  std::vector<float> weight;      // [n, k]
};

// Fixed chunks, each with its own engine seeded from (seed, tensor, chunk): the values depend
// on the seed alone, not on how many threads drew them.
constexpr std::int64_t kDrawChunk = std::int64_t{1} << 16;

// N(0, sigma²), each value multiplied by `outlier_factor` with probability outlier_probability.
void fill_normal(std::vector<float>& values, std::uint64_t seed, std::uint32_t tensor, double sigma,
                 double outlier_probability, double outlier_factor) {
  const auto count = static_cast<std::int64_t>(values.size());
  const std::int64_t chunks = (count + kDrawChunk - 1) / kDrawChunk;
  quant_detail::parallel_rows(chunks, kDrawChunk, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t chunk = begin; chunk < end; ++chunk) {
      std::seed_seq sequence{static_cast<std::uint32_t>(seed),
                             static_cast<std::uint32_t>(seed >> 32), tensor,
                             static_cast<std::uint32_t>(chunk)};
      std::mt19937_64 rng(sequence);
      std::normal_distribution<double> normal(0.0, sigma);
      std::bernoulli_distribution outlier(outlier_probability);
      const std::int64_t stop = std::min(count, (chunk + 1) * kDrawChunk);
      for (std::int64_t i = chunk * kDrawChunk; i < stop; ++i) {
        double value = normal(rng);
        if (outlier_probability > 0 && outlier(rng)) value *= outlier_factor;
        values[static_cast<std::size_t>(i)] = static_cast<float>(value);
      }
    }
  });
}

RandomInputs draw_inputs(std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t seed) {
  RandomInputs inputs;
  inputs.weight.resize(static_cast<std::size_t>(n * k));
  fill_normal(inputs.weight, seed, 0, kWeightSigma, kOutlierProbability, kOutlierFactor);
  inputs.activation.resize(static_cast<std::size_t>(m * k));
  fill_normal(inputs.activation, seed, 1, 1.0, 0.0, 1.0);
  return inputs;
}

std::vector<double> to_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

std::vector<double> absolute(std::vector<double> values) {
  for (double& value : values) value = std::fabs(value);
  return values;
}

double root_sum_of_squares(const std::vector<double>& values) { return frobenius_norm(values); }

// Logs (QGEMM_LOG_LEVEL=3) how long each phase of a check took.
class PhaseTimer {
 public:
  void done(const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    log(LogLevel::Debug, "check: {} took {:.1f} ms", phase,
        std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

std::uint64_t fresh_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

CheckResult run_check(const Scheme& scheme, std::int64_t m, std::int64_t n, std::int64_t k,
                      GemmBackend& backend, std::uint64_t seed, const MatrixPlacement& placement) {
  validate(scheme);
  validate_shape(scheme, m, n, k);
  for (const auto& [name, value] :
       {std::pair{"a_pad", placement.a_pad}, std::pair{"a_offset", placement.a_offset},
        std::pair{"c_pad", placement.c_pad}, std::pair{"c_offset", placement.c_offset}})
    if (value < 0 || value > 4096)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("check: {} = {} (rule: 0 to 4096 elements)", name, value));
  backend.place(placement);
  CheckResult result;
  result.placement = placement;
  result.scheme = scheme;
  result.m = m;
  result.n = n;
  result.k = k;
  result.backend = backend.name();
  result.seed = seed;

  PhaseTimer timer;
  const RandomInputs inputs = draw_inputs(m, n, k, seed);
  timer.done("drawing inputs");
  const PackedActivation a = quantize_activation(scheme.activation, inputs.activation.data(), m, k);
  const PackedWeight w = quantize_weight(scheme.weight, inputs.weight.data(), n, k);
  timer.done("quantizing");
  result.packed_weight_bytes =
      static_cast<std::int64_t>(w.codes.size() + w.scales.size() + w.zeros.size());

  // The exact product of the unquantized inputs.
  const std::vector<double> exact = [&] {
    const std::vector<double> a_values = to_double(inputs.activation);
    const std::vector<double> w_values = to_double(inputs.weight);
    return reference::matmul_nt(a_values.data(), w_values.data(), m, n, k);
  }();
  timer.done("exact product");

  // The backend: a first run that is also the result, then timed runs if it was quick.
  using Clock = std::chrono::steady_clock;
  auto started = Clock::now();
  const std::vector<double> output = backend.gemm(scheme, a, w);
  double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  if (static_cast<std::int64_t>(output.size()) != m * n)
    throw Error(ErrorCode::Internal,
                fmt::format("check: backend {} returned {} values for C [{}, {}]", backend.name(),
                            output.size(), m, n));
  result.time_ms = first_ms;
  if (first_ms < kSingleRunMs) {
    int runs = 0;
    double total_ms = 0;
    while (runs < kMaxTimedRuns && total_ms < kMinTimedMs) {
      started = Clock::now();
      backend.gemm(scheme, a, w);
      total_ms += std::chrono::duration<double, std::milli>(Clock::now() - started).count();
      ++runs;
    }
    result.time_ms = total_ms / runs;
  }
  result.gflops = 2.0 * m * n * k / (result.time_ms * 1e6);
  timer.done("backend runs");

  const std::vector<double> reference_output = reference::gemm(scheme, a, w);
  const std::vector<double> a_values = dequantize_activation(a);
  const std::vector<double> w_values = dequantize_weight(w);
  timer.done("reference and dequantization");

  const double exact_norm = frobenius_norm(exact);
  const double reference_norm = frobenius_norm(reference_output);
  result.error_vs_exact = frobenius_distance(output, exact) / exact_norm;
  result.error_vs_reference = frobenius_distance(output, reference_output) / reference_norm;

  ErrorBudget& budget = result.budget;
  const double weight_norm = frobenius_norm(inputs.weight.data(), n * k);
  const double activation_norm = frobenius_norm(inputs.activation.data(), m * k);
  budget.weight =
      root_sum_of_squares(weight_error_radii(w, inputs.weight.data(), w_values)) / weight_norm;
  budget.activation =
      root_sum_of_squares(activation_error_radii(a, inputs.activation.data(), a_values)) /
      activation_norm;
  const double output_half_steps = output_rounding_bound(scheme.output, reference_output);
  budget.output = output_half_steps / exact_norm;
  budget.norm_ratio =
      activation_norm * weight_norm / (std::sqrt(static_cast<double>(k)) * exact_norm);
  budget.safety_factor = 1.25 + 3.0 / std::sqrt(static_cast<double>(m * n));

  if (!backend.is_reference()) {
    const BackendPrecision precision = backend.precision();
    const std::vector<double> a_magnitude = absolute(a_values), w_magnitude = absolute(w_values);
    const double magnitude_ratio =
        frobenius_norm(reference::matmul_nt(a_magnitude.data(), w_magnitude.data(), m, n, k)) /
        reference_norm;
    // δ: how far the backend's unrounded outputs may sit from the reference's (relative);
    // then two roundings of values δ apart differ (by up to two half-steps) only where a
    // rounding boundary falls between them, which happens with probability ~δ / step.
    const double deviation = 2.0 * unit_roundoff(precision.operand_format) +
                             2.0 * std::sqrt(static_cast<double>(k)) *
                                 unit_roundoff(precision.accumulator_format) * magnitude_ratio;
    const double relative_half_steps = output_half_steps / reference_norm;
    result.tolerance_vs_reference =
        budget.safety_factor * (deviation + std::sqrt(4.0 * relative_half_steps * deviation));
  }
  timer.done("error bounds");
  result.tolerance_vs_exact =
      budget.safety_factor * (budget.norm_ratio * (budget.weight + budget.activation +
                                                   budget.weight * budget.activation) +
                              budget.output) +
      result.tolerance_vs_reference;
  result.outside_writes = backend.outside_writes();
  // Written so that NaN anywhere fails.
  result.pass = result.error_vs_exact <= result.tolerance_vs_exact &&
                result.error_vs_reference <= result.tolerance_vs_reference &&
                result.outside_writes == 0;
  return result;
}

std::string to_json(const CheckResult& result) {
  nlohmann::json json;
  json["scheme"] = to_string(result.scheme);
  json["preset"] =
      result.scheme.name.empty() ? nlohmann::json(nullptr) : nlohmann::json(result.scheme.name);
  json["m"] = result.m;
  json["n"] = result.n;
  json["k"] = result.k;
  json["backend"] = result.backend;
  json["seed"] = result.seed;
  json["errors"] = {{"vs_exact", result.error_vs_exact},
                    {"vs_reference", result.error_vs_reference}};
  json["tolerances"] = {
      {"vs_exact", result.tolerance_vs_exact}, {"vs_reference", result.tolerance_vs_reference},
      {"weight_bound", result.budget.weight},  {"activation_bound", result.budget.activation},
      {"output_bound", result.budget.output},  {"safety_factor", result.budget.safety_factor},
      {"norm_ratio", result.budget.norm_ratio}};
  json["pass"] = result.pass;
  json["time_ms"] = result.time_ms;
  json["gflops"] = result.gflops;
  json["packed_weight_bytes"] = result.packed_weight_bytes;
  json["placement"] = {{"a_pad", result.placement.a_pad},
                       {"a_offset", result.placement.a_offset},
                       {"c_pad", result.placement.c_pad},
                       {"c_offset", result.placement.c_offset}};
  json["outside_writes"] = result.outside_writes;
  return json.dump();
}

}  // namespace qgemm::check
