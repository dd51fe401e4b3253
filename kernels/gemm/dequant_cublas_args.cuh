// Arguments of the two kernels around cuBLAS in the dequantize + cuBLAS path
// (gemm/dequant_cublas.cuh). Plain structs: the host (src/api/engine.cpp) fills the very ones the
// kernels read.
#pragma once

namespace qgemm::kernels {

// Rows [n_begin, n_begin + rows) of a prepared mma weight (gemm/mma_weight_layout.cuh) ->
// out[rows][ld_out] 16-bit, without the global scale (cuBLAS's alpha applies it); the group size
// is the kernel's template parameter. Columns [k, round_up(k, 8)) of each row are written as
// zero, columns from round_up(k, 8) to ld_out are not written. The host checks the rules
// (src/runtime/mma_dequantize_launch.cpp): n_begin a multiple of 64, ld_out ≥ k and a multiple
// of 8, out 16-byte aligned.
struct MmaDequantizeArgs {
  const unsigned* words;  // prepared codes
  const float* scales;    // [groups][n_padded], lane-permuted columns
  const float* zeros;     // same shape, or null (read only by the zero modes that store them)
  unsigned short* out;    // [rows][ld_out] bf16 / fp16 bits
  long long n_begin, rows, k, ld_out;
  long long k_blocks, n_padded;
};

// fp32 sums[m][cols] (row stride cols) -> C columns [n_begin, n_begin + cols): · row factor,
// + bias, in the output type.
struct FinishGemmArgs {
  const float* sums;
  const float* row_factors;  // [m] factors of A's rows (quantized activations), or null
  const float* bias;         // [N] fp32, or null (indexed from n_begin)
  void* c;                   // C[m][ldc], already offset to column n_begin
  long long m, cols, ldc, n_begin;
};

}  // namespace qgemm::kernels
