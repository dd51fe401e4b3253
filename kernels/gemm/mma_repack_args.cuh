// The argument struct of gemm/mma_repack.cuh, plain C++ shared with the host.
#pragma once

namespace qgemm::kernels {

struct MmaRepackArgs {
  // Canonical packed weight (include/qgemm/quant.hpp).
  const unsigned char* codes;   // [n][row_bytes]
  const unsigned char* scales;  // scale grid, codes of the scale format
  const unsigned char* zeros;   // integer zeros (packed per grid row) or float zeros, or null
  long long row_bytes, zero_row_bytes;
  long long n, k;
  long long grid_cols, rows_per, cols_per;  // the scale grid (qgemm::ScaleGrid)
  // The prepared weight (gemm/mma_weight_layout.cuh); outputs are zero-filled before launch.
  unsigned* words;
  float* scales_out;
  float* zeros_out;
  long long n_padded, k_blocks;
  int groups, group_size;
  float zero_offset;  // added to float zeros (2^(b-1) for signed formats, else 0)
  // The scale flags of the layout's metadata (util/scale_exactness.cuh), zeroed before launch:
  // bit 0 set where some scale is not exact for packed16 in bf16, bit 1 in fp16.
  unsigned* scale_inexact;
};

}  // namespace qgemm::kernels
