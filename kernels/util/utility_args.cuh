// Kernel arguments of the utility kernels. Plain structs with no device-only types, included by
// the kernels and by the host launcher (src/runtime/utility_kernels.cpp), so both sides agree on
// the parameter layout by construction.
#pragma once

#include "common/host_device.cuh"

namespace qgemm::kernels {

// Zero-point handling of dequantize_weight (the `zero` parameter of its spec).
enum ZeroPointCode { kNoZero = 0, kMidpointZero = 1, kIntegerZero = 2, kFloatZero = 3 };
// 16-bit output / input element types.
enum HalfTypeCode { kBf16 = 0, kFp16 = 1 };

struct DequantizeWeightArgs {
  const unsigned char* codes;   // [n][row_bytes] canonical packed codes
  const unsigned char* scales;  // [scale_rows][scale_cols] scale codes, scale_bytes each
  const unsigned char* zeros;   // integer: [scale_rows][zero_row_bytes] packed like codes;
                                // float: like scales; null otherwise
  unsigned short* out;          // [n][k] bf16 or fp16 bits
  long long n, k;
  long long row_bytes;
  long long scale_cols, scale_rows_per, scale_cols_per;
  long long zero_row_bytes;
  float global_scale;
};

// Activation scaling (the `scaling` parameter of quantize_activation / expand_activation): the
// order of qgemm::ActivationScaling without None.
enum ActivationScalingCode {
  kScaleStatic = 0,
  kScaleToken = 1,
  kScaleGroup = 2,
  kScaleMx = 3,
  kScaleNv = 4
};
// What quantize_activation writes (see util/quantize_activation.cuh).
enum ActivationEmitCode { kEmitCodes = 0, kEmitOperand = 1, kEmitOperand8 = 2 };

struct QuantizeActivationArgs {
  const unsigned short* input;  // [m][lda] bf16 or fp16 bits
  long long lda;
  unsigned char* codes;     // codes: [m][ceil(k · bits / 8)] canonical packed codes
  unsigned char* scales;    // codes: the scale of (row, cell) at scales[row · scale_row_stride
                            // + cell · scale_cell_stride] (below)
  float* tensor_scale;      // codes, NV: the fp32 tensor scale
  unsigned short* operand;  // operand: [m][ldo] 16-bit values
  unsigned char* operand8;  // operand8: [m][ldo] codes, K permuted (ldo = round_up(k, 16))
  long long ldo;
  float* row_factors;          // operand: [m]
  // operand: multiply each row's factor into its values before the one rounding to 16 bits
  // (dequantize + cuBLAS, which cannot scale rows) and write 1 as the factor; 0: keep them apart.
  int fold_row_factors;
  const float* tensor_absmax;  // NV, and static without a given scale: absmax of the tensor
  double static_scale;         // static: the given scale (an fp32 value), or 0
  double element_max;          // the code format's largest finite value
  double nv_denominator;       // NV: element_max · the scale format's largest value
  long long m, k;
  long long group;  // group / MX / NV: values per scale along K
  // Where codes mode writes scales. Canonical (the grid row-major): static row stride 0 (row 0
  // writes the one scale), token 1, group / MX / NV the cells per row, cell stride 1. cuBLASLt's
  // layouts (src/runtime/cublaslt.hpp) differ: 1x128 scales are [cell][m] (row stride 1, cell
  // stride m), and a static or per-token scale may be repeated per row (row stride 1) and per
  // K-block of 128 (scale_copies cells, cell stride m).
  long long scale_row_stride, scale_cell_stride;
  long long scale_copies;  // static / token: cells the row's scale is written to (≥ 1)
  // 1: input, codes and operand rows all start 16-byte aligned (k, lda, ldo and group multiples
  // of 8, the pointers 16-byte aligned) and the emission is not operand8, so threads take 8
  // values at a time; 0: one. Set by launch_quantize_activation.
  int vector8;
};

// How quantize_activation's warps walk short cells (group, MX, NV) of `group` values taken
// `width` at a time (8: one 16-byte load; 1): `lanes` lanes share a cell, each taking
// `per_lane` of its runs of `width` values, so a warp takes 32 / lanes cells at once. lanes is
// a power of two dividing the cell's runs (a lane's runs are strided by lanes · width, and a
// warp's loads stay contiguous). Width 8 aims at kShortCellHeldRuns runs a lane: the lane holds
// them in registers from the absmax to the emission (one read of the input, and a warp's 2 KB
// in flight at once where one 16-byte load a lane left the pass latency-bound: bench/NOTES.md).
// Width 1 (unaligned rows) keeps a lane per value up to 32: emit() pairs 4-bit codes across
// neighbouring lanes.
// (An enumerator, not a constexpr variable: NVRTC emits those as device symbols whose names
// hash the compilation, and a cubin must be the same bytes on every compile.)
enum : int { kShortCellHeldRuns = 4 };
struct ShortCellWalk {
  int lanes;
  long long per_lane;
  int cells_per_warp;
};
QGEMM_HOST_DEVICE constexpr ShortCellWalk short_cell_walk(long long group, int width) {
  const long long runs = group / width;
  const long long divisor = runs & -runs;  // the largest power of two dividing runs
  long long lanes = width == 8 ? divisor / kShortCellHeldRuns : divisor;
  lanes = lanes < 1 ? 1 : lanes > 32 ? 32 : lanes;
  return {static_cast<int>(lanes), runs / lanes, static_cast<int>(32 / lanes)};
}

// Canonical packed quantized activations -> the operand and row factors (operand mode above).
struct ExpandActivationArgs {
  const unsigned char* codes;
  const unsigned char* scales;
  float tensor_scale;  // NV's
  unsigned short* operand;
  unsigned char* operand8;  // operand "bytes": [m][ldo] codes in the 8-bit mma's K order
  long long ldo;
  float* row_factors;
  int fold_row_factors;  // as QuantizeActivationArgs'
  long long m, k;
  long long group;
};

struct TensorAbsmaxArgs {
  const unsigned short* input;  // [m][lda] bf16 or fp16 bits
  long long lda, m, k;
  float* absmax;  // one float, 0 before the launch
};

// quantize_weight (util/quantize_weight.cuh): the input type, and the launch's step.
enum WeightInputCode { kWeightBf16 = 0, kWeightFp16 = 1, kWeightFp32 = 2 };
enum WeightQuantizeStep { kWeightStats = 0, kWeightCells = 1, kWeightCodes = 2 };

struct QuantizeWeightArgs {
  const void* input;  // [n][ld] bf16, fp16 or fp32
  long long ld, n, k;
  // The scale grid (qgemm::ScaleGrid): cell (i, j) covers rows [i · rows_per, ...) and
  // columns [j · cols_per, ...), the last ones partial.
  long long grid_rows, grid_cols, rows_per, cols_per;
  // stats -> cells: per piece (row, grid column), [n][grid_cols]; the sums for absmean only.
  float* piece_min;
  float* piece_max;
  double* piece_sum_abs;
  unsigned long long* first_bad;  // the flat index r · k + c of the first non-finite element
                                  // (all ones before the launch: none)
  int second_level;               // 1: a global scale under the cell scales (NVFP4)
  double second_level_denominator;  // absmax denominator · the scale format's largest value
  float* tensor_absmax;             // second level: 0 before the stats step
  float* global_scale;              // cells writes it (1 without a second level); codes reads it
  // The canonical packed outputs (include/qgemm/quant.hpp).
  unsigned char* codes;   // [n][row_bytes]
  long long row_bytes;
  unsigned char* scales;  // [grid_rows][grid_cols] scale codes
  unsigned char* zeros;   // integer: [grid_rows][zero_row_bytes]; float: like scales; else null
  long long zero_row_bytes;
  // stats and codes: 1 when a row's inputs can be loaded 16 bytes at a time (k and ld multiples
  // of 8, the input 16-byte aligned). Set by quantize_weight_on_device.
  int vector8;
};

struct RepackWeightArgs {
  const unsigned char* codes;  // [n][row_bytes] canonical packed codes
  unsigned int* words;         // [ceil(k / codes_per_word)][n] (see util/repack.cuh)
  long long n, k;
  long long row_bytes;
};

}  // namespace qgemm::kernels
