// Host quantizer, packer and dequantizer (include/qgemm/quant.hpp).
//
// Every expectation here is computed independently of src/quant: bit layouts by a bit-at-a-time
// packer and hand-written bytes, scales by re-deriving each scheme rule from its definition
// (amax loops, std::ilogb for the MX exponent, the NVFP4 constants 6 and 448 written out),
// error bounds from the format's half spacing. Only the format codec (round_to, half_ulp) and
// the scheme's scale grids are shared, as the units those rules are defined in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "quant/block_quant.hpp"

namespace qgemm {
namespace {

// A fresh seed per test, printed with every failure.
struct SeededRandom {
  std::uint64_t seed = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  std::mt19937_64 engine{seed};
  std::string trace() const { return "seed " + std::to_string(seed); }
};

// Gaussian rows with magnitudes spread over five decades, so scales differ between cells.
std::vector<float> random_matrix(std::mt19937_64& engine, std::int64_t rows, std::int64_t cols) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> log_sigma(-3.0, 2.0);
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const double sigma = std::exp(log_sigma(engine) * std::log(10.0) / 2.0);
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(r * cols + c)] = static_cast<float>(sigma * normal(engine));
  }
  return out;
}

// Expects `action` to throw qgemm::Error whose message holds every fragment.
template <class Action>
void expect_error(Action&& action, std::initializer_list<std::string> fragments) {
  try {
    action();
    ADD_FAILURE() << "no error was thrown";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
          << "message '" << error.what() << "' lacks '" << fragment << "'";
  }
}

// ---------------------------------------------------------------------------------------------
// Packing

// The canonical order spelled out one bit at a time: bit t of element j is bit (j·bits + t) of
// the run, i.e. bit (p mod 8) of byte p / 8.
std::vector<std::uint8_t> pack_bit_by_bit(const std::vector<std::uint32_t>& codes, int bits) {
  std::vector<std::uint8_t> out((codes.size() * bits + 7) / 8, 0);
  for (std::size_t j = 0; j < codes.size(); ++j)
    for (int t = 0; t < bits; ++t) {
      const std::size_t p = j * bits + t;
      if ((codes[j] >> t) & 1u) out[p / 8] |= static_cast<std::uint8_t>(1u << (p % 8));
    }
  return out;
}

TEST(QuantPack, HeaderExamplesByHand) {
  // bits = 4, row "a b c d": byte 0 = b<<4 | a, byte 1 = d<<4 | c
  const std::uint32_t four[] = {0x1, 0x2, 0x3, 0xF};
  std::uint8_t packed4[2] = {};
  pack_codes(four, 4, 4, packed4);
  EXPECT_EQ(packed4[0], 0x21);
  EXPECT_EQ(packed4[1], 0xF3);

  // bits = 3, row "a b c" = 101, 011, 110:
  //   byte 0 = c[1:0]<<6 | b<<3 | a = 10 011 101 = 0x9D, byte 1 = c[2] = 1
  const std::uint32_t three[] = {0b101, 0b011, 0b110};
  std::uint8_t packed3[2] = {0xEE, 0xEE};
  pack_codes(three, 3, 3, packed3);
  EXPECT_EQ(packed3[0], 0x9D);
  EXPECT_EQ(packed3[1], 0x01);  // pad bits are 0
  EXPECT_EQ(read_code(packed3, 2, 3), 0b110u);

  // bits = 16: little-endian bytes.
  const std::uint32_t wide[] = {0x1234, 0xBEEF};
  std::uint8_t packed16[4] = {};
  pack_codes(wide, 2, 16, packed16);
  EXPECT_EQ(packed16[0], 0x34);
  EXPECT_EQ(packed16[1], 0x12);
  EXPECT_EQ(packed16[2], 0xEF);
  EXPECT_EQ(packed16[3], 0xBE);

  // bits = 1: element j is bit j.
  const std::uint32_t ones[] = {1, 0, 0, 1, 1, 0, 1, 0, 1};
  std::uint8_t packed1[2] = {};
  pack_codes(ones, 9, 1, packed1);
  EXPECT_EQ(packed1[0], 0b01011001);
  EXPECT_EQ(packed1[1], 0b1);
}

TEST(QuantPack, RoundTripsEveryWidthWithOddCounts) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  std::uniform_int_distribution<std::int64_t> odd_half(0, 600);
  for (int bits : {1, 2, 3, 4, 5, 6, 7, 8, 16, 32}) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{3}, std::int64_t{7}, std::int64_t{13},
                               std::int64_t{101}, 2 * odd_half(random.engine) + 1}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " count " + std::to_string(count));
      std::uniform_int_distribution<std::uint64_t> code_of(
          1, bits == 32 ? 0xffffffffull : (1ull << bits) - 1);
      std::vector<std::uint32_t> codes(static_cast<std::size_t>(count));
      for (auto& code : codes) code = static_cast<std::uint32_t>(code_of(random.engine));

      const std::vector<std::uint8_t> expected = pack_bit_by_bit(codes, bits);
      // Guard bytes after the run must stay untouched.
      std::vector<std::uint8_t> packed(expected.size() + 8, 0xA5);
      pack_codes(codes.data(), count, bits, packed.data());
      ASSERT_TRUE(std::equal(expected.begin(), expected.end(), packed.begin()));
      for (std::size_t g = expected.size(); g < packed.size(); ++g) ASSERT_EQ(packed[g], 0xA5);

      std::vector<std::uint32_t> unpacked(codes.size(), 0xDEADBEEF);
      unpack_codes(packed.data(), count, bits, unpacked.data());
      ASSERT_EQ(unpacked, codes);
      for (std::int64_t j = 0; j < count; ++j)
        ASSERT_EQ(read_code(packed.data(), j, bits), codes[static_cast<std::size_t>(j)])
            << "index " << j;
    }
  }
}

