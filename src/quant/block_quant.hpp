// The one block quantizer behind quantize_weight and quantize_activation.
//
// A matrix [rows, cols] is cut into the cells of a ScaleGrid; every cell gets a scale (and, for
// zero-point rules, a zero) from its statistics, and every element becomes
//
//   code = encode(element, clamp(x / (scale · second_level) + zero, lowest, max))
//   value = (decode(code) − zero) · scale · second_level            (exact, in double)
//
// Weights and activations differ only in how they fill in BlockRule (see quantize.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::quant_detail {

enum class ScaleRule : std::uint8_t {
  AbsMax,          // scale = amax / element max (or the zero-point variants)
  AbsMean,         // scale = mean |x| (ternary, BitNet b1.58)
  SharedExponent,  // OCP MX: 2^(floor(log2 amax) − floor(log2 element max)), e8m0 scales
  Fixed,           // one given scale for every cell (static activation calibration)
};

struct BlockRule {
  Format element;
  Format scale_format;
  ZeroPoint zero_point = ZeroPoint::None;
  ScaleRule scale_rule = ScaleRule::AbsMax;
  double fixed_scale = 0.0;   // ScaleRule::Fixed only
  bool second_level = false;  // an fp32 tensor-wide factor under the cell scales (NVFP4)
  const char* function = "";  // for messages: "quantize_weight"
  const char* tensor = "";    // for messages: "weight"
};

struct QuantizedBlocks {
  std::vector<std::uint8_t> codes;   // rows × ceil(cols · bits / 8), canonical packing
  std::vector<std::uint8_t> scales;  // grid.count() × scale_format.storage_bytes()
  std::vector<std::uint8_t> zeros;   // Integer: grid rows packed like codes; Float: like scales
  double second_level = 1.0;
};

// The rule of quantize_weight for `quant` (`function` names it in messages), and the checks
// every weight quantizer runs first: the scheme valid for [n, k]; a packed weight's scales,
// zeros and global scale of its scheme's sizes (its codes are checked apart: on the GPU path
// they stay on the device).
BlockRule weight_rule(const WeightQuant& quant, const char* function);
void validate_weight(const WeightQuant& quant, std::int64_t n, std::int64_t k);
void check_packed_weight_metadata(const PackedWeight& weight, const char* function);

// What a cell's absolute maximum is divided by for its raw absmax scale: the element's largest
// value, or for zero-point rules half the integer levels.
double absmax_denominator(const BlockRule& rule);

// Σ|x| of `count` (<= 32) consecutive values, in double, by the butterfly tree of a warp's xor
// shuffles (offsets 16, 8, 4, 2, 1; absent values +0): the order the GPU quantizer adds a run
// of 32 in (kernels/util/quantize_weight.cuh), so that the absmean scales of both agree bit
// for bit. A piece's runs of 32 from its first column are then added in order.
double run_sum_abs(const float* values, std::int64_t count);
inline constexpr std::int64_t kSumRun = 32;

// Rounds a raw scale into the scale format so that dequantization never meets 0, NaN or Inf:
// an all-zero cell (raw 0) gets 1 (its codes are then 0), an underflow the smallest positive
// scale, an overflow the largest finite one (the elements then saturate). The GPU quantizer
// (kernels/util/number_codec.cuh) computes the same.
double finalize_scale(const Format& scale_format, double raw);

// Element codes of pass 3: saturates to the format's range, then rounds to nearest even
// exactly as encode() does: integers directly, floats of ≤ 8 bits by a table search, wider
// floats through the codec.
class ElementEncoder {
 public:
  explicit ElementEncoder(const Format& element);
  std::uint32_t operator()(double x) const;

 private:
  Format element_;
  double low_, high_;
  std::uint32_t mask_;
  std::uint32_t sign_bit_ = 0;
  std::vector<double> midpoints_;  // between the values of codes c and c + 1 (c ≥ 0)
};

// Rejects non-finite input (naming the first bad element). `data` is row-major [rows, cols].
QuantizedBlocks quantize_blocks(const BlockRule& rule, const ScaleGrid& grid, const float* data,
                                std::int64_t rows, std::int64_t cols);

// Checks the sizes of the stored arrays against rule, grid and shape, then decodes.
std::vector<double> dequantize_blocks(const BlockRule& rule, const ScaleGrid& grid,
                                      const std::vector<std::uint8_t>& codes,
                                      const std::vector<std::uint8_t>& scales,
                                      const std::vector<std::uint8_t>& zeros, double second_level,
                                      std::int64_t rows, std::int64_t cols);

// Bytes of one packed run of `count` codes of `bits` bits.
inline std::int64_t packed_bytes(std::int64_t count, int bits) { return (count * bits + 7) / 8; }

}  // namespace qgemm::quant_detail
