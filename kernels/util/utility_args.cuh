// Kernel arguments of the utility kernels. Plain structs with no device-only types, included by
// the kernels and by the host launcher (src/runtime/utility_kernels.cpp), so both sides agree on
// the parameter layout by construction.
#pragma once

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

struct QuantizeActivationArgs {
  const unsigned short* input;  // [m][k] bf16 or fp16 bits
  unsigned char* codes;         // [m][k] 8-bit codes (canonical packing of an 8-bit format)
  float* scales;                // [m] fp32: row = scale · decode(code)
  long long m, k;
};

struct RepackWeightArgs {
  const unsigned char* codes;  // [n][row_bytes] canonical packed codes
  unsigned int* words;         // [ceil(k / codes_per_word)][n] (see util/repack.cuh)
  long long n, k;
  long long row_bytes;
};

}  // namespace qgemm::kernels