TEST(QuantPack, RejectsBadWidthsAndWideCodes) {
  const std::uint32_t codes[] = {1, 2, 9};
  std::uint8_t out[16] = {};
  for (int bits : {0, 9, 12, 33})
    expect_error([&] { pack_codes(codes, 3, bits, out); },
                 {"bits = " + std::to_string(bits), "1..8, 16 or 32"});
  expect_error([&] { unpack_codes(out, 3, 0, nullptr); }, {"bits = 0"});
  expect_error([&] { pack_codes(codes, -1, 4, out); }, {"count = -1"});
  expect_error([&] { pack_codes(codes, 3, 3, out); }, {"codes[2] = 9", "3 bits"});
}

// ---------------------------------------------------------------------------------------------
// The quantizer's element encoder (a table search for narrow floats) against the format codec:
// every value, every midpoint between neighbours (the ties), just beside them, and random
// values, both signs, plus out-of-range values that must saturate.
TEST(QuantEncoder, MatchesTheCodecWithSaturation) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  std::vector<Format> formats_to_check;
  for (const Format& f : named_formats())
    if (f.bits <= 8 && !(f == formats::e8m0)) formats_to_check.push_back(f);
  for (const char* name : {"fp8_e2m5", "fp7_e3m3", "fp5_e2m2", "fp6_e4m1", "fp8_e6m1_fn"})
    formats_to_check.push_back(parse_format(name));
  for (const Format& f : formats_to_check) {
    SCOPED_TRACE(f.name());
    const quant_detail::ElementEncoder encoder(f);
    const double low = f.is_integer() ? f.min_int : f.lowest(), high = f.max_finite();
    auto expect_same = [&](double x) {
      ASSERT_EQ(encoder(x), encode(f, std::clamp(x, low, high))) << "x = " << x;
    };
    std::vector<double> values;
    for (std::uint32_t code = 0; code < f.code_count(); ++code) {
      const double v = decode(f, code);
      if (std::isfinite(v) && is_valid_code(f, code)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    for (std::size_t i = 0; i < values.size(); ++i) {
      expect_same(values[i]);
      if (i + 1 == values.size()) break;
      const double mid = 0.5 * (values[i] + values[i + 1]);
      expect_same(mid);
      expect_same(std::nextafter(mid, -INFINITY));
      expect_same(std::nextafter(mid, INFINITY));
    }
    std::uniform_real_distribution<double> spread(-1.2 * high, 1.2 * high);
    for (int i = 0; i < 2000; ++i) expect_same(spread(random.engine));
    expect_same(10 * high);
    expect_same(-10 * high);
    expect_same(-0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// The rules, re-derived: what every cell's scale and zero must be.

struct TestRule {
  Format element;
  Format scale_format;
  ZeroPoint zero_point = ZeroPoint::None;
  bool absmean = false;       // ternary
  bool nvfp4_global = false;  // second-level fp32 scale amax / (6 · 448)
  double static_scale = 0;    // > 0: the one given scale
  ScaleGrid grid;
};

TestRule rule_of(const WeightQuant& q, std::int64_t n, std::int64_t k) {
  TestRule rule{q.format, q.scale_format, q.zero_point};
  rule.absmean = q.format == formats::ternary();
  rule.nvfp4_global = q.global_scale;
  rule.grid = weight_scale_grid(q, n, k);
  return rule;
}

TestRule rule_of(const ActivationQuant& q, std::int64_t m, std::int64_t k, double static_scale) {
  TestRule rule{q.format, q.scale_format};
  rule.nvfp4_global = q.scaling == ActivationScaling::NV;
  if (q.scaling == ActivationScaling::StaticTensor) rule.static_scale = static_scale;
  rule.grid = activation_scale_grid(q, m, k);
  return rule;
}

struct Cell {
  double scale = 1, zero = 0;
  double min = 0, max = 0;  // of the cell's inputs
};

struct Expectation {
  std::vector<Cell> cells;
  double global = 1;
  std::vector<double> values;  // the exact dequantized matrix the rules imply
  std::vector<double> bounds;  // per element: the largest |x − dequant(x)| the format allows
};

double code_low(const Format& f) { return f.is_integer() ? f.min_int : -f.max_finite(); }

Expectation expect_quantized(const TestRule& rule, const std::vector<float>& x, std::int64_t rows,
                             std::int64_t cols) {
  const ScaleGrid& grid = rule.grid;
  Expectation e;
  if (rule.nvfp4_global) {
    double tensor_amax = 0;
    for (float v : x) tensor_amax = std::max(tensor_amax, std::fabs(double{v}));
    e.global = static_cast<float>(tensor_amax / (6.0 * 448.0));
  }
  const double levels = rule.element.max_int - rule.element.min_int;  // integers only
  const double elem_max = rule.element.max_finite();
  e.cells.resize(static_cast<std::size_t>(grid.count()));
  for (std::int64_t i = 0; i < grid.rows; ++i)
    for (std::int64_t j = 0; j < grid.cols; ++j) {
      Cell& cell = e.cells[static_cast<std::size_t>(i * grid.cols + j)];
      double amax = 0, sum_abs = 0, count = 0;
      cell.min = INFINITY;
      cell.max = -INFINITY;
      for (std::int64_t r = i * grid.rows_per; r < std::min(rows, (i + 1) * grid.rows_per); ++r)
        for (std::int64_t c = j * grid.cols_per; c < std::min(cols, (j + 1) * grid.cols_per); ++c) {
          const double v = x[static_cast<std::size_t>(r * cols + c)];
          amax = std::max(amax, std::fabs(v));
          sum_abs += std::fabs(v);
          count += 1;
          cell.min = std::min(cell.min, v);
          cell.max = std::max(cell.max, v);
        }
      const Format& sf = rule.scale_format;
      // include/qgemm/quant.hpp: a scale that underflows the scale format takes its smallest
      // positive value (an all-zero cell is handled by the callers' data: it never occurs here).
      auto round_scale = [&](double value) {
        const double rounded = round_to(sf, value);
        if (rounded != 0.0 || !(value > 0.0)) return rounded;
        double smallest = INFINITY;
        for (std::uint32_t code = 0; code < sf.code_count(); ++code)
          if (is_valid_code(sf, code) && decode(sf, code) > 0)
            smallest = std::min(smallest, decode(sf, code));
        return smallest;
      };
      switch (rule.zero_point) {
        case ZeroPoint::None:
          if (rule.static_scale > 0)
            cell.scale = round_to(sf, rule.static_scale);
          else if (rule.absmean)
            cell.scale = round_to(sf, sum_abs / count);
          else if (sf == formats::e8m0)  // OCP MX: shared exponent
            cell.scale = std::ldexp(1.0, std::ilogb(amax) - std::ilogb(elem_max));
          else
            cell.scale = round_scale(amax / elem_max / e.global);
          break;
        case ZeroPoint::Midpoint:
          cell.scale = round_to(sf, 2 * amax / levels);
          cell.zero = std::ldexp(1.0, rule.element.bits - 1);
          break;
        case ZeroPoint::Integer: {
          const double lo = std::min(cell.min, 0.0), hi = std::max(cell.max, 0.0);
          cell.scale = round_to(sf, (hi - lo) / levels);
          cell.zero = std::clamp(std::nearbyint(-lo / cell.scale), 0.0, levels);
          break;
        }
        case ZeroPoint::Float:
          cell.scale = round_to(sf, (cell.max - cell.min) / levels);
          cell.zero = round_to(sf, -cell.min / cell.scale);
          break;
      }
    }
  e.values.resize(x.size());
  e.bounds.resize(x.size());
  const double low = code_low(rule.element), high = elem_max;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const Cell& cell =
          e.cells[static_cast<std::size_t>((r / grid.rows_per) * grid.cols + c / grid.cols_per)];
      const std::size_t at = static_cast<std::size_t>(r * cols + c);
      const double step = cell.scale * e.global;
      const double code_space = x[at] / step + cell.zero;
      const double clamped = std::clamp(code_space, low, high);
      e.values[at] = (round_to(rule.element, clamped) - cell.zero) * cell.scale * e.global;
      // Rounding inside the range costs at most half a spacing; outside, the distance to the
      // range (saturation) on top.
      e.bounds[at] = step * (half_ulp(rule.element, clamped) + std::fabs(code_space - clamped));
    }
  return e;
}

double stored_value(const Format& format, const std::vector<std::uint8_t>& bytes,
                    std::size_t index) {
  const int width = format.storage_bytes();
  std::uint32_t code = 0;
  for (int b = 0; b < width; ++b)
    code |= static_cast<std::uint32_t>(bytes.at(index * width + b)) << (8 * b);
  return decode(format, code);
}

// Stored scales (and zeros) must be the re-derived ones, and the dequantized matrix must be the
// rules' exact result, within the format's bound of the input.
void check_weight(const PackedWeight& packed, const std::vector<float>& w, const Expectation& e) {
  const WeightQuant& q = packed.quant;
  const ScaleGrid grid = packed.scale_grid();
  ASSERT_EQ(packed.scales.size(), grid.count() * q.scale_format.storage_bytes());
  EXPECT_EQ(packed.global_scale, e.global);
  for (std::int64_t c = 0; c < grid.count(); ++c) {
    ASSERT_EQ(stored_value(q.scale_format, packed.scales, c), e.cells[c].scale) << "cell " << c;
    if (q.zero_point == ZeroPoint::Float)
      ASSERT_EQ(stored_value(q.scale_format, packed.zeros, c), e.cells[c].zero) << "cell " << c;
    if (q.zero_point == ZeroPoint::Integer) {
      const std::int64_t zero_row_bytes = (grid.cols * q.format.bits + 7) / 8;
      ASSERT_EQ(read_code(packed.zeros.data() + (c / grid.cols) * zero_row_bytes, c % grid.cols,
                          q.format.bits),
                e.cells[c].zero)
          << "cell " << c;
    }
  }
  const std::vector<double> dequantized = dequantize_weight(packed);
  ASSERT_EQ(dequantized.size(), w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(dequantized[i], e.values[i]) << "element " << i << " = " << w[i];
    ASSERT_LE(std::fabs(w[i] - dequantized[i]), e.bounds[i] * (1 + 1e-12)) << "element " << i;
  }
}

double frobenius(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

// ---------------------------------------------------------------------------------------------
// Weights

WeightQuant weight_quant(Format format, WeightGranularity granularity, Format scale_format,
                         ZeroPoint zero_point = ZeroPoint::None, int group = 128) {
  WeightQuant q;
  q.format = format;
  q.granularity = granularity;
  q.group = group;
  q.block_n = 32;
  q.block_k = 48;  // blocks that do not tile [n, k] exactly: partial blocks at the edges
  q.scale_format = scale_format;
  q.zero_point = zero_point;
  return q;
}

TEST(QuantWeight, EveryFormatFamilyFollowsItsRule) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 45, k = 256;  // odd n: rows that leave partial bytes for odd widths
  std::vector<float> w = random_matrix(random.engine, n, k);
  // One row all positive, one all negative: zero points that must (int) or need not (float)
  // keep 0 inside the range.
  for (std::int64_t c = 0; c < k; ++c) {
    w[c] = 2.0f + std::fabs(w[c]);
    w[k + c] = -2.0f - std::fabs(w[k + c]);
  }
  using G = WeightGranularity;
  std::vector<WeightQuant> cases;
  for (int bits = 2; bits <= 8; ++bits)
    cases.push_back(
        weight_quant(formats::int_(bits), G::Group, formats::bf16, ZeroPoint::None, 32));
  for (int bits = 1; bits <= 8; ++bits) {
    cases.push_back(
        weight_quant(formats::uint_(bits), G::Group, formats::fp16, ZeroPoint::Midpoint, 64));
    cases.push_back(
        weight_quant(formats::uint_(bits), G::Group, formats::bf16, ZeroPoint::Integer, 128));
    cases.push_back(
        weight_quant(formats::uint_(bits), G::PerChannel, formats::fp32, ZeroPoint::Float));
  }
  for (Format f :
       {formats::e4m3, formats::e5m2, formats::e3m4, formats::e2m1, formats::e2m3, formats::e3m2}) {
    cases.push_back(weight_quant(f, G::PerChannel, formats::fp32));
    cases.push_back(weight_quant(f, G::Block, formats::fp32));
    cases.push_back(weight_quant(f, G::Group, formats::e8m0, ZeroPoint::None, 32));
  }
  cases.push_back(weight_quant(formats::int8, G::Group, formats::e8m0, ZeroPoint::None, 32));
  cases.push_back(weight_quant(formats::e4m3, G::PerTensor, formats::fp32));
  cases.push_back(weight_quant(formats::int4, G::Block, formats::e4m3));
  cases.push_back(weight_quant(formats::ternary(), G::PerTensor, formats::fp32));
  WeightQuant nv = weight_quant(formats::e2m1, G::Group, formats::ue4m3, ZeroPoint::None, 16);
  nv.global_scale = true;
  cases.push_back(nv);
  for (const WeightQuant& q : cases) {
    Scheme shown;
    shown.weight = q;
    SCOPED_TRACE(to_string(shown));
    const PackedWeight packed = quantize_weight(q, w.data(), n, k);
    EXPECT_EQ(packed.n, n);
    EXPECT_EQ(packed.k, k);
    EXPECT_EQ(packed.codes.size(), n * ((k * q.format.bits + 7) / 8));
    check_weight(packed, w, expect_quantized(rule_of(q, n, k), w, n, k));
  }
}

// Every preset, on a random weight with a partial 128 x 128 block: relative Frobenius error
// within sqrt(Σ bound²) / ‖w‖, the bound each element's format allows at its scale.
TEST(QuantWeight, EveryPresetWithinItsFormatBound) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 160, k = 384;
  const std::vector<float> w = random_matrix(random.engine, n, k);
  std::vector<double> w_double(w.begin(), w.end());
  ASSERT_FALSE(presets().empty());
  for (const Preset& preset : presets()) {
    SCOPED_TRACE(preset.name);
    const WeightQuant& q = preset.scheme.weight;
    const PackedWeight packed = quantize_weight(q, w.data(), n, k);
    const Expectation e = expect_quantized(rule_of(q, n, k), w, n, k);
    check_weight(packed, w, e);
    const std::vector<double> dequantized = dequantize_weight(packed);
    std::vector<double> error(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) error[i] = w_double[i] - dequantized[i];
    const double relative_error = frobenius(error) / frobenius(w_double);
    const double relative_bound = frobenius(e.bounds) / frobenius(w_double);
    EXPECT_LE(relative_error, relative_bound);
    EXPECT_GT(relative_error, 0.0);  // the weight is random: some rounding must happen
  }
}

TEST(QuantWeight, ZeroPointsReproduceTheBlockRange) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 7, k = 384, group = 128;
  std::vector<float> w = random_matrix(random.engine, n, k);
  // One row entirely positive: an integer zero point must still keep 0 representable, a float
  // zero may sit outside the code range.
  for (std::int64_t c = 0; c < k; ++c) w[c] = 3.0f + std::fabs(w[c]);
  for (ZeroPoint zp : {ZeroPoint::Integer, ZeroPoint::Float}) {
    for (int bits : {2, 3, 4, 8}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + (zp == ZeroPoint::Integer ? " int" : " float"));
      const WeightQuant q = weight_quant(formats::uint_(bits), WeightGranularity::Group,
                                         formats::fp16, zp, static_cast<int>(group));
      const PackedWeight packed = quantize_weight(q, w.data(), n, k);
      check_weight(packed, w, expect_quantized(rule_of(q, n, k), w, n, k));
      const std::vector<double> dequantized = dequantize_weight(packed);
      const double levels = std::ldexp(1.0, bits) - 1;
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t g = 0; g < k / group; ++g) {
          const std::size_t cell = static_cast<std::size_t>(r * (k / group) + g);
          double lo = INFINITY, hi = -INFINITY, deq_lo = 0, deq_hi = 0;
          for (std::int64_t c = g * group; c < (g + 1) * group; ++c) {
            const std::size_t at = static_cast<std::size_t>(r * k + c);
            if (w[at] < lo) lo = w[at], deq_lo = dequantized[at];
            if (w[at] > hi) hi = w[at], deq_hi = dequantized[at];
          }
          double range_lo = lo, range_hi = hi, zero_slack = 0;
          if (zp == ZeroPoint::Integer) {
            range_lo = std::min(lo, 0.0);
            range_hi = std::max(hi, 0.0);
          } else {  // the stored zero is itself rounded to fp16
            const double zero = stored_value(formats::fp16, packed.zeros, cell);
            zero_slack = half_ulp(formats::fp16, zero);
          }
          // The scale the range implies (an integer zero keeps 0 inside the range).
          const double scale = round_to(formats::fp16, (range_hi - range_lo) / levels);
          ASSERT_EQ(stored_value(formats::fp16, packed.scales, cell), scale);
          // The low end sits on a code within half a step; the high end also carries the
          // difference between the range and levels · (rounded scale).
          const double range_slack = std::fabs((range_hi - range_lo) - levels * scale);
          if (zp == ZeroPoint::Float || range_lo == lo)
            EXPECT_LE(std::fabs(deq_lo - lo),
                      scale * (0.5 + zero_slack) * (1 + 1e-12) + range_slack)
                << "row " << r << " group " << g;
          if (zp == ZeroPoint::Float || range_hi == hi)
            EXPECT_LE(std::fabs(deq_hi - hi),
                      scale * (0.5 + zero_slack) * (1 + 1e-12) + range_slack)
                << "row " << r << " group " << g;
        }
    }
  }
}

