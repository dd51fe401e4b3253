// The argument struct of the dense mma.sync GEMMs (gemm/sm80_dense.cuh, gemm/sm80_decode.cuh),
// plain C++ so that the host fills the very same struct it passes to cuLaunchKernel.
#pragma once

namespace qgemm::kernels {

struct DenseGemmParams {
  const void* a;        // [M, lda] bf16/fp16, 16-byte aligned rows (lda % 8 == 0)
  const unsigned* b;    // prepared codes (mma_weight_layout.cuh)
  const float* scales;  // [groups][n_padded], lane-permuted
  const float* zeros;   // same shape, or null
  void* c;              // [M, ldc] output
  const float* bias;    // [N] fp32, or null
  // [M] fp32 factors of A's rows (quantized activations: A = operand · factor), or null
  const float* row_factors;
  float* workspace;     // split-K: [M, N] fp32, zero between calls
  unsigned* counters;   // split-K: one per output tile, zero between calls
  long long lda, ldc;
  int m, n, k;
  int n_padded, k_blocks, groups;
  int k_tiles;  // ceil(k_blocks · 16 / BK)
  int tiles_per_split;
  int blocks_per_warp;  // decode kernel: k16 blocks each warp streams (a multiple of its stage)
  float global_scale;
  // Grouped (MoE) decode only (gemm/sm80_decode.cuh, kGrouped; null and 0 otherwise): A holds
  // the routed rows in expert order; grid.y walks token blocks of the kernel's rows, token block
  // y lies in routing block y / blocks_per_route, whose expert is block_experts[that]; blocks at
  // or past *routed_total (the routing's padded total, read on the device) return at once.
  const int* block_experts;
  const int* routed_total;
  int blocks_per_route;
};

enum OutputType { kOutFp16 = 0, kOutBf16 = 1, kOutFp32 = 2 };

}  // namespace qgemm::kernels
