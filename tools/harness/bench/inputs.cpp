#include "bench/inputs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"
#include "quant/parallel.hpp"

namespace qgemm::bench {
namespace {

// Values are drawn in fixed chunks, each from its own generator, so that they depend on the
// seed alone and threads can draw chunks in parallel.
constexpr std::int64_t kDrawChunk = std::int64_t{1} << 16;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::int64_t round_down(std::int64_t value, std::int64_t step) { return value / step * step; }

}  // namespace

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

std::vector<float> random_normal(std::int64_t count, std::uint64_t seed, double sigma) {
  require(count >= 0, "random_normal: count = {} (rule: >= 0)", count);
  std::vector<float> values(static_cast<std::size_t>(count));
  const std::int64_t chunks = (count + kDrawChunk - 1) / kDrawChunk;
  quant_detail::parallel_rows(chunks, kDrawChunk, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t chunk = begin; chunk < end; ++chunk) {
      std::mt19937_64 rng(derive_seed(seed, static_cast<std::uint64_t>(chunk)));
      std::normal_distribution<float> normal(0.0f, static_cast<float>(sigma));
      const std::int64_t stop = std::min(count, (chunk + 1) * kDrawChunk);
      for (std::int64_t i = chunk * kDrawChunk; i < stop; ++i)
        values[static_cast<std::size_t>(i)] = normal(rng);
    }
  });
  return values;
}

std::vector<float> decode_to_float(const std::vector<std::uint8_t>& codes, const Format& format) {
  require(format == formats::bf16 || format == formats::fp16,
          "decode_to_float: format {} (rule: bf16 or fp16)", format.name());
  const auto count = static_cast<std::int64_t>(codes.size() / 2);
  std::vector<float> values(static_cast<std::size_t>(count));
  quant_detail::parallel_rows(count, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::uint32_t code = codes[2 * i] | (std::uint32_t{codes[2 * i + 1]} << 8);
      values[static_cast<std::size_t>(i)] = static_cast<float>(decode(format, code));
    }
  });
  return values;
}

WeightQuant fp8_tensor_weight_quant() { return fp8_baseline_scheme().weight; }
ActivationQuant fp8_tensor_activation_quant() { return fp8_baseline_scheme().activation; }

Scheme fp8_baseline_scheme() {
  // One fp32 scale per tensor (amax / 448), computed from the tensor itself: the classic
  // per-tensor FP8 GEMM that cuBLASLt's A/B scale pointers implement.
  static const Scheme scheme = parse_scheme("w=e4m3:t:s=fp32;a=e4m3:t:s=fp32;o=bf16");
  return scheme;
}

Format engine_activation_format(const Scheme& scheme) {
  return scheme.activation.is_quantized() ? formats::bf16 : scheme.activation.format;
}

std::int64_t OutputSample::columns() const {
  std::int64_t total = 0;
  for (const auto& [begin, end] : bands) total += end - begin;
  return total;
}

OutputSample sample_output(std::int64_t m, std::int64_t n, std::int64_t alignment) {
  require(m >= 1 && n >= 1 && alignment >= 1,
          "sample_output: m = {}, n = {}, alignment = {} (rule: all >= 1)", m, n, alignment);
  OutputSample sample;
  constexpr std::int64_t kAllRowsUpTo = 64, kSampledRows = 32;
  if (m <= kAllRowsUpTo) {
    for (std::int64_t r = 0; r < m; ++r) sample.rows.push_back(r);
  } else {
    // Evenly spread, first and last included; distinct because m - 1 > kSampledRows - 1.
    for (std::int64_t i = 0; i < kSampledRows; ++i)
      sample.rows.push_back(i * (m - 1) / (kSampledRows - 1));
  }
  const std::int64_t width =
      (std::max<std::int64_t>(64, alignment) + alignment - 1) / alignment * alignment;
  std::vector<std::pair<std::int64_t, std::int64_t>> bands;
  if (n <= 3 * width) {
    bands.push_back({0, n});
  } else {
    const std::int64_t middle = round_down(n / 2, alignment);
    const std::int64_t last = round_down(n - width, alignment);
    bands = {{0, width}, {middle, std::min(n, middle + width)}, {last, n}};
  }
  // Merge bands that touch or overlap (sorted by construction).
  for (const auto& band : bands) {
    if (!sample.bands.empty() && band.first <= sample.bands.back().second)
      sample.bands.back().second = std::max(sample.bands.back().second, band.second);
    else
      sample.bands.push_back(band);
  }
  return sample;
}