TEST(QuantWeight, MxSharedExponentSaturatesAsTheSpecSays) {
  // OCP MX: scale = 2^(floor(log2 amax) − emax_elem). For e2m1 (max 6 = 1.5 · 2^2) an amax of
  // 7.5 · 2^e gets scale 2^e and 7.5 saturates to 6: an error of 1.5 · 2^e, by design.
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  std::uniform_int_distribution<int> exponent_of(-20, 20);
  const int e = exponent_of(random.engine);
  std::vector<float> w = random_matrix(random.engine, 1, 32);
  for (float& v : w) v = std::clamp(v, -1.0f, 1.0f) * std::ldexp(1.0f, e);
  w[5] = 7.5f * std::ldexp(1.0f, e);
  const WeightQuant q =
      weight_quant(formats::e2m1, WeightGranularity::Group, formats::e8m0, ZeroPoint::None, 32);
  const PackedWeight packed = quantize_weight(q, w.data(), 1, 32);
  EXPECT_EQ(stored_value(formats::e8m0, packed.scales, 0), std::ldexp(1.0, e));
  const std::vector<double> dequantized = dequantize_weight(packed);
  EXPECT_EQ(dequantized[5], 6.0 * std::ldexp(1.0, e));
}

TEST(QuantWeight, DegenerateCellsStayFinite) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 4, k = 64;
  std::vector<float> w = random_matrix(random.engine, n, k);
  for (std::int64_t c = 0; c < 16; ++c) w[c] = 0.0f;               // an all-zero block
  for (std::int64_t c = 16; c < 32; ++c) w[c] *= 1e-30f;           // ue4m3 scale underflows
  for (std::int64_t c = 64; c < 128; ++c) w[c] = 1e6f + float(c);  // fp16 scale overflows
  struct Case {
    const char* name;
    WeightQuant quant;
  };
  WeightQuant nv =
      weight_quant(formats::e2m1, WeightGranularity::Group, formats::ue4m3, ZeroPoint::None, 16);
  nv.global_scale = true;
  const Case cases[] = {
      {"nvfp4", nv},
      {"int4 fp16",
       weight_quant(formats::int4, WeightGranularity::Group, formats::fp16, ZeroPoint::None, 16)},
      {"uint4 int zp fp16", weight_quant(formats::uint4, WeightGranularity::Group, formats::fp16,
                                         ZeroPoint::Integer, 16)},
      {"uint4 float zp fp16",
       weight_quant(formats::uint4, WeightGranularity::Group, formats::fp16, ZeroPoint::Float, 16)},
      {"e2m1 e8m0",
       weight_quant(formats::e2m1, WeightGranularity::Group, formats::e8m0, ZeroPoint::None, 32)},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.name);
    const PackedWeight packed = quantize_weight(test.quant, w.data(), n, k);
    const std::vector<double> dequantized = dequantize_weight(packed);
    for (std::size_t i = 0; i < w.size(); ++i) ASSERT_TRUE(std::isfinite(dequantized[i])) << i;
    for (std::int64_t c = 0; c < 16; ++c) EXPECT_EQ(dequantized[c], 0.0) << c;
    double tiny_amax = 0;
    for (std::int64_t c = 16; c < 32; ++c) tiny_amax = std::max(tiny_amax, std::fabs(double{w[c]}));
    for (std::int64_t c = 16; c < 32; ++c) EXPECT_LE(std::fabs(dequantized[c] - w[c]), tiny_amax);
  }
}

