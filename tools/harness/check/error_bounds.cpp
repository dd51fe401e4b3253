#include "check/error_bounds.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"
#include "quant/parallel.hpp"  // the quantizer's row-parallel loop, reused

namespace qgemm::check {
namespace {

// What the radius needs per code, computed once per code (elements and unquantized
// activations have at most 16 bits).
struct CodeSpacing {
  std::vector<double> half_step;       // half_ulp(format, decode(code)); NaN for non-values
  std::vector<std::int8_t> range_end;  // +1 the top of the range, -1 the bottom, 0 interior
};

CodeSpacing code_spacing(const Format& format) {
  require(format.bits <= 16,
          "error bounds: format {} has {} bits (rule: element formats of at most 16 "
          "bits)",
          format.name(), format.bits);
  const std::uint32_t count = format.code_count();
  CodeSpacing spacing;
  spacing.half_step.resize(count);
  spacing.range_end.resize(count);
  const double top = format.max_finite();
  const double bottom = format.is_integer() ? format.min_int : format.lowest();
  for (std::uint32_t code = 0; code < count; ++code) {
    const double value = is_valid_code(format, code) ? decode(format, code) : NAN;
    if (!std::isfinite(value)) {
      spacing.half_step[code] = NAN;  // a NaN/Inf code makes the bound NaN: the check fails
      continue;
    }
    spacing.half_step[code] = half_ulp(format, value);
    spacing.range_end[code] = value == top ? 1 : value == bottom ? -1 : 0;
  }
  return spacing;
}

// The scale grid's values, decoded from their little-endian codes (quant.hpp's layout).
std::vector<double> decode_scales(const Format& scale_format,
                                  const std::vector<std::uint8_t>& bytes, std::int64_t count,
                                  const char* tensor) {
  const int width = scale_format.storage_bytes();
  require(static_cast<std::int64_t>(bytes.size()) == count * width,
          "error bounds: the {} scales hold {} bytes (rule: {} scales of {} bytes)", tensor,
          bytes.size(), count, width);
  std::vector<double> scales(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    scales[static_cast<std::size_t>(i)] =
        decode(scale_format, read_code(bytes.data(), i, 8 * width));
  return scales;
}

// The radii of a packed [rows, cols] tensor whose element (r, c) has effective scale
// cell_scales[grid cell] · second_level (cell_scales empty: scale 1).
std::vector<double> radii(const Format& element, const std::vector<std::uint8_t>& codes,
                          std::int64_t row_bytes, const ScaleGrid& grid,
                          const std::vector<double>& cell_scales, double second_level,
                          std::int64_t rows, std::int64_t cols, const float* original,
                          const std::vector<double>& dequantized, const char* tensor) {
  require(original != nullptr, "error bounds: the original {} is null", tensor);
  require(static_cast<std::int64_t>(dequantized.size()) == rows * cols &&
              static_cast<std::int64_t>(codes.size()) == rows * row_bytes,
          "error bounds: the {} [{}, {}] has {} code bytes and {} dequantized values "
          "(rule: {} and {})",
          tensor, rows, cols, codes.size(), dequantized.size(), rows * row_bytes, rows * cols);
  require(grid.cols_per >= 1 && grid.rows_per >= 1,
          "error bounds: the {} scale grid covers {} x {} elements per scale (rule: "
          ">= 1)",
          tensor, grid.rows_per, grid.cols_per);
  const CodeSpacing spacing = code_spacing(element);
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  quant_detail::parallel_rows(rows, cols, [&](std::int64_t row_begin, std::int64_t row_end) {
    std::vector<std::uint32_t> row_codes(static_cast<std::size_t>(cols));
    for (std::int64_t r = row_begin; r < row_end; ++r) {
      unpack_codes(codes.data() + r * row_bytes, cols, element.bits, row_codes.data());
      // One grid cell (one scale) at a time along the row.
      for (std::int64_t cell_begin = 0; cell_begin < cols; cell_begin += grid.cols_per) {
        const std::int64_t cell_end = std::min(cols, cell_begin + grid.cols_per);
        double scale = second_level;
        if (!cell_scales.empty())
          scale *= cell_scales[static_cast<std::size_t>((r / grid.rows_per) * grid.cols +
                                                        cell_begin / grid.cols_per)];
        const double scale_magnitude = std::fabs(scale);
        for (std::int64_t c = cell_begin; c < cell_end; ++c) {
          const std::uint32_t code = row_codes[static_cast<std::size_t>(c)];
          const std::size_t index = static_cast<std::size_t>(r * cols + c);
          double radius = spacing.half_step[code] * scale_magnitude;
          if (const int end = spacing.range_end[code]; end != 0) {
            // Outward: beyond the top (end +1) or the bottom (end -1) in code space.
            const double error = static_cast<double>(original[index]) - dequantized[index];
            if (error * scale * end > 0) radius = std::fmax(radius, std::fabs(error));
          }
          out[index] = radius;
        }
      }
    }
  });
  return out;
}

}  // namespace

std::vector<double> weight_error_radii(const PackedWeight& weight, const float* original,
                                       const std::vector<double>& dequantized) {
  const ScaleGrid grid = weight.scale_grid();
  const std::vector<double> scales =
      decode_scales(weight.quant.scale_format, weight.scales, grid.count(), "weight");
  return radii(weight.quant.format, weight.codes, weight.row_bytes(), grid, scales,
               weight.global_scale, weight.n, weight.k, original, dequantized, "weight");
}

std::vector<double> activation_error_radii(const PackedActivation& activation,
                                           const float* original,
                                           const std::vector<double>& dequantized) {
  const ActivationQuant& quant = activation.quant;
  const ScaleGrid grid = activation.scale_grid();
  std::vector<double> scales;
  if (quant.is_quantized())
    scales = decode_scales(quant.scale_format, activation.scales, grid.count(), "activation");
  return radii(quant.format, activation.codes, activation.row_bytes(), grid, scales,
               quant.is_quantized() ? activation.tensor_scale : 1.0, activation.m, activation.k,
               original, dequantized, "activation");
}

double unit_roundoff(const Format& format) {
  return format.is_float() ? std::ldexp(1.0, -(format.mantissa_bits + 1)) : 0.0;
}

double output_rounding_bound(const Format& output, const std::vector<double>& rounded) {
  double sum = 0;
  for (double value : rounded) {
    const double half_step = half_ulp(output, value);
    sum += half_step * half_step;
  }
  return std::sqrt(sum);
}

std::vector<double> backend_error_bounds(const std::vector<double>& a, const std::vector<double>& w,
                                         const std::vector<double>& accumulated_w, std::int64_t m,
                                         std::int64_t n, std::int64_t k,
                                         const OperandRounding& rounding, const Format& output,
                                         const std::vector<double>& reference) {
  require(m >= 1 && n >= 1 && k >= 1, "backend_error_bounds: m = {}, n = {}, k = {} (rule: >= 1)",
          m, n, k);
  auto require_count = [](const char* what, std::size_t size, std::int64_t expected) {
    require(static_cast<std::int64_t>(size) == expected,
            "backend_error_bounds: {} holds {} values (rule: {})", what, size, expected);
  };
  require_count("a", a.size(), m * k);
  require_count("w", w.size(), n * k);
  require_count("accumulated_w", accumulated_w.size(), n * k);
  require_count("reference", reference.size(), m * n);
  constexpr double kLambda = 8.0;
  // The sums of squares are products too: Σ_k a_k²·w_k² = (A∘A)·(W∘W)ᵀ.
  auto squares = [](const std::vector<double>& x) {
    std::vector<double> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * x[i];
    return out;
  };
  const std::vector<double> a2 = squares(a);
  const std::vector<double> operand = reference::matmul_nt(a2.data(), squares(w).data(), m, n, k);
  const std::vector<double> accumulated =
      reference::matmul_nt(a2.data(), squares(accumulated_w).data(), m, n, k);
  const double operand_u2 =
      rounding.activation * rounding.activation + rounding.weight * rounding.weight;
  const double accumulated_u2 =
      static_cast<double>(k) * rounding.accumulator * rounding.accumulator;
  std::vector<double> bounds(reference.size());
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    const double magnitude = std::fabs(reference[i]);
    const double arithmetic =
        kLambda * std::sqrt(operand[i] * operand_u2 + accumulated[i] * accumulated_u2) +
        4.0 * rounding.accumulator * magnitude;
    bounds[i] = arithmetic + 2.0 * half_ulp(output, magnitude + arithmetic);
  }
  return bounds;
}

double frobenius_norm(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value * value;
  return std::sqrt(sum);
}

double frobenius_norm(const float* values, std::int64_t count) {
  double sum = 0;
  for (std::int64_t i = 0; i < count; ++i) sum += double{values[i]} * values[i];
  return std::sqrt(sum);
}

double frobenius_distance(const std::vector<double>& a, const std::vector<double>& b) {
  require(a.size() == b.size(), "frobenius_distance: sizes {} and {} differ", a.size(), b.size());
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(sum);
}

}  // namespace qgemm::check
