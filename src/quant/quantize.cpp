// quantize_weight / quantize_activation and their exact inverses (include/qgemm/quant.hpp):
// argument checks, then the scheme turned into a BlockRule for the one block quantizer.
#include <fmt/format.h>

#include <cmath>

#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "quant/block_quant.hpp"
#include "quant/parallel.hpp"

namespace qgemm {
namespace {

using quant_detail::BlockRule;
using quant_detail::ScaleRule;
using quant_detail::validate_weight;
using quant_detail::weight_rule;

void require_size(const char* function, const char* name, std::int64_t value) {
  require(value >= 1, "{}: {} = {} is not a valid size (rule: {} >= 1)", function, name, value,
          name);
}

void require_bytes(const char* function, const char* what, const PackedWeight& weight,
                   std::size_t actual, std::int64_t expected) {
  require(static_cast<std::int64_t>(actual) == expected,
          "{}: weight {} holds {} bytes, the shape [{}, {}] needs {} (rule: sizes "
          "match the scheme's packed form)",
          function, what, actual, weight.n, weight.k, expected);
}

// Scale rule of a scale format: e8m0 can only hold powers of two, so it takes the OCP MX
// shared-exponent rule; every other format holds amax / max rounded to nearest.
ScaleRule absmax_rule_for(const Format& scale_format) {
  return scale_format.specials == FloatSpecials::ExponentOnly && scale_format.is_float()
             ? ScaleRule::SharedExponent
             : ScaleRule::AbsMax;
}

BlockRule activation_rule(const ActivationQuant& quant, double static_scale, const char* function) {
  BlockRule rule;
  rule.element = quant.format;
  rule.scale_format = quant.scale_format;
  rule.second_level = quant.scaling == ActivationScaling::NV;
  rule.scale_rule = absmax_rule_for(quant.scale_format);
  if (quant.scaling == ActivationScaling::StaticTensor && static_scale > 0) {
    rule.scale_rule = ScaleRule::Fixed;
    rule.fixed_scale = static_scale;
  }
  rule.function = function;
  rule.tensor = "activation";
  return rule;
}

// The scheme's own validation (formats, groups dividing K), on a scheme that carries only
// the part being quantized.
void validate_activation(const ActivationQuant& quant, std::int64_t m, std::int64_t k) {
  Scheme scheme;
  scheme.weight.granularity = WeightGranularity::PerChannel;  // no constraint on K from here
  scheme.activation = quant;
  validate(scheme);
  validate_shape(scheme, m, 1, k);
}

}  // namespace

namespace quant_detail {

BlockRule weight_rule(const WeightQuant& quant, const char* function) {
  BlockRule rule;
  rule.element = quant.format;
  rule.scale_format = quant.scale_format;
  rule.zero_point = quant.zero_point;
  rule.second_level = quant.global_scale;
  // Ternary weights follow BitNet b1.58: absmax would send most weights to 0, the mean of |w|
  // keeps about two thirds of them at ±1.
  rule.scale_rule = quant.format == formats::ternary() && quant.zero_point == ZeroPoint::None
                        ? ScaleRule::AbsMean
                        : absmax_rule_for(quant.scale_format);
  rule.function = function;
  rule.tensor = "weight";
  return rule;
}

void validate_weight(const WeightQuant& quant, std::int64_t n, std::int64_t k) {
  Scheme scheme;
  scheme.weight = quant;
  validate(scheme);
  validate_shape(scheme, 1, n, k);
}

void check_packed_weight_metadata(const PackedWeight& weight, const char* function) {
  require_size(function, "n", weight.n);
  require_size(function, "k", weight.k);
  validate_weight(weight.quant, weight.n, weight.k);
  const ScaleGrid grid = weight.scale_grid();
  const int bits = weight.quant.format.bits;
  const std::int64_t scale_bytes = weight.quant.scale_format.storage_bytes();
  require_bytes(function, "scales", weight, weight.scales.size(), grid.count() * scale_bytes);
  if (weight.quant.zero_point == ZeroPoint::Integer)
    require_bytes(function, "zeros", weight, weight.zeros.size(),
                  grid.rows * packed_bytes(grid.cols, bits));
  else if (weight.quant.zero_point == ZeroPoint::Float)
    require_bytes(function, "zeros", weight, weight.zeros.size(), grid.count() * scale_bytes);
  require(std::isfinite(weight.global_scale) && weight.global_scale > 0,
          "{}: weight global_scale = {} (rule: positive and finite)", function,
          weight.global_scale);
}

}  // namespace quant_detail

PackedWeight quantize_weight(const WeightQuant& quant, const float* weight, std::int64_t n,
                             std::int64_t k) {
  constexpr const char* function = "quantize_weight";
  require_size(function, "n", n);
  require_size(function, "k", k);
  require(weight != nullptr, "quantize_weight: weight is null");
  validate_weight(quant, n, k);
  PackedWeight out;
  out.quant = quant;
  out.n = n;
  out.k = k;
  auto blocks = quant_detail::quantize_blocks(weight_rule(quant, function),
                                              weight_scale_grid(quant, n, k), weight, n, k);
  out.codes = std::move(blocks.codes);
  out.scales = std::move(blocks.scales);
  out.zeros = std::move(blocks.zeros);
  out.global_scale = blocks.second_level;
  return out;
}

void check_packed_weight(const PackedWeight& weight, const char* function) {
  quant_detail::check_packed_weight_metadata(weight, function);
  require_bytes(function, "codes", weight, weight.codes.size(), weight.n * weight.row_bytes());
}

std::vector<double> dequantize_weight(const PackedWeight& weight) {
  constexpr const char* function = "dequantize_weight";
  require_size(function, "n", weight.n);
  require_size(function, "k", weight.k);
  validate_weight(weight.quant, weight.n, weight.k);  // a bad group would divide by zero below
  return quant_detail::dequantize_blocks(weight_rule(weight.quant, function), weight.scale_grid(),
                                         weight.codes, weight.scales, weight.zeros,
                                         weight.global_scale, weight.n, weight.k);
}

PackedActivation quantize_activation(const ActivationQuant& quant, const float* activation,
                                     std::int64_t m, std::int64_t k, double static_scale) {
  constexpr const char* function = "quantize_activation";
  require_size(function, "m", m);
  require_size(function, "k", k);
  require(activation != nullptr, "quantize_activation: activation is null");
  validate_activation(quant, m, k);
  require(std::isfinite(static_scale),
          "quantize_activation: static_scale = {} is not finite (rule: a calibrated "
          "scale > 0, or <= 0 for this tensor's absmax)",
          static_scale);
  PackedActivation out;
  out.quant = quant;
  out.m = m;
  out.k = k;
  if (!quant.is_quantized()) {
    // fp16 / bf16 codes, rounded to nearest even. A finite input too large for the format would
    // become Inf, which no GEMM wants silently: it is rejected like Inf itself.
    const Format& format = quant.format;
    const int bits = format.bits;
    out.codes.resize(static_cast<std::size_t>(m * out.row_bytes()));
    quant_detail::parallel_rows(m, k, [&](std::int64_t begin, std::int64_t end) {
      std::vector<std::uint32_t> row_codes(static_cast<std::size_t>(k));
      for (std::int64_t r = begin; r < end; ++r) {
        for (std::int64_t c = 0; c < k; ++c) {
          const float v = activation[r * k + c];
          const std::uint32_t code = encode(format, v);
          if (!std::isfinite(v) || !std::isfinite(decode(format, code)))
            throw Error(ErrorCode::InvalidArgument,
                        fmt::format("quantize_activation: activation[{}, {}] = {} is not a "
                                    "finite {} value (rule: finite and |a| <= {})",
                                    r, c, v, format.name(), format.max_finite()));
          row_codes[static_cast<std::size_t>(c)] = code;
        }
        pack_codes(row_codes.data(), k, bits, out.codes.data() + r * out.row_bytes());
      }
    });
    return out;
  }
  auto blocks = quant_detail::quantize_blocks(activation_rule(quant, static_scale, function),
                                              activation_scale_grid(quant, m, k), activation, m, k);
  out.codes = std::move(blocks.codes);
  out.scales = std::move(blocks.scales);
  out.tensor_scale = blocks.second_level;
  return out;
}

std::vector<double> dequantize_activation(const PackedActivation& activation) {
  constexpr const char* function = "dequantize_activation";
  require_size(function, "m", activation.m);
  require_size(function, "k", activation.k);
  const ActivationQuant& quant = activation.quant;
  const std::int64_t m = activation.m, k = activation.k;
  validate_activation(quant, m, k);
  if (!quant.is_quantized()) {
    const std::int64_t row_bytes = activation.row_bytes();
    require(static_cast<std::int64_t>(activation.codes.size()) == m * row_bytes,
            "dequantize_activation: codes holds {} bytes, the shape [{}, {}] needs {} "
            "(rule: sizes match the packed form)",
            activation.codes.size(), m, k, m * row_bytes);
    std::vector<double> out(static_cast<std::size_t>(m * k));
    quant_detail::parallel_rows(m, k, [&](std::int64_t begin, std::int64_t end) {
      std::vector<std::uint32_t> row_codes(static_cast<std::size_t>(k));
      for (std::int64_t r = begin; r < end; ++r) {
        unpack_codes(activation.codes.data() + r * row_bytes, k, quant.format.bits,
                     row_codes.data());
        for (std::int64_t c = 0; c < k; ++c)
          out[static_cast<std::size_t>(r * k + c)] =
              decode(quant.format, row_codes[static_cast<std::size_t>(c)]);
      }
    });
    return out;
  }
  // The static scale is stored like every other scale (a 1 x 1 grid): Fixed vs AbsMax only
  // matters while quantizing.
  return quant_detail::dequantize_blocks(activation_rule(quant, 0.0, function),
                                         activation.scale_grid(), activation.codes,
                                         activation.scales, {}, activation.tensor_scale, m, k);
}

}  // namespace qgemm