TEST(QuantWeight, LargeTensorsAreQuantizedByThreadsExactly) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 1031, k = 1152;  // > 1M elements: the threaded path
  const std::vector<float> w = random_matrix(random.engine, n, k);
  for (const WeightQuant& q :
       {weight_quant(formats::uint4, WeightGranularity::Group, formats::bf16, ZeroPoint::Integer),
        weight_quant(formats::e4m3, WeightGranularity::PerTensor, formats::fp32)}) {
    const PackedWeight packed = quantize_weight(q, w.data(), n, k);
    check_weight(packed, w, expect_quantized(rule_of(q, n, k), w, n, k));
  }
}

// ---------------------------------------------------------------------------------------------
// Partial last groups: K that the group does not divide (issue #14, item 5). The row has
// ceil(K / G) cells and the last one takes its scale from the values it has.

std::int64_t cells_along_k(std::int64_t k, std::int64_t per) { return (k + per - 1) / per; }

// Scales the values of every row's last cell along K (columns from `first`) by `factor`: the
// short cell's range then differs from its neighbours' by orders of magnitude, so a scale
// taken from anything but its own values misses its elements' bounds.
void shrink_tail(std::vector<float>& x, std::int64_t rows, std::int64_t cols, std::int64_t first,
                 float factor) {
  for (std::int64_t r = 0; r < rows; r += 2)
    for (std::int64_t c = first; c < cols; ++c) x[static_cast<std::size_t>(r * cols + c)] *= factor;
}

