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
// format, format.storage_bytes() bytes little-endian. Integer zero points: the same grid packed
// like codes (weight's width); float zero points: like scales.
//
// Round-to-nearest quantization: absmax scaling maps each block's largest |w| to the format's
// largest finite value (for e8m0 scales the OCP MX rule: 2^(floor(log2 amax) − emax_elem));
// asymmetric schemes (zp=int/float) map [min, max] of the block onto [0, 2^b − 1].
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
  std::vector<std::uint8_t> scales;  // empty when unquantized
  double tensor_scale = 1.0;         // NV: the fp32 tensor scale; StaticTensor: the scale

  std::int64_t row_bytes() const;
  ScaleGrid scale_grid() const { return activation_scale_grid(quant, m, k); }
};

// Bit packing of one row (or any run) of codes, in the canonical order above.
void pack_codes(const std::uint32_t* codes, std::int64_t count, int bits, std::uint8_t* out);
void unpack_codes(const std::uint8_t* packed, std::int64_t count, int bits, std::uint32_t* out);
std::uint32_t read_code(const std::uint8_t* row, std::int64_t index, int bits);

// Round-to-nearest quantization of w[n, k] (row-major fp32). Rejects NaN/Inf weights, zero
// sizes and K that the group size does not divide, with an Error naming them. Multithreaded.
PackedWeight quantize_weight(const WeightQuant& quant, const float* weight, std::int64_t n,
                             std::int64_t k);
// Exact dequantization to double, row-major [n, k].
std::vector<double> dequantize_weight(const PackedWeight& weight);

// Quantizes a[m, k] as `quant` says (unquantized: rounds to fp16/bf16). `static_scale` is the
// calibrated scale for StaticTensor (ignored otherwise; ≤ 0 means "use this tensor's absmax").
PackedActivation quantize_activation(const ActivationQuant& quant, const float* activation,
                                     std::int64_t m, std::int64_t k, double static_scale = 0.0);
std::vector<double> dequantize_activation(const PackedActivation& activation);

}  // namespace qgemm
