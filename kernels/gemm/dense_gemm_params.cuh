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
  const float* bias;    // [N] fp32 (grouped: [experts][N]), or null
  union {
    // [M] fp32 factors of A's rows (quantized activations: A = operand · factor), or null
    const float* row_factors;
    // The grouped decode kernel over rows grouped in place by the caller (its rows are 16-bit,
    // never factored; moe/routing_args.cuh, MoeRowBlocksArgs): token block y's row l is row
    // load0 + l of A and C, stored for l in [skip, skip + count) (the fields of its table
    // entry; its expert block_experts[y], blocks_per_route 1); null: the indexed layout.
    const int* row_blocks;
  };
  // Split-K (zero between calls) — or, in the grouped (MoE) decode kernel, which never splits K
  // (gemm/sm80_decode.cuh, kGrouped): A holds the routed rows in expert order; grid.y walks
  // token blocks of the kernel's rows, token block y lies in routing block y / blocks_per_route,
  // whose expert is block_experts[that]; blocks at or past *routed_total (the routing's padded
  // total, read on the device) return at once. Unions, not new fields: the struct keeps its 128
  // bytes, and the dense kernels the code they compiled to before.
  union {
    float* workspace;          // split-K: [M, N] fp32
    const int* block_experts;  // grouped
  };
  union {
    unsigned* counters;       // split-K: one per output tile
    const int* routed_total;  // grouped
  };
  long long lda, ldc;
  // The grouped decode kernel with a fused clamped SwiGLU (kGlu) takes the GLU's limit and alpha
  // in two fields it has no other use for (its blocks are kRows rows, its K one tile range).
  union {
    int m;
    float glu_limit;
  };
  int n, k;
  int n_padded, k_blocks, groups;
  union {
    int k_tiles;  // ceil(k_blocks · 16 / BK)
    float glu_alpha;
  };
  union {
    int tiles_per_split;   // tiled kernel
    int blocks_per_route;  // grouped decode kernel
  };
  int blocks_per_warp;  // decode kernel: k16 blocks each warp streams (a multiple of its stage)
  float global_scale;
};
static_assert(sizeof(void*) != 8 || sizeof(DenseGemmParams) == 128,
              "the dense kernels' argument keeps its 128 bytes (the grouped fields share unions: "
              "at 136 ptxas allocated the dense decode kernels differently, up to 8 registers "
              "more)");

enum OutputType { kOutFp16 = 0, kOutBf16 = 1, kOutFp32 = 2 };

}  // namespace qgemm::kernels