// [rows, cols] -> [rows, cells · per]: the partial last cell of every row filled up with its
// own values, repeated in order. Its min, max and absmax (and the tensor's) are unchanged, so
// every absmax or range rule must give the filled-up matrix the same scales and zeros, and the
// same codes on the first `cols` columns.
std::vector<float> fill_up_last_cell(const std::vector<float>& x, std::int64_t rows,
                                     std::int64_t cols, std::int64_t per) {
  const std::int64_t full = cells_along_k(cols, per) * per, first = (cols - 1) / per * per;
  std::vector<float> out(static_cast<std::size_t>(rows * full));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < full; ++c) {
      const std::int64_t from = c < cols ? c : first + (c - cols) % (cols - first);
      out[static_cast<std::size_t>(r * full + c)] = x[static_cast<std::size_t>(r * cols + from)];
    }
  return out;
}

// `partial` (K = k) against `full` (the filled-up K): identical scale and zero bytes, and the
// same codes and dequantized values on the first k columns of every row.
template <class Packed, class Dequantize>
void expect_same_cells(const Packed& partial, const Packed& full, int bits, Dequantize dequantize) {
  const std::int64_t rows = static_cast<std::int64_t>(partial.codes.size()) / partial.row_bytes();
  const std::int64_t k = partial.k;
  EXPECT_EQ(partial.scales, full.scales) << "the short cell's scale is not its own range's";
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < k; ++c)
      ASSERT_EQ(read_code(partial.codes.data() + r * partial.row_bytes(), c, bits),
                read_code(full.codes.data() + r * full.row_bytes(), c, bits))
          << "row " << r << " column " << c;
  const std::vector<double> partial_values = dequantize(partial), full_values = dequantize(full);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < k; ++c)
      ASSERT_EQ(partial_values[static_cast<std::size_t>(r * k + c)],
                full_values[static_cast<std::size_t>(r * full.k + c)])
          << "row " << r << " column " << c;
}

