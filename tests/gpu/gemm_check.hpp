// Checking a GEMM's output from the GPU against the CPU reference, element by element, with the
// bounds of check::backend_error_bounds (tools/harness/check/error_bounds.hpp): every element within its
// own bound, nothing unwritten (outputs are poisoned with NaN before a launch). A wrong tile —
// zeroed, shifted, another row's — fails here even where it barely moves the Frobenius norm
// (PlanGpu.ElementwiseBoundCatchesAZeroedTile is the negative control).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check/backend.hpp"
#include "check/error_bounds.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::test {

// Every weight's scale times the global scale, row-major [n, k], read from the canonical grid.
inline std::vector<double> weight_scales(const PackedWeight& packed) {
  const ScaleGrid grid = packed.scale_grid();
  const int scale_bytes = packed.quant.scale_format.storage_bytes();
  std::vector<double> out(static_cast<std::size_t>(packed.n * packed.k));
  for (std::int64_t r = 0; r < packed.n; ++r)
    for (std::int64_t c = 0; c < packed.k; ++c) {
      const std::int64_t cell = (r / grid.rows_per) * grid.cols + c / grid.cols_per;
      std::uint32_t code = 0;
      for (int b = 0; b < scale_bytes; ++b)
        code |= static_cast<std::uint32_t>(packed.scales[static_cast<std::size_t>(
                    cell * scale_bytes + b)])
                << (8 * b);
      out[static_cast<std::size_t>(r * packed.k + c)] =
          decode(packed.quant.scale_format, code) * packed.global_scale;
    }
  return out;
}

// What the kernels accumulate in place of each weight, in magnitude (backend_error_bounds' t):
// |w|, and for integer codes of at most 7 bits, which the decode kernel sums lifted (base + u,
// base up to 1024) and offsets after each group, (1024 + 2^bits) · |scale| on top.
inline std::vector<double> accumulated_weight(const PackedWeight& packed,
                                              const std::vector<double>& w_values) {
  std::vector<double> out(w_values.size());
  const Format& f = packed.quant.format;
  const double lift = f.is_integer() && f.bits <= 7 ? 1024.0 + std::ldexp(1.0, f.bits) : 0.0;
  const std::vector<double> scales = lift > 0 ? weight_scales(packed) : std::vector<double>{};
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = std::fabs(w_values[i]) + (lift > 0 ? lift * std::fabs(scales[i]) : 0.0);
  return out;
}

// Half the spacing of `f` at 1 (relative rounding of a value into f); 0 for fp32 operands the
// kernels keep in fp32.
inline double unit_roundoff(const Format& f) {
  return f == formats::fp32 ? 0.0 : check::unit_roundoff(f);
}

// The operand roundings of a qgemm GEMM whose operand is `operand` (bf16/fp16, or 8-bit codes):
// each dequantized weight rounded to it (the fp32 dequantization; exact on the 8-bit mma, which
// takes the codes), and activations rounded where their scale goes into the operand (per-group
// scalings, and dequantize + cuBLAS folding the per-row factor in). Quantized activations may
// meet the weight in bf16 whatever their exact 16-bit type (dispatch::qdq_operand): bf16's.
inline check::OperandRounding operand_rounding(const ActivationQuant& quant,
                                               const Format& operand) {
  check::OperandRounding rounding;
  if (operand.storage_bytes() == 1) return rounding;
  const Format& widest = quant.is_quantized() ? formats::bf16 : operand;
  rounding.weight = unit_roundoff(widest);
  if (quant.is_quantized()) rounding.activation = unit_roundoff(widest);
  return rounding;
}

// The element-wise bounds of a GEMM of `a` (the activations' exact values, [m, k]) against
// `packed` (w_values: its exact dequantization) whose exact product is `expected`.
inline std::vector<double> gemm_bounds(const std::vector<double>& a, const PackedWeight& packed,
                                       const std::vector<double>& w_values, std::int64_t m,
                                       const check::OperandRounding& rounding,
                                       const Format& output,
                                       const std::vector<double>& expected) {
  return check::backend_error_bounds(a, w_values, accumulated_weight(packed, w_values), m,
                                     packed.n, packed.k, rounding, output, expected);
}

struct OutputCheck {
  double relative = 0;         // ||got − expected|| / ||expected|| over the finite elements
  double worst = 0;            // the largest |got − expected| / bound
  std::size_t non_finite = 0;  // unwritten (poisoned) or NaN/Inf elements
  std::size_t outside = 0;     // elements outside their bound
  std::int64_t first_row = -1, first_col = -1;  // the first element outside it
  double first_got = 0, first_expected = 0, first_bound = 0;
  bool ok() const { return non_finite == 0 && outside == 0; }
  std::string describe() const {
    if (ok()) return "ok";
    return std::to_string(outside) + " elements outside their bound, " +
           std::to_string(non_finite) + " not finite; first at (" + std::to_string(first_row) +
           ", " + std::to_string(first_col) + "): got " + std::to_string(first_got) +
           ", expected " + std::to_string(first_expected) + " ± " + std::to_string(first_bound);
  }
};

inline OutputCheck check_output(const std::vector<double>& got, const std::vector<double>& expected,
                                const std::vector<double>& bounds, std::int64_t n) {
  OutputCheck check;
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    norm += expected[i] * expected[i];
    const double d = std::fabs(got[i] - expected[i]);
    if (!std::isfinite(got[i])) {
      ++check.non_finite;
    } else {
      error += d * d;
    }
    if (std::isfinite(got[i])) check.worst = std::max(check.worst, d / bounds[i]);
    if (!(d <= bounds[i]) && check.outside++ == 0) {
      check.first_row = static_cast<std::int64_t>(i) / n;
      check.first_col = static_cast<std::int64_t>(i) % n;
      check.first_got = got[i];
      check.first_expected = expected[i];
      check.first_bound = bounds[i];
    }
  }
  check.relative = norm > 0 ? std::sqrt(error / norm) : std::sqrt(error);
  return check;
}

}  // namespace qgemm::test