std::int64_t scale_row_alignment(const PackedWeight& weight) {
  const ScaleGrid grid = weight.scale_grid();
  return grid.rows == 1 ? 1 : grid.rows_per;
}

PackedWeight slice_weight_rows(const PackedWeight& weight, std::int64_t begin, std::int64_t end) {
  require(0 <= begin && begin < end && end <= weight.n,
          "slice_weight_rows: rows [{}, {}) of a weight of {} rows (rule: 0 <= begin "
          "< end <= n)",
          begin, end, weight.n);
  const ScaleGrid grid = weight.scale_grid();
  require(grid.rows == 1 || begin % grid.rows_per == 0,
          "slice_weight_rows: begin = {} does not start a scale row of {} rows", begin,
          grid.rows_per);
  PackedWeight out;
  out.quant = weight.quant;
  out.n = end - begin;
  out.k = weight.k;
  out.global_scale = weight.global_scale;
  const std::int64_t row_bytes = weight.row_bytes();
  out.codes.assign(weight.codes.begin() + begin * row_bytes,
                   weight.codes.begin() + end * row_bytes);
  if (grid.rows == 1) {
    out.scales = weight.scales;
    out.zeros = weight.zeros;
  } else {
    const std::int64_t first = begin / grid.rows_per;
    const std::int64_t last = (end + grid.rows_per - 1) / grid.rows_per;  // exclusive
    const std::int64_t scale_row_bytes = grid.cols * weight.quant.scale_format.storage_bytes();
    out.scales.assign(weight.scales.begin() + first * scale_row_bytes,
                      weight.scales.begin() + last * scale_row_bytes);
    if (!weight.zeros.empty()) {
      // Integer zero points pack a grid row like a row of codes; float ones are scale codes.
      const std::int64_t zero_row_bytes = weight.quant.zero_point == ZeroPoint::Integer
                                              ? (grid.cols * weight.quant.format.bits + 7) / 8
                                              : scale_row_bytes;
      out.zeros.assign(weight.zeros.begin() + first * zero_row_bytes,
                       weight.zeros.begin() + last * zero_row_bytes);
    }
  }
  check_packed_weight(out, "slice_weight_rows");
  return out;
}

PackedActivation select_activation_rows(const PackedActivation& activation,
                                        const std::vector<std::int64_t>& rows) {
  PackedActivation out;
  out.quant = activation.quant;
  out.m = static_cast<std::int64_t>(rows.size());
  out.k = activation.k;
  out.tensor_scale = activation.tensor_scale;
  const ScaleGrid grid = activation.scale_grid();
  const std::int64_t row_bytes = activation.row_bytes();
  const bool per_row_scales = grid.rows == activation.m && grid.rows > 0;
  const std::int64_t scale_row_bytes =
      per_row_scales ? grid.cols * activation.quant.scale_format.storage_bytes() : 0;
  if (!per_row_scales) out.scales = activation.scales;  // none, or one for the tensor
  for (std::int64_t r : rows) {
    require(0 <= r && r < activation.m, "select_activation_rows: row {} of {} (rule: 0 <= row < m)",
            r, activation.m);
    out.codes.insert(out.codes.end(), activation.codes.begin() + r * row_bytes,
                     activation.codes.begin() + (r + 1) * row_bytes);
    if (per_row_scales)
      out.scales.insert(out.scales.end(), activation.scales.begin() + r * scale_row_bytes,
                        activation.scales.begin() + (r + 1) * scale_row_bytes);
  }
  return out;
}