TEST(QuantWeight, PartialLastGroupTakesItsScaleFromItsOwnValues) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  using G = WeightGranularity;
  struct Case {
    WeightQuant quant;
    std::int64_t k;
  };
  WeightQuant nvfp4 = weight_quant(formats::e2m1, G::Group, formats::ue4m3, ZeroPoint::None, 16);
  nvfp4.global_scale = true;
  WeightQuant block = weight_quant(formats::e4m3, G::Block, formats::fp32);
  block.block_n = 16;
  block.block_k = 128;
  const std::vector<Case> cases = {
      // w4a16 and GPTQ/AWQ at the K = 2880 = 22.5 x 128.
      {weight_quant(formats::uint4, G::Group, formats::bf16, ZeroPoint::Midpoint), 2880},
      {weight_quant(formats::uint4, G::Group, formats::fp16, ZeroPoint::Integer), 2880},
      {weight_quant(formats::uint8, G::Group, formats::bf16, ZeroPoint::Midpoint), 2880},
      {weight_quant(formats::uint_(6), G::Group, formats::fp16, ZeroPoint::Float, 64), 2888},
      {weight_quant(formats::uint_(3), G::Group, formats::bf16, ZeroPoint::Integer, 96), 2890},
      {weight_quant(formats::uint_(1), G::Group, formats::bf16, ZeroPoint::Integer, 64), 2888},
      {weight_quant(formats::int4, G::Group, formats::bf16, ZeroPoint::None, 32), 2888},
      {weight_quant(formats::e5m2, G::Group, formats::bf16, ZeroPoint::None, 64), 2888},
      {weight_quant(formats::e2m1, G::Group, formats::e8m0, ZeroPoint::None, 32), 2896},  // MX
      {nvfp4, 2904},  // 181.5 groups of 16
      {block, 2880},
      {weight_quant(formats::uint4, G::Group, formats::bf16, ZeroPoint::Midpoint), 100},  // < G
  };
  const std::int64_t n = 13;
  for (const Case& c : cases) {
    Scheme shown;
    shown.weight = c.quant;
    SCOPED_TRACE(to_string(shown) + " K=" + std::to_string(c.k));
    const std::int64_t per = c.quant.granularity == G::Block ? c.quant.block_k : c.quant.group;
    ASSERT_NE(c.k % per, 0) << "the case must have a partial last group";
    std::vector<float> w = random_matrix(random.engine, n, c.k);
    shrink_tail(w, n, c.k, (c.k - 1) / per * per, 1e-3f);
    const PackedWeight packed = quantize_weight(c.quant, w.data(), n, c.k);
    // ceil(K / G) scales per row of cells, written out rather than taken from the grid.
    const std::int64_t cell_rows = c.quant.granularity == G::Block ? cells_along_k(n, 16) : n;
    EXPECT_EQ(packed.scales.size(),
              cell_rows * cells_along_k(c.k, per) * c.quant.scale_format.storage_bytes());
    check_weight(packed, w, expect_quantized(rule_of(c.quant, n, c.k), w, n, c.k));
    const std::vector<float> filled = fill_up_last_cell(w, n, c.k, per);
    const PackedWeight full =
        quantize_weight(c.quant, filled.data(), n, static_cast<std::int64_t>(filled.size()) / n);
    EXPECT_EQ(packed.zeros, full.zeros);
    EXPECT_EQ(packed.global_scale, full.global_scale);
    expect_same_cells(packed, full, c.quant.format.bits,
                      [](const PackedWeight& p) { return dequantize_weight(p); });
  }
}

// Ternary (absmean) takes the mean |w| over the values the short group has, not over G.
TEST(QuantWeight, PartialLastGroupAbsmeanCountsOnlyItsValues) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const WeightQuant q =
      weight_quant(formats::ternary(), WeightGranularity::Group, formats::fp32, ZeroPoint::None);
  const std::int64_t n = 3, k = 2880;
  const std::vector<float> w = random_matrix(random.engine, n, k);
  const PackedWeight packed = quantize_weight(q, w.data(), n, k);
  check_weight(packed, w, expect_quantized(rule_of(q, n, k), w, n, k));
  for (std::int64_t r = 0; r < n; ++r) {
    double sum = 0;
    for (std::int64_t c = 2816; c < k; ++c) sum += std::fabs(double{w[r * k + c]});
    EXPECT_EQ(stored_value(formats::fp32, packed.scales, r * 23 + 22), static_cast<float>(sum / 64))
        << "row " << r;
  }
}

// Absmean's Σ|x| adds a run of 32 by the warp's xor butterfly (offsets 16, 8, 4, 2, 1), the
// order the GPU quantizer adds in: x0 = 2^53 with x1 = x17 = 1 sums to 2^53 + 2 (x1 + x17 = 2
// meets x0 last, exactly), where adding left to right would lose both ones to rounding.
TEST(QuantWeight, AbsmeanSumsARunByTheWarpsButterfly) {
  std::vector<float> run(32, 0.0f);
  run[0] = 0x1p53f;
  run[1] = -1.0f;  // |x|
  run[17] = 1.0f;
  EXPECT_EQ(quant_detail::run_sum_abs(run.data(), 32), 0x1p53 + 2.0);
  double left_to_right = 0.0;
  for (float x : run) left_to_right += std::fabs(double{x});
  EXPECT_EQ(left_to_right, 0x1p53);  // the order matters for these values
  // A short run counts only its values (the absent lanes add +0).
  EXPECT_EQ(quant_detail::run_sum_abs(run.data(), 17), 0x1p53);
  EXPECT_EQ(quant_detail::run_sum_abs(run.data() + 1, 17), 2.0);
}

