// The block quantizer (see block_quant.hpp). Three passes, each parallel over rows:
//   1. statistics: min, max, Σ|x| of every (row, grid column) piece; rejects NaN/Inf
//   2. cells: reduce the pieces of each grid cell, derive its scale (and zero)
//   3. codes: encode each element with its cell's rounded scale, pack each row
#include "quant/block_quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "quant/parallel.hpp"

namespace qgemm::quant_detail {
namespace {

struct PieceStats {
  float min = std::numeric_limits<float>::infinity();
  float max = -std::numeric_limits<float>::infinity();
  double sum_abs = 0.0;
  std::int64_t count = 0;

  void merge(const PieceStats& other) {
    min = std::min(min, other.min);
    max = std::max(max, other.max);
    sum_abs += other.sum_abs;
    count += other.count;
  }
  double amax() const { return count == 0 ? 0.0 : std::max(std::fabs(min), std::fabs(max)); }
};

// What dequantization needs per cell: value = (decode(code) − zero) · scale · second_level.
struct CellQuant {
  double scale = 1.0;
  double zero = 0.0;
};

int floor_log2(double positive) {
  int exponent = 0;
  std::frexp(positive, &exponent);  // positive = f · 2^exponent, f in [0.5, 1): exact
  return exponent - 1;
}

// The element's code range as numbers: [min_int, max_int] for integers, [lowest, max] floats.
double element_low(const Format& element) {
  return element.is_integer() ? element.min_int : element.lowest();
}
double element_high(const Format& element) { return element.max_finite(); }
// Distinct integer steps of an integer element: 2^b − 1 for uint b, 2 for ternary.
double integer_levels(const Format& element) { return element.max_int - element.min_int; }

CellQuant cell_quant(const BlockRule& rule, const PieceStats& stats, double second_level) {
  const Format& element = rule.element;
  const Format& scale_format = rule.scale_format;
  CellQuant cell;
  const double amax = stats.amax();
  switch (rule.zero_point) {
    case ZeroPoint::None:
      switch (rule.scale_rule) {
        case ScaleRule::Fixed: cell.scale = finalize_scale(scale_format, rule.fixed_scale); break;
        case ScaleRule::AbsMean:
          cell.scale = finalize_scale(
              scale_format, stats.sum_abs /
                                static_cast<double>(std::max<std::int64_t>(1, stats.count)) /
                                second_level);
          break;
        case ScaleRule::SharedExponent: {
          const double scaled = amax / second_level;
          cell.scale = scaled > 0
                           ? finalize_scale(scale_format,
                                            std::ldexp(1.0, floor_log2(scaled) -
                                                                floor_log2(element_high(element))))
                           : finalize_scale(scale_format, 0.0);
          break;
        }
        case ScaleRule::AbsMax:
          cell.scale = finalize_scale(scale_format, amax / element_high(element) / second_level);
          break;
      }
      break;
    case ZeroPoint::Midpoint:
      cell.scale = finalize_scale(scale_format, amax / absmax_denominator(rule) / second_level);
      // The middle of the code range: 2^(b−1) for uint b (the zero is implied, not stored).
      cell.zero = std::floor((element.min_int + element.max_int + 1) / 2.0);
      break;
    case ZeroPoint::Integer: {
      // The range must contain 0: the zero is itself a code, so 0 is always representable.
      const double lo = std::min<double>(stats.count ? stats.min : 0.0, 0.0);
      const double hi = std::max<double>(stats.count ? stats.max : 0.0, 0.0);
      cell.scale = finalize_scale(scale_format, (hi - lo) / integer_levels(element) / second_level);
      cell.zero =
          std::clamp(std::nearbyint(element.min_int - lo / (cell.scale * second_level)),
                     static_cast<double>(element.min_int), static_cast<double>(element.max_int));
      break;
    }
    case ZeroPoint::Float: {
      // A float zero can sit anywhere, so [min, max] needs no widening to 0 (unless the cell is
      // constant, when the range would be empty).
      double lo = stats.count ? stats.min : 0.0, hi = stats.count ? stats.max : 0.0;
      if (!(hi > lo)) {
        lo = std::min(lo, 0.0);
        hi = std::max(hi, 0.0);
      }
      cell.scale = finalize_scale(scale_format, (hi - lo) / integer_levels(element) / second_level);
      const double zero = element.min_int - lo / (cell.scale * second_level);
      cell.zero = round_to(scale_format,
                           std::clamp(zero, -scale_format.max_finite(), scale_format.max_finite()));
      break;
    }
  }
  return cell;
}

// decode() of every code, for formats narrow enough to tabulate.
std::vector<double> decode_table(const Format& format) {
  std::vector<double> table(format.code_count());
  for (std::uint32_t code = 0; code < table.size(); ++code) table[code] = decode(format, code);
  return table;
}

void require_rule(const BlockRule& rule) {
  require(rule.scale_format.is_float(),
          "{}: scale format {} is not a floating format (rule: scales are fp32, "
          "fp16, bf16, e4m3, ue4m3 or e8m0)",
          rule.function, rule.scale_format.name());
  require(rule.element.bits <= 8 || rule.element.bits == 16 || rule.element.bits == 32,
          "{}: {} format {} has {} bits (rule: 1..8, 16 or 32)", rule.function, rule.tensor,
          rule.element.name(), rule.element.bits);
  if (rule.zero_point != ZeroPoint::None)
    require(rule.element.is_integer(),
            "{}: {} format {} has a zero point (rule: zero points need an integer "
            "format)",
            rule.function, rule.tensor, rule.element.name());
}

}  // namespace

// For zero-point rules half the integer levels, since [-amax, amax] then spans all of them.
// With a midpoint zero this is GPTQ's symmetric rule: every code is used and rounding stays
// within half a step up to the edges.
double absmax_denominator(const BlockRule& rule) {
  return rule.zero_point == ZeroPoint::None ? element_high(rule.element)
                                            : integer_levels(rule.element) / 2.0;
}

double run_sum_abs(const float* values, std::int64_t count) {
  // Lane i of the warp after the shuffle at `offset` holds t[i] + t[i ^ offset]; lane 0's
  // value is t[0] below (lanes at or past `offset` only feed the lower ones).
  double t[kSumRun];
  for (std::int64_t i = 0; i < kSumRun; ++i) t[i] = i < count ? std::fabs(double{values[i]}) : 0.0;
  for (std::int64_t offset = kSumRun / 2; offset > 0; offset /= 2)
    for (std::int64_t i = 0; i < offset; ++i) t[i] = t[i] + t[i + offset];
  return t[0];
}

double finalize_scale(const Format& scale_format, double raw) {
  if (!(raw > 0)) return round_to(scale_format, 1.0);
  if (std::isinf(raw)) return scale_format.max_finite();
  double scale = round_to(scale_format, raw);
  if (!(scale > 0)) return scale_format.min_positive();
  if (std::isinf(scale)) return scale_format.max_finite();
  return scale;
}

ElementEncoder::ElementEncoder(const Format& element)
    : element_(element),
      low_(element_low(element)),
      high_(element_high(element)),
      mask_(element.bits >= 32 ? 0xffffffffu : element.code_count() - 1) {
  // e8m0 rounds between powers of two by its own rule (see format.cpp): it keeps the codec.
  if (!element.is_float() || element.bits > 8 || element.specials == FloatSpecials::ExponentOnly)
    return;
  // Magnitudes of the non-negative codes 0, 1, 2, ... rise with the code up to the largest
  // finite one (sign-magnitude layout); the specials above it end the table.
  const std::uint32_t magnitude_codes =
      element.is_signed ? element.code_count() / 2 : element.code_count();
  std::vector<double> magnitudes;
  for (std::uint32_t code = 0; code < magnitude_codes; ++code) {
    const double value = decode(element, code);
    if (!std::isfinite(value)) break;
    if (!magnitudes.empty() && !(value > magnitudes.back())) return;  // not monotonic: codec
    magnitudes.push_back(value);
  }
  // Midpoints between neighbours (exact: the values have few significant bits), padded with
  // +inf to a power of two for a branch-free search.
  std::size_t padded = 1;
  while (padded < magnitudes.size()) padded *= 2;
  midpoints_.assign(padded, std::numeric_limits<double>::infinity());
  for (std::size_t i = 0; i + 1 < magnitudes.size(); ++i)
    midpoints_[i] = 0.5 * (magnitudes[i] + magnitudes[i + 1]);
  sign_bit_ = element.is_signed ? 1u << (element.bits - 1) : 0u;
}

std::uint32_t ElementEncoder::operator()(double x) const {
  x = std::clamp(x, low_, high_);  // saturate: never an Inf code, never a wrapped integer
  if (element_.is_integer())
    return static_cast<std::uint32_t>(static_cast<std::int64_t>(std::nearbyint(x))) & mask_;
  if (midpoints_.empty()) return encode(element_, x);
  // Round to nearest: the code is the number of midpoints below |x|. A tie (|x| on a midpoint)
  // goes to the even code, which is the even significand (the code's low bit is the
  // mantissa's low bit).
  const double magnitude = std::fabs(x);
  const std::uint32_t sign = std::signbit(x) ? sign_bit_ : 0u;
  std::size_t below = 0;
  for (std::size_t step = midpoints_.size() / 2; step > 0; step /= 2)
    below += midpoints_[below + step - 1] < magnitude ? step : 0;
  auto code = static_cast<std::uint32_t>(below);
  if (midpoints_[below] == magnitude && (code & 1u)) ++code;
  return sign | code;
}

QuantizedBlocks quantize_blocks(const BlockRule& rule, const ScaleGrid& grid, const float* data,
                                std::int64_t rows, std::int64_t cols) {
  require_rule(rule);
  require(data != nullptr, "{}: {} is null", rule.function, rule.tensor);
  const std::int64_t grid_cols = grid.cols;

  // Pass 1: per-(row, grid column) statistics; the first non-finite element is reported.
  std::vector<PieceStats> pieces(static_cast<std::size_t>(rows * grid_cols));
  std::atomic<std::int64_t> first_bad{std::numeric_limits<std::int64_t>::max()};
  parallel_rows(rows, cols, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const float* row = data + r * cols;
      for (std::int64_t j = 0; j < grid_cols; ++j) {
        PieceStats& piece = pieces[static_cast<std::size_t>(r * grid_cols + j)];
        const std::int64_t c_end = std::min(cols, (j + 1) * grid.cols_per);
        for (std::int64_t c = j * grid.cols_per; c < c_end; ++c) {
          const float v = row[c];
          if (!std::isfinite(v)) {
            std::int64_t index = r * cols + c, seen = first_bad.load();
            while (index < seen && !first_bad.compare_exchange_weak(seen, index)) {
            }
            return;  // this chunk's later rows cannot hold an earlier bad element
          }
          piece.min = std::min(piece.min, v);
          piece.max = std::max(piece.max, v);
        }
        // Σ|x| in the GPU quantizer's order (run_sum_abs); only absmean reads it.
        if (rule.scale_rule == ScaleRule::AbsMean)
          for (std::int64_t c = j * grid.cols_per; c < c_end; c += kSumRun)
            piece.sum_abs += run_sum_abs(row + c, std::min(kSumRun, c_end - c));
        piece.count = c_end - j * grid.cols_per;
      }
    }
  });
  if (const std::int64_t bad = first_bad.load(); bad != std::numeric_limits<std::int64_t>::max())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: {}[{}, {}] = {} is not finite (rule: NaN and Inf cannot be "
                            "quantized)",
                            rule.function, rule.tensor, bad / cols, bad % cols, data[bad]));

  // Pass 2: cells. The second-level factor maps the largest cell scale onto the scale format's
  // largest value (NVFP4: amax / (6 · 448)); when that is not a normal fp32 number (a wide
  // scale format, an all-zero tensor) the cells need no help and it is 1.
  QuantizedBlocks out;
  if (rule.second_level) {
    double tensor_amax = 0.0;
    for (const PieceStats& piece : pieces) tensor_amax = std::max(tensor_amax, piece.amax());
    const double factor = round_to(
        formats::fp32, tensor_amax / (absmax_denominator(rule) * rule.scale_format.max_finite()));
    const bool usable = factor >= std::numeric_limits<float>::min() && std::isfinite(factor);
    out.second_level = usable ? factor : 1.0;
  }
  std::vector<CellQuant> cells(static_cast<std::size_t>(grid.count()));
  parallel_rows(grid.rows, grid.cols * grid.rows_per, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t r_end = std::min(rows, (i + 1) * grid.rows_per);
      for (std::int64_t j = 0; j < grid_cols; ++j) {
        PieceStats cell_stats;
        for (std::int64_t r = i * grid.rows_per; r < r_end; ++r)
          cell_stats.merge(pieces[static_cast<std::size_t>(r * grid_cols + j)]);
        cells[static_cast<std::size_t>(i * grid_cols + j)] =
            cell_quant(rule, cell_stats, out.second_level);
      }
    }
  });

  // Scales (and float zeros) as codes of the scale format, storage_bytes() each, little-endian:
  // exactly pack_codes at 8 · storage_bytes() bits.
  const int scale_bits = 8 * rule.scale_format.storage_bytes();
  std::vector<std::uint32_t> scale_codes(cells.size());
  for (std::size_t c = 0; c < cells.size(); ++c)
    scale_codes[c] = encode(rule.scale_format, cells[c].scale);
  out.scales.resize(cells.size() * static_cast<std::size_t>(rule.scale_format.storage_bytes()));
  pack_codes(scale_codes.data(), grid.count(), scale_bits, out.scales.data());
  if (rule.zero_point == ZeroPoint::Float) {
    for (std::size_t c = 0; c < cells.size(); ++c)
      scale_codes[c] = encode(rule.scale_format, cells[c].zero);
    out.zeros.resize(out.scales.size());
    pack_codes(scale_codes.data(), grid.count(), scale_bits, out.zeros.data());
  } else if (rule.zero_point == ZeroPoint::Integer) {
    const std::int64_t zero_row_bytes = packed_bytes(grid_cols, rule.element.bits);
    out.zeros.resize(static_cast<std::size_t>(grid.rows * zero_row_bytes));
    ElementEncoder encode_zero(rule.element);
    for (std::size_t c = 0; c < cells.size(); ++c) scale_codes[c] = encode_zero(cells[c].zero);
    for (std::int64_t i = 0; i < grid.rows; ++i)
      pack_codes(scale_codes.data() + i * grid_cols, grid_cols, rule.element.bits,
                 out.zeros.data() + i * zero_row_bytes);
  }

  // Pass 3: codes, one packed row at a time.
  const std::int64_t row_bytes = packed_bytes(cols, rule.element.bits);
  out.codes.resize(static_cast<std::size_t>(rows * row_bytes));
  const ElementEncoder encode_element(rule.element);
  parallel_rows(rows, cols, [&](std::int64_t begin, std::int64_t end) {
    std::vector<std::uint32_t> row_codes(static_cast<std::size_t>(cols));
    for (std::int64_t r = begin; r < end; ++r) {
      const float* row = data + r * cols;
      const CellQuant* cell_row = cells.data() + (r / grid.rows_per) * grid_cols;
      for (std::int64_t j = 0; j < grid_cols; ++j) {
        const double divisor = cell_row[j].scale * out.second_level;
        const double zero = cell_row[j].zero;
        const std::int64_t c_end = std::min(cols, (j + 1) * grid.cols_per);
        for (std::int64_t c = j * grid.cols_per; c < c_end; ++c)
          row_codes[static_cast<std::size_t>(c)] = encode_element(row[c] / divisor + zero);
      }
      pack_codes(row_codes.data(), cols, rule.element.bits, out.codes.data() + r * row_bytes);
    }
  });
  return out;
}

