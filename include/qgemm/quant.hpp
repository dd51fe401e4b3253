// Host quantizer, packer and dequantizer: the canonical packed form every other layout starts
// from (GPU repacks, checkpoint import, the CPU reference).
//
// Canonical packed codes (weights [n, k] and activations [m, k] alike), row-major:
//
//   row r occupies bytes [r · row_bytes, (r + 1) · row_bytes), row_bytes = ceil(k · bits / 8)
//   element j of a row occupies bits [j · bits, (j + 1) · bits) of that row, counted LSB-first
//   through little-endian bytes; a code may straddle a byte (3, 5, 6, 7 bits); pad bits are 0.
//
//     bits = 4, row "a b c d":   byte 0 = b<<4 | a,  byte 1 = d<<4 | c
//     bits = 3, row "a b c":     byte 0 = c[1:0]<<6 | b<<3 | a,  byte 1 = c[2]
//
// Scales: the scale grid (scheme.hpp) row-major, each scale stored as its code in the scale
// format, format.storage_bytes() bytes little-endian. K need not be a multiple of the group:
// a row of groups of G has ceil(K / G) scales, the last one covering the values that remain.
// Integer zero points: the same grid, each grid row packed like a row of codes (weight's width,
// ceil(grid.cols · bits / 8) bytes per grid row); float zero points: like scales, in the scale
// format. Midpoint zeros are implied (2^(b−1)), not stored.
//
// Round-to-nearest quantization (ties to even, through the format codec). Every cell of the
// scale grid gets its scale from its own values (a partial last cell: from the values it has), the
// scale is rounded to the scale format, and the codes are computed with the ROUNDED scale, so that
// dequantization is exactly
//   (decode(code) − zero) · scale · global_scale.
// Values that land outside the element range saturate to it (never Inf, never wrap).
//   zp=none   scale = amax / element max (absmax maps the largest |w| onto the largest value)
//             e8m0 scales: the OCP MX rule 2^(floor(log2 amax) − floor(log2 element max)); the
//             largest elements may then exceed the element range and saturate (the spec's rule)
//             ternary: BitNet b1.58 absmean, scale = mean |w| of the cell
//   zp=mid    scale = 2 · amax / (2^b − 1), zero 2^(b−1): [−amax, amax] spans all 2^b codes
//             and rounding stays within half a step up to the edges (GPTQ's symmetric rule)
//   zp=int    [min, max] widened to contain 0, scale = (max − min) / (2^b − 1),
//             zero = clamp(round(−min / rounded scale), 0, 2^b − 1)
//   zp=float  [min, max] as is (widened to 0 only for a constant cell), scale as for int,
//             zero = −min / rounded scale, itself rounded to the scale format
//   global    (NVFP4) global_scale = amax(tensor) / (element max · scale-format max), rounded
//             to fp32 (e2m1 with ue4m3: amax / (6 · 448)); cell scales are then computed for
//             w / global_scale. It multiplies on dequantization (the reciprocal of the
//             "global scale" some checkpoints store); 1 when that is not a normal fp32 value.
// Degenerate cells never give NaN/Inf weights: an all-zero cell gets scale 1 (codes 0), a
// scale that underflows the scale format its smallest positive value, one that overflows its
// largest finite value (the elements then saturate).
// Activations follow the same rules per ActivationQuant: per token / per group / MX / NV
// absmax, NV with an fp32 tensor scale; StaticTensor takes the calibrated scale as given.
#pragma once

#include <cstdint>
#include <vector>

#include "qgemm/scheme.hpp"

namespace qgemm {

struct PackedWeight {
  WeightQuant quant;
  std::int64_t n = 0, k = 0;
  std::vector<std::uint8_t> codes;
  std::vector<std::uint8_t> scales;
  std::vector<std::uint8_t> zeros;  // empty unless quant.zero_point is Integer or Float
  double global_scale = 1.0;        // 1 unless quant.global_scale (then an fp32 value)

  std::int64_t row_bytes() const;
  ScaleGrid scale_grid() const { return weight_scale_grid(quant, n, k); }
};

struct PackedActivation {
  ActivationQuant quant;
  std::int64_t m = 0, k = 0;
  std::vector<std::uint8_t> codes;   // unquantized activations: the fp16/bf16 codes
  std::vector<std::uint8_t> scales;  // empty when unquantized; StaticTensor: its one scale
  double tensor_scale = 1.0;         // NV: the fp32 tensor scale (as global_scale); else 1

  std::int64_t row_bytes() const;
  ScaleGrid scale_grid() const { return activation_scale_grid(quant, m, k); }
};

// Bit packing of one row (or any run) of codes, in the canonical order above.
void pack_codes(const std::uint32_t* codes, std::int64_t count, int bits, std::uint8_t* out);
void unpack_codes(const std::uint8_t* packed, std::int64_t count, int bits, std::uint32_t* out);
std::uint32_t read_code(const std::uint8_t* row, std::int64_t index, int bits);

// Round-to-nearest quantization of w[n, k] (row-major fp32). Rejects NaN/Inf weights, zero
// sizes and invalid schemes, with an Error naming them; any K suits any group (the last group
// is shorter). Multithreaded.
PackedWeight quantize_weight(const WeightQuant& quant, const float* weight, std::int64_t n,
                             std::int64_t k);
// Exact dequantization to double, row-major [n, k].
std::vector<double> dequantize_weight(const PackedWeight& weight);
// Error(InvalidArgument) naming `function` and the field unless `weight` is well formed: a
// valid scheme for its shape, and codes, scales and zeros of exactly the packed sizes.
void check_packed_weight(const PackedWeight& weight, const char* function);

// Quantizes a[m, k] as `quant` says (unquantized: rounds to fp16/bf16 and rejects values that
// would overflow to Inf). `static_scale` is the calibrated scale for StaticTensor (ignored
// otherwise; ≤ 0 means "use this tensor's absmax"); it is rounded to the scale format and
// stored in `scales` like any other scale. Same input checks as quantize_weight.
PackedActivation quantize_activation(const ActivationQuant& quant, const float* activation,
                                     std::int64_t m, std::int64_t k, double static_scale = 0.0);
std::vector<double> dequantize_activation(const PackedActivation& activation);

}  // namespace qgemm