TEST(QuantWeight, BadInputIsRejectedByName) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t n = 6, k = 256;
  const WeightQuant q = weight_quant(formats::uint4, WeightGranularity::Group, formats::bf16,
                                     ZeroPoint::Midpoint, 128);
  std::vector<float> w = random_matrix(random.engine, n, k);
  {
    std::vector<float> bad = w;
    bad[2 * k + 5] = NAN;
    bad[4 * k + 1] = INFINITY;  // later than the NaN: the first bad element is named
    expect_error([&] { quantize_weight(q, bad.data(), n, k); }, {"weight[2, 5]", "nan", "finite"});
    bad[2 * k + 5] = 1.0f;
    expect_error([&] { quantize_weight(q, bad.data(), n, k); }, {"weight[4, 1]", "inf"});
    bad[4 * k + 1] = -INFINITY;
    expect_error([&] { quantize_weight(q, bad.data(), n, k); }, {"weight[4, 1]", "-inf"});
  }
  expect_error([&] { quantize_weight(q, w.data(), 0, k); }, {"n = 0", "n >= 1"});
  expect_error([&] { quantize_weight(q, w.data(), n, 0); }, {"k = 0", "k >= 1"});
  expect_error([&] { quantize_weight(q, w.data(), -3, k); }, {"n = -3"});
  expect_error([&] { quantize_weight(q, nullptr, n, k); }, {"weight is null"});
  WeightQuant g0 = q;
  g0.group = 0;
  expect_error([&] { quantize_weight(g0, w.data(), n, k); }, {"weight group 0", "positive"});
  WeightQuant signed_mid = q;
  signed_mid.format = formats::int4;
  expect_error([&] { quantize_weight(signed_mid, w.data(), n, k); }, {"zero point", "int4"});
  // A packed weight whose arrays do not match its shape is refused, not read out of bounds.
  PackedWeight packed = quantize_weight(q, w.data(), n, k);
  packed.codes.pop_back();
  expect_error([&] { dequantize_weight(packed); }, {"codes", "bytes"});
}

// ---------------------------------------------------------------------------------------------
// Activations

ActivationQuant activation_quant(Format format, ActivationScaling scaling, int group = 0) {
  ActivationQuant q;
  q.format = format;
  q.scaling = scaling;
  q.group = group;
  q.scale_format = scaling == ActivationScaling::MX   ? formats::e8m0
                   : scaling == ActivationScaling::NV ? formats::ue4m3
                                                      : formats::fp32;
  return q;
}

void check_activation(const PackedActivation& packed, const std::vector<float>& a,
                      const Expectation& e) {
  const ActivationQuant& q = packed.quant;
  const ScaleGrid grid = packed.scale_grid();
  ASSERT_EQ(packed.scales.size(), grid.count() * q.scale_format.storage_bytes());
  EXPECT_EQ(packed.tensor_scale, e.global);
  for (std::int64_t c = 0; c < grid.count(); ++c)
    ASSERT_EQ(stored_value(q.scale_format, packed.scales, c), e.cells[c].scale) << "cell " << c;
  const std::vector<double> dequantized = dequantize_activation(packed);
  ASSERT_EQ(dequantized.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(dequantized[i], e.values[i]) << "element " << i << " = " << a[i];
    ASSERT_LE(std::fabs(a[i] - dequantized[i]), e.bounds[i] * (1 + 1e-12)) << "element " << i;
  }
}

TEST(QuantActivation, EveryScalingFollowsItsRule) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t m = 9, k = 192;
  const std::vector<float> a = random_matrix(random.engine, m, k);
  using S = ActivationScaling;
  const ActivationQuant cases[] = {
      activation_quant(formats::e4m3, S::DynamicToken),
      activation_quant(formats::e5m2, S::DynamicToken),
      activation_quant(formats::int8, S::DynamicToken),
      activation_quant(formats::int4, S::DynamicToken),
      activation_quant(formats::e2m1, S::DynamicToken),
      activation_quant(formats::e4m3, S::DynamicGroup, 64),
      activation_quant(formats::int8, S::DynamicGroup, 16),
      activation_quant(formats::e4m3, S::MX, 32),
      activation_quant(formats::e5m2, S::MX, 32),  // IEEE elements: saturate, never Inf
      activation_quant(formats::e2m1, S::MX, 32),
      activation_quant(formats::int8, S::MX, 32),
      activation_quant(formats::e2m1, S::NV, 16),
      activation_quant(formats::e4m3, S::StaticTensor),
  };
  for (const ActivationQuant& q : cases) {
    Scheme shown;
    shown.activation = q;
    SCOPED_TRACE(to_string(shown));
    const PackedActivation packed = quantize_activation(q, a.data(), m, k);
    EXPECT_EQ(packed.codes.size(), m * ((k * q.format.bits + 7) / 8));
    check_activation(packed, a, expect_quantized(rule_of(q, m, k, 0.0), a, m, k));
  }
}

TEST(QuantActivation, PartialLastGroupTakesItsScaleFromItsOwnValues) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  using S = ActivationScaling;
  struct Case {
    ActivationQuant quant;
    std::int64_t k;
  };
  const std::vector<Case> cases = {
      {activation_quant(formats::e4m3, S::DynamicGroup, 128), 2880},  // fp8-block's 1x128
      {activation_quant(formats::int8, S::DynamicGroup, 48), 2890},
      {activation_quant(formats::int4, S::DynamicGroup, 32), 2891},  // odd K: a half byte
      {activation_quant(formats::e4m3, S::MX, 32), 2896},
      {activation_quant(formats::e2m1, S::MX, 32), 2901},
      {activation_quant(formats::int8, S::MX, 32), 2900},
      {activation_quant(formats::e2m1, S::NV, 16), 2904},
      {activation_quant(formats::e2m1, S::NV, 16), 2890},
      {activation_quant(formats::e4m3, S::DynamicGroup, 128), 72},  // one group, shorter than G
  };
  const std::int64_t m = 5;
  for (const Case& c : cases) {
    Scheme shown;
    shown.activation = c.quant;
    SCOPED_TRACE(to_string(shown) + " K=" + std::to_string(c.k));
    const std::int64_t group = c.quant.group;
    ASSERT_NE(c.k % group, 0) << "the case must have a partial last group";
    std::vector<float> a = random_matrix(random.engine, m, c.k);
    shrink_tail(a, m, c.k, (c.k - 1) / group * group, 1e-3f);
    const PackedActivation packed = quantize_activation(c.quant, a.data(), m, c.k);
    EXPECT_EQ(packed.scales.size(),
              m * cells_along_k(c.k, group) * c.quant.scale_format.storage_bytes());
    EXPECT_EQ(packed.codes.size(), m * ((c.k * c.quant.format.bits + 7) / 8));
    check_activation(packed, a, expect_quantized(rule_of(c.quant, m, c.k, 0.0), a, m, c.k));
    const std::vector<float> filled = fill_up_last_cell(a, m, c.k, group);
    const PackedActivation full = quantize_activation(c.quant, filled.data(), m,
                                                      static_cast<std::int64_t>(filled.size()) / m);
    EXPECT_EQ(packed.tensor_scale, full.tensor_scale);
    expect_same_cells(packed, full, c.quant.format.bits,
                      [](const PackedActivation& p) { return dequantize_activation(p); });
  }
}

