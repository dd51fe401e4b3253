// The argument struct of gemm/mma_repack.cuh, plain C++ shared with the host.
#pragma once

#include "common/host_device.cuh"

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
  // Gate_up experts prepared for a fused GLU (Engine::moe): the intermediate size I (n = 2·I
  // source rows, gate then up); the prepared rows then interleave them (glu_source_row).
  // 0: each row where it is.
  long long glu_inter;
};

// The source row of prepared row n of a gate_up weight prepared for a fused GLU, whose I gate
// rows and I up rows are interleaved in blocks of 8 so that each thread of the grouped GEMMs
// holds gate j and up j of its tokens (its accumulators' rows 8 apart, gemm/sm80_decode.cuh and
// gemm/sm90_wgmma.cuh):
//
//   prepared rows  0-7      8-15    16-23    24-31    ...   16b + r   16b + 8 + r
//   source rows    g 0-7    u 0-7   g 8-15   u 8-15   ...   g 8b + r  u 8b + r
//
// with g j = row j and u j = row I + j; −1 where 8b + r ≥ I (padding: code 0, scale 0). The
// prepared rows span 2 · round_up(I, 8) ≤ round_up(2 · I, 64), the padded rows.
QGEMM_HOST_DEVICE constexpr long long glu_source_row(long long n, long long inter) {
  const long long block = n / 8, column = (block / 2) * 8 + n % 8;
  if (column >= inter) return -1;
  return block % 2 == 0 ? column : inter + column;
}

// The rows whose scale (and zero) the repack writes: every source row where it is, or every
// padded row of a GLU-interleaved weight (those without a source are left zero).
QGEMM_HOST_DEVICE constexpr long long repack_scale_rows(const MmaRepackArgs& a) {
  return a.glu_inter > 0 ? a.n_padded : a.n;
}

}  // namespace qgemm::kernels