std::vector<double> dequantize_blocks(const BlockRule& rule, const ScaleGrid& grid,
                                      const std::vector<std::uint8_t>& codes,
                                      const std::vector<std::uint8_t>& scales,
                                      const std::vector<std::uint8_t>& zeros, double second_level,
                                      std::int64_t rows, std::int64_t cols) {
  require_rule(rule);
  const int bits = rule.element.bits;
  const std::int64_t row_bytes = packed_bytes(cols, bits);
  const int scale_bytes = rule.scale_format.storage_bytes();
  auto require_size = [&](const char* what, std::size_t actual, std::int64_t expected) {
    require(static_cast<std::int64_t>(actual) == expected,
            "{}: {} holds {} bytes, the shape [{}, {}] needs {} (rule: sizes match "
            "the scheme's packed form)",
            rule.function, what, actual, rows, cols, expected);
  };
  require_size("codes", codes.size(), rows * row_bytes);
  require_size("scales", scales.size(), grid.count() * scale_bytes);
  const std::int64_t zero_row_bytes = packed_bytes(grid.cols, bits);
  if (rule.zero_point == ZeroPoint::Integer)
    require_size("zeros", zeros.size(), grid.rows * zero_row_bytes);
  else if (rule.zero_point == ZeroPoint::Float)
    require_size("zeros", zeros.size(), grid.count() * scale_bytes);
  require(std::isfinite(second_level) && second_level > 0,
          "{}: second-level scale {} is not a positive finite number", rule.function, second_level);

  std::vector<CellQuant> cells(static_cast<std::size_t>(grid.count()));
  std::vector<std::uint32_t> unpacked(cells.size());
  unpack_codes(scales.data(), grid.count(), 8 * scale_bytes, unpacked.data());
  for (std::size_t c = 0; c < cells.size(); ++c)
    cells[c].scale = decode(rule.scale_format, unpacked[c]);
  if (rule.zero_point == ZeroPoint::Midpoint) {
    for (CellQuant& cell : cells)
      cell.zero = std::floor((rule.element.min_int + rule.element.max_int + 1) / 2.0);
  } else if (rule.zero_point == ZeroPoint::Float) {
    unpack_codes(zeros.data(), grid.count(), 8 * scale_bytes, unpacked.data());
    for (std::size_t c = 0; c < cells.size(); ++c)
      cells[c].zero = decode(rule.scale_format, unpacked[c]);
  } else if (rule.zero_point == ZeroPoint::Integer) {
    for (std::int64_t i = 0; i < grid.rows; ++i)
      unpack_codes(zeros.data() + i * zero_row_bytes, grid.cols, bits,
                   unpacked.data() + i * grid.cols);
    for (std::size_t c = 0; c < cells.size(); ++c)
      cells[c].zero = decode(rule.element, unpacked[c]);
  }

  const std::vector<double> table = bits <= 16 ? decode_table(rule.element) : std::vector<double>{};
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  parallel_rows(rows, cols, [&](std::int64_t begin, std::int64_t end) {
    std::vector<std::uint32_t> row_codes(static_cast<std::size_t>(cols));
    for (std::int64_t r = begin; r < end; ++r) {
      unpack_codes(codes.data() + r * row_bytes, cols, bits, row_codes.data());
      const CellQuant* cell_row = cells.data() + (r / grid.rows_per) * grid.cols;
      double* out_row = out.data() + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        const CellQuant& cell = cell_row[c / grid.cols_per];
        const std::uint32_t code = row_codes[static_cast<std::size_t>(c)];
        const double value = table.empty() ? decode(rule.element, code) : table[code];
        out_row[c] = (value - cell.zero) * cell.scale * second_level;
      }
    }
  });
  return out;
}

}  // namespace qgemm::quant_detail