TEST(QuantActivation, StaticScaleIsTakenAsGivenAndSaturates) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t m = 5, k = 96;
  const std::vector<float> a = random_matrix(random.engine, m, k);
  double amax = 0;
  for (float v : a) amax = std::max(amax, std::fabs(double{v}));
  // A calibration that saw only a quarter of this tensor's range: large values saturate.
  const double calibrated = amax / 4 / 448.0;
  const ActivationQuant q = activation_quant(formats::e4m3, ActivationScaling::StaticTensor);
  const PackedActivation packed = quantize_activation(q, a.data(), m, k, calibrated);
  check_activation(packed, a, expect_quantized(rule_of(q, m, k, calibrated), a, m, k));
  const std::vector<double> dequantized = dequantize_activation(packed);
  const double ceiling = 448.0 * static_cast<float>(calibrated);
  for (double v : dequantized) EXPECT_LE(std::fabs(v), ceiling);
  expect_error([&] { quantize_activation(q, a.data(), m, k, NAN); }, {"static_scale = nan"});
}

TEST(QuantActivation, EveryPresetWithinItsFormatBound) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t m = 11, k = 384;
  const std::vector<float> a = random_matrix(random.engine, m, k);
  std::vector<double> a_double(a.begin(), a.end());
  for (const Preset& preset : presets()) {
    const ActivationQuant& q = preset.scheme.activation;
    if (!q.is_quantized()) continue;
    SCOPED_TRACE(preset.name);
    const PackedActivation packed = quantize_activation(q, a.data(), m, k);
    const Expectation e = expect_quantized(rule_of(q, m, k, 0.0), a, m, k);
    check_activation(packed, a, e);
    const std::vector<double> dequantized = dequantize_activation(packed);
    std::vector<double> error(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) error[i] = a_double[i] - dequantized[i];
    EXPECT_LE(frobenius(error), frobenius(e.bounds));
  }
}

// Unquantized activations are their fp16 / bf16 codes, rounded to nearest even: checked
// against the compiler's _Float16 conversion and a bit-level bf16 rounding.
TEST(QuantActivation, UnquantizedAreHalfPrecisionCodes) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t m = 3, k = 77;
  const std::vector<float> a = random_matrix(random.engine, m, k);
  const ActivationQuant bf16 = activation_quant(formats::bf16, ActivationScaling::None);
  const ActivationQuant fp16 = activation_quant(formats::fp16, ActivationScaling::None);
  const PackedActivation as_bf16 = quantize_activation(bf16, a.data(), m, k);
  const PackedActivation as_fp16 = quantize_activation(fp16, a.data(), m, k);
  ASSERT_EQ(as_bf16.codes.size(), static_cast<std::size_t>(m * k * 2));
  ASSERT_EQ(as_fp16.codes.size(), static_cast<std::size_t>(m * k * 2));
  EXPECT_TRUE(as_bf16.scales.empty());
  const std::vector<double> bf16_values = dequantize_activation(as_bf16);
  const std::vector<double> fp16_values = dequantize_activation(as_fp16);
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &a[i], 4);
    const std::uint32_t bf16_code = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const std::uint32_t stored_bf16 = as_bf16.codes[2 * i] | (as_bf16.codes[2 * i + 1] << 8);
    ASSERT_EQ(stored_bf16, bf16_code) << "element " << i << " = " << a[i];
    std::uint32_t widened = bf16_code << 16;
    float bf16_float = 0;
    std::memcpy(&bf16_float, &widened, 4);
    ASSERT_EQ(bf16_values[i], bf16_float);
    ASSERT_EQ(fp16_values[i], static_cast<double>(static_cast<_Float16>(a[i])))
        << "element " << i << " = " << a[i];
  }
}

TEST(QuantActivation, BadInputIsRejectedByName) {
  SeededRandom random;
  SCOPED_TRACE(random.trace());
  const std::int64_t m = 4, k = 64;
  std::vector<float> a = random_matrix(random.engine, m, k);
  const ActivationQuant tok = activation_quant(formats::e4m3, ActivationScaling::DynamicToken);
  const ActivationQuant fp16 = activation_quant(formats::fp16, ActivationScaling::None);
  const ActivationQuant mx = activation_quant(formats::e4m3, ActivationScaling::MX, 32);
  std::vector<float> bad = a;
  bad[3 * k + 7] = NAN;
  expect_error([&] { quantize_activation(tok, bad.data(), m, k); }, {"activation[3, 7]", "nan"});
  expect_error([&] { quantize_activation(fp16, bad.data(), m, k); }, {"activation[3, 7]", "nan"});
  bad = a;
  bad[k + 2] = 1e6f;  // finite, but beyond fp16
  expect_error([&] { quantize_activation(fp16, bad.data(), m, k); },
               {"activation[1, 2]", "fp16", "65504"});
  expect_error([&] { quantize_activation(tok, a.data(), 0, k); }, {"m = 0", "m >= 1"});
  expect_error([&] { quantize_activation(tok, a.data(), m, -1); }, {"k = -1"});
  ActivationQuant mx48 = mx;
  mx48.group = 48;  // MX blocks are 1x32 by definition
  expect_error([&] { quantize_activation(mx48, a.data(), m, k); }, {"MX activation scaling"});
}

}  // namespace
}  // namespace qgemm