std::vector<double> sampled_reference(const Scheme& scheme, const PackedActivation& activation,
                                      const PackedWeight& weight, const OutputSample& sample) {
  const PackedActivation rows = select_activation_rows(activation, sample.rows);
  const std::int64_t columns = sample.columns();
  std::vector<double> out(static_cast<std::size_t>(rows.m * columns));
  std::int64_t offset = 0;
  for (const auto& [begin, end] : sample.bands) {
    const std::vector<double> band =
        reference::gemm(scheme, rows, slice_weight_rows(weight, begin, end));
    const std::int64_t width = end - begin;
    for (std::int64_t r = 0; r < rows.m; ++r)
      std::copy_n(band.begin() + r * width, width, out.begin() + r * columns + offset);
    offset += width;
  }
  return out;
}

std::vector<double> sampled_bf16_product(const std::vector<std::uint8_t>& a_codes,
                                         const std::vector<std::uint8_t>& w_codes, std::int64_t k,
                                         const OutputSample& sample) {
  auto value = [](const std::vector<std::uint8_t>& codes, std::int64_t index) {
    return decode(formats::bf16, codes[2 * index] | (std::uint32_t{codes[2 * index + 1]} << 8));
  };
  const auto m = static_cast<std::int64_t>(sample.rows.size());
  std::vector<double> a(static_cast<std::size_t>(m * k));
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t j = 0; j < k; ++j) a[r * k + j] = value(a_codes, sample.rows[r] * k + j);
  const std::int64_t columns = sample.columns();
  std::vector<double> w(static_cast<std::size_t>(columns * k));
  std::int64_t row = 0;
  for (const auto& [begin, end] : sample.bands)
    for (std::int64_t n = begin; n < end; ++n, ++row)
      for (std::int64_t j = 0; j < k; ++j) w[row * k + j] = value(w_codes, n * k + j);
  return reference::matmul_nt(a.data(), w.data(), m, columns, k);
}

double relative_frobenius_error(const std::vector<double>& actual,
                                const std::vector<double>& expected) {
  require(actual.size() == expected.size(),
          "relative_frobenius_error: {} values against {} (rule: same size)", actual.size(),
          expected.size());
  double difference = 0, norm = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i])) return std::numeric_limits<double>::quiet_NaN();
    difference += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  if (norm == 0) return difference == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(difference / norm);
}

double error_tolerance(Backend backend) {
  switch (backend) {
    case Backend::Qgemm:
    case Backend::QgemmCodes:
    case Backend::Qdq:
      // Against the scheme's exact reference: dequantized operands rounded to 16 bits before
      // the tensor-core multiply (2^-9 relative each), fp32 accumulation, one rounding of the
      // output (2^-9): ~3e-3 in RMS terms; `qgemm check` derives a bound of ~1.5e-2 for these.
      return 2e-2;
    case Backend::CublasBf16:
      // Against the exact product of the same bf16 operands: fp32 accumulation and the bf16
      // output rounding only (~1e-3).
      return 1e-2;
    case Backend::CublasLtFp8Exact:
      // Against the exact product of the same e4m3 operands and scales: accumulation promoted
      // to fp32, then the bf16 output rounding (~1e-3).
      return 1e-2;
    case Backend::CublasLtFp8:
      // Fast accumulation keeps partial sums in the tensor cores' reduced-precision
      // accumulator without promotion; its error grows with K (percent-level worst cases are
      // reported for K = 4096), so the bound is wider. A wrong result is still O(1) off.
      return 5e-2;
  }
  throw Error(ErrorCode::Internal, "backend out of range");
}

}  // namespace qgemm::bench
