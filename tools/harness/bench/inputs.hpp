// The host side of a bench problem: seeded random inputs, the operands each backend is given,
// and the sampled reference its output is checked against.
//
// Checking a 8192 x 28672 output against a double-precision reference on the CPU would take
// minutes, so the check covers a sample of the output (OutputSample): a set of rows of A (all of
// them up to 64, else 32 spread evenly, first and last included) times a few bands of output
// columns (weight rows: the first, one in the middle and the last, each starting on a row of the
// weight's scale grid, so that a band is itself a valid packed weight). Bugs at tile edges (the
// last partial M or N tile, split-K boundaries) land in the sample.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "bench/recipe.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::bench {

// count values ~ N(0, sigma²), a function of (seed, count) only (not of the thread count).
std::vector<float> random_normal(std::int64_t count, std::uint64_t seed, double sigma);

// A seed for one tensor of a run: a mix of the run's seed and the numbers that name the tensor.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0);

// The values of 16-bit codes (`format`: bf16 or fp16) as floats (exact).
std::vector<float> decode_to_float(const std::vector<std::uint8_t>& codes, const Format& format);

// The baselines' operands. cublas-bf16: `values` rounded to bf16 (the unquantized model).
// cuBLASLt FP8: e4m3 with one fp32 scale per tensor (amax / 448), weights and activations alike.
WeightQuant fp8_tensor_weight_quant();
ActivationQuant fp8_tensor_activation_quant();
// The FP8 baselines as a scheme, so the reference can compute exactly what they should.
Scheme fp8_baseline_scheme();

// The activation format the Engine is given for `scheme`: its own format when unquantized
// (bf16 / fp16), else bf16 (the Engine quantizes it on the fly, as the scheme says).
Format engine_activation_format(const Scheme& scheme);

// Which part of an [m, n] output the check covers.
struct OutputSample {
  std::vector<std::int64_t> rows;                            // ascending
  std::vector<std::pair<std::int64_t, std::int64_t>> bands;  // [begin, end) columns, disjoint
  std::int64_t columns() const;
  std::int64_t size() const { return static_cast<std::int64_t>(rows.size()) * columns(); }
};
// `alignment`: bands start on multiples of it (the weight's scale-grid rows; 1 for a per-tensor
// scale).
OutputSample sample_output(std::int64_t m, std::int64_t n, std::int64_t alignment);
// The alignment of `weight`'s scale grid (1 when one scale row covers the whole weight).
std::int64_t scale_row_alignment(const PackedWeight& weight);

// Rows [begin, end) of a packed weight as a packed weight of end - begin rows (codes, scales,
// zeros of those rows; the same global scale). `begin` must start a scale-grid row.
PackedWeight slice_weight_rows(const PackedWeight& weight, std::int64_t begin, std::int64_t end);
// The given rows of a packed activation (its per-row scales with them; a per-tensor scale kept).
PackedActivation select_activation_rows(const PackedActivation& activation,
                                        const std::vector<std::int64_t>& rows);

// The scheme's reference (reference::gemm: exact dequantization, double, one rounding to the
// output format) on the sample: [rows][columns of every band, in order].
std::vector<double> sampled_reference(const Scheme& scheme, const PackedActivation& activation,
                                      const PackedWeight& weight, const OutputSample& sample);
// The exact product (no output rounding) of a bf16 activation and bf16 weight codes on the
// sample: the cublas-bf16 baseline's reference.
std::vector<double> sampled_bf16_product(const std::vector<std::uint8_t>& a_codes,
                                         const std::vector<std::uint8_t>& w_codes, std::int64_t k,
                                         const OutputSample& sample);

// ||actual − expected||_F / ||expected||_F; NaN when `actual` holds a NaN or Inf (a poisoned
// element the backend did not write), +Inf when the reference is all zeros but actual is not.
double relative_frobenius_error(const std::vector<double>& actual,
                                const std::vector<double>& expected);

// The error (relative Frobenius, against that backend's reference) a correct backend stays
// under: wide enough for its rounding, far below the O(1) error of a wrong result.
double error_tolerance(Backend backend);

}  // namespace qgemm::bench
