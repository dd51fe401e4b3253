// Arguments of the two kernels around cuBLAS in the dequantize + cuBLAS path
// (gemm/dequant_cublas.cuh). Plain structs: the host (src/api/engine.cpp) fills the very ones the
// kernels read.
#pragma once

namespace qgemm::kernels {

// Rows [n_begin, n_begin + rows) of a prepared mma weight (gemm/mma_weight_layout.cuh) ->
// out[rows][k] 16-bit, without the global scale (cuBLAS's alpha applies it).
struct MmaDequantizeArgs {
  const unsigned* words;  // prepared codes
  const float* scales;    // [groups][n_padded], lane-permuted columns
  const float* zeros;     // same shape, or null
  unsigned short* out;    // [rows][k] bf16 / fp16 bits
  long long n_begin, rows, k;
  long long k_blocks, n_padded;
  int group_size;  // 0: one scale row for all of K
};

// fp32 sums[m][cols] (row stride cols) -> C columns [n_begin, n_begin + cols): · row factor,
// + bias, in the output type.
struct FinishGemmArgs {
  const float* sums;
  const float* row_factors;  // [m] factors of A's rows (quantized activations), or null
  const float* bias;         // [N] fp32, or null (indexed from n_begin)
  void* c;            // C[m][ldc], already offset to column n_begin
  long long m, cols, ldc, n_begin;
};

}  // namespace qgemm::kernels
