// The prepared weight of the mma.sync GEMM family, built on the host from the canonical packed
// weight (the CPU twin of the device repack). The layout is drawn in
// kernels/gemm/mma_weight_layout.cuh, whose index functions this code calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qgemm/quant.hpp"

namespace qgemm::layout {

// = kernels::MmaZeroMode (kernels/dequant/mma_dequant.cuh), and the JIT family's "zero" choice.
enum class MmaZeroMode { None = 0, Constant = 1, Integer = 2, Float = 3 };
const char* mma_zero_mode_name(MmaZeroMode mode);  // "none" "constant" "int" "float"

// Which fragment order the words follow: the mma.sync family's (kernels/gemm/
// mma_weight_layout.cuh, k16 blocks of a 64-row slice per warp) or the SM90 wgmma family's
// (kernels/gemm/wgmma_weight_layout.cuh, k64 chunks of a 64-row tile per warpgroup). Sizes,
// scales and flags mean the same in both; only the permutations differ.
enum class FragmentOrder { Mma, Wgmma };
const char* fragment_order_name(FragmentOrder order);  // "mma" "wgmma"
// Where column n of a scale (or zero) row is stored in that order.
std::int64_t scale_column(FragmentOrder order, std::int64_t n);
// The k16 blocks a weight of K columns stores in that order: ceil(K / 16), rounded up to whole
// k64 chunks in the wgmma order.
std::int64_t stored_k_blocks(FragmentOrder order, std::int64_t k);

struct MmaWeight {
  FragmentOrder order = FragmentOrder::Mma;
  Format format;
  std::int64_t n = 0, k = 0;
  std::int64_t n_padded = 0, k_blocks = 0;  // k16 blocks (a multiple of 4 in the wgmma order)
  int groups = 1;
  int group_size = 0;  // K values per scale row; 0: one row for all of K
  MmaZeroMode zero_mode = MmaZeroMode::None;
  double global_scale = 1.0;
  // Whether every scale (and scale × code range) is exact and normal in bf16 / fp16, which
  // lets integer weights take the packed16 dequantization (dequant/mma_dequant.cuh).
  bool scales_exact_in_bf16 = false;
  bool scales_exact_in_fp16 = false;
  // mma order: [n_padded / 64][k_blocks][32 lanes][bits]; wgmma order:
  // [n_padded / 64][k_blocks / 4][128 threads][bits]
  std::vector<std::uint32_t> words;
  std::vector<float> scales;  // [groups][n_padded], columns permuted by the order's scale_column
  std::vector<float> zeros;          // same shape, empty unless stores_zeros()

  // Whether the layout carries a zero array (integer or float zero points per group).
  bool stores_zeros() const {
    return zero_mode == MmaZeroMode::Integer || zero_mode == MmaZeroMode::Float;
  }
};

// Whether the packed16 dequantization serves this weight against `activation` (bf16 / fp16).
bool packed16_dequant_applies(const MmaWeight& weight, const Format& activation);

// Which unscaled dequantization of the decode kernel (kernels/dequant/mma_dequant.cuh) serves
// this weight against `activation` (bf16 / fp16): "int16", "int_f32" or "float16"; nullopt, with
// the reason in *why, when none does (those weights take the tiled kernel).
std::optional<std::string> unscaled_dequant(const MmaWeight& weight, const Format& activation,
                                            std::string* why = nullptr);

// Which byte dequantization of the 8-bit mma (kernels/dequant/mma_dequant.cuh, lane_bytes)
// serves this weight against 8-bit `activation` (int8 / e4m3): "bytes" (integer codes against
// int8, e4m3 codes against e4m3), "bytes_int16" / "bytes_float16" (e4m3 activations, weights
// whose every value e4m3 holds); nullopt, with the reason in *why, when none does.
std::optional<std::string> byte_dequant(const MmaWeight& weight, const Format& activation,
                                        std::string* why = nullptr);

// Why the mma family cannot hold this weight (nullopt when it can).
std::optional<std::string> mma_unsupported_reason(const WeightQuant& quant);

// The prepared weight's sizes, groups and zero mode for a quantization at N x K, without the
// scale flags (they depend on the scale values) or arrays. Throws Unsupported with
// mma_unsupported_reason.
MmaWeight mma_shape(const WeightQuant& quant, std::int64_t n, std::int64_t k,
                    double global_scale = 1.0, FragmentOrder order = FragmentOrder::Mma);

// Whether a scale lets the packed16 dequantization of `bits`-bit integer codes run exactly in
// `type` (bf16 / fp16): the scale itself exact and normal there, times 2^bits still finite.
bool packed16_scale_exact(double scale, const Format& type, int bits);

// The prepared weight's sizes, groups, zero mode and scale flags, without its arrays. Throws
// Unsupported with mma_unsupported_reason.
MmaWeight mma_metadata(const PackedWeight& weight, FragmentOrder order = FragmentOrder::Mma);

// Repacks a canonical packed weight on the host (metadata and arrays).
MmaWeight repack_for_mma(const PackedWeight& weight, FragmentOrder order = FragmentOrder::Mma);

// The dequantized value the kernel reconstructs at (n, k) before rounding to 16 bits, computed
// from the prepared layout alone (tests compare it with dequantize_weight).
double mma_weight_value(const MmaWeight& weight, std::int64_t n, std::int64_t k);

}  // namespace qgemm::layout
