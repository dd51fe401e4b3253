// Quantization schemes: how a weight and an activation are quantized and what the GEMM emits.
//
//   weight     w[n, k] = scale(n, k) · (decode(q[n, k]) − zero(n, k)) · global_scale
//   activation a[m, k] = scale(m, k) · decode(q[m, k]) · tensor_scale   (or a bf16/fp16 value)
//   output     C = A · Wᵀ (+ bias), rounded once to `output`
//
// Compact text form (what to_string prints and parse_scheme reads besides preset names):
//
//   w=<fmt>[:<wgran>][:s=<fmt>][:zp=<none|mid|int|float>][:global] ; a=<fmt>[:<agran>][:s=<fmt>] ;
//   o=<fmt>
//
//   wgran : ch (per output channel) | g<G> (group of G along K) | b<BN>x<BK> (2-D block) | t
//   (tensor) agran : t (static per tensor) | tok (dynamic per token) | g<G> (dynamic per group
//   along K)
//           | mx (1x32, e8m0 scales) | nv (1x16, ue4m3 scales and an fp32 tensor scale)
//   zp    : mid = the unsigned midpoint 2^(b-1) (GPTQ "symmetric"); int = a stored integer
//           zero point of the weight's width per scale; float = a stored zero in the scale format
//
// e.g. w4a16 = "w=uint4:g128:s=bf16:zp=mid;a=bf16;o=bf16". Defaults: weight g128 bf16 scales,
// zp=none; quantized activations tok with fp32 scales; output bf16.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qgemm/format.hpp"

namespace qgemm {

enum class WeightGranularity : std::uint8_t { PerTensor, PerChannel, Group, Block };
enum class ZeroPoint : std::uint8_t { None, Midpoint, Integer, Float };
enum class ActivationScaling : std::uint8_t {
  None,          // unquantized fp16/bf16
  StaticTensor,  // one fp32 scale for the whole tensor, given ahead (calibrated)
  DynamicToken,  // one fp32 scale per row, computed from the row's absmax
  DynamicGroup,  // one fp32 scale per `group` values along K
  MX,            // OCP MX: 1x32 blocks, e8m0 scales
  NV,            // NVFP4: 1x16 blocks, ue4m3 scales, and an fp32 tensor scale
};

struct WeightQuant {
  Format format = formats::uint4;
  WeightGranularity granularity = WeightGranularity::Group;
  int group = 128;               // Group: values along K that share a scale
  int block_n = 0, block_k = 0;  // Block: the 2-D scale block
  Format scale_format = formats::bf16;
  ZeroPoint zero_point = ZeroPoint::None;
  bool global_scale = false;  // a second-level fp32 scale over the tensor (NVFP4)
};

struct ActivationQuant {
  Format format = formats::bf16;  // fp16 / bf16: unquantized
  ActivationScaling scaling = ActivationScaling::None;
  int group = 0;  // DynamicGroup: 16/32/64/128; MX: 32; NV: 16
  Format scale_format = formats::fp32;
  bool is_quantized() const { return scaling != ActivationScaling::None; }
};

struct Scheme {
  std::string name;  // the preset it came from, empty otherwise (not part of ==)
  WeightQuant weight;
  ActivationQuant activation;
  Format output = formats::bf16;
};

bool operator==(const WeightQuant& a, const WeightQuant& b);
bool operator==(const ActivationQuant& a, const ActivationQuant& b);
bool operator==(const Scheme& a, const Scheme& b);  // ignores `name`

// A preset name ("w4a16", "nvfp4", ...) or the compact text form. Validates the result.
Scheme parse_scheme(std::string_view text);
// The compact text form; parse_scheme(to_string(s)) == s.
std::string to_string(const Scheme& scheme);
// Throws qgemm::Error (InvalidArgument) naming the field, its value and the rule.
void validate(const Scheme& scheme);
// Checks a problem shape against the scheme: sizes ≥ 1. Any K suits any group size (the last
// group of a row is then shorter; see ScaleGrid).
void validate_shape(const Scheme& scheme, std::int64_t m, std::int64_t n, std::int64_t k);

struct Preset {
  std::string name;
  std::string description;
  Scheme scheme;
};
const std::vector<Preset>& presets();

// The scale grid of a weight [n, k]: rows × cols scales, each covering rows_per × cols_per
// weights. Cells start at multiples of rows_per / cols_per and the last row / column of cells
// may be partial: groups of G along K give ceil(K / G) columns, the last one covering the
// K − (cols − 1)·G values that remain (K = 2880, G = 128: 23 columns, the last of 64 values),
// the way GPTQ/AWQ checkpoints store it; 2-D blocks alike in both directions.
//
//   k:     0 ........ G ........ 2G ...... (cols−1)·G ..... K
//   cell:  [   col 0   |   col 1   | ...   |  col cols−1  ]   (the last one shorter)
struct ScaleGrid {
  std::int64_t rows = 1, cols = 1;
  std::int64_t rows_per = 1, cols_per = 1;
  std::int64_t count() const { return rows * cols; }
};
ScaleGrid weight_scale_grid(const WeightQuant& weight, std::int64_t n, std::int64_t k);
// The scale grid of an activation [m, k] (rows = m for per-token and finer).
ScaleGrid activation_scale_grid(const ActivationQuant& activation, std::int64_t m, std::int64_t k);

}  // namespace qgemm
