// The argument struct of the SM90 wgmma GEMM (gemm/sm90_wgmma.cuh), plain C++ so that the host
// fills the very same struct it passes to cuLaunchKernel. The kernel takes it as a
// __grid_constant__ parameter: TMA reads the activations' tensor map from parameter space.
#pragma once

namespace qgemm::kernels {

// CUtensorMap's storage (cuda.h: 128 bytes, 128-byte aligned; the host static_asserts the
// match), so that this header needs no driver header under NVRTC.
struct alignas(128) TensorMapStorage {
  unsigned long long opaque[16];
};

struct WgmmaGemmParams {
  // A [M, K] bf16/fp16 as a 2-D tensor map: dims {K, M}, box {64, tokens}, 128-byte swizzle,
  // zero fill past K and M.
  TensorMapStorage activations;
  const unsigned* w;    // prepared codes (gemm/wgmma_weight_layout.cuh)
  const float* scales;  // [groups][n_padded], thread-permuted
  const float* zeros;   // same shape, or null
  void* c;              // [M, ldc] output
  const float* bias;    // [N] fp32, or null
  const float* row_factors;  // [M] fp32 factors of A's rows, or null
  float* workspace;     // split-K: [m_blocks][n_tiles][64 · tokens] fp32 (the accumulators'
                        // order, gemm/sm90_wgmma.cuh), zero between calls
  unsigned* counters;   // split-K: one per (token block, weight tile), zero between calls
  // FP8 tiles with 1x128 activation groups (act=e4m3_g128): the fp32 scale of token m's group g
  // at act_scales[m · act_scale_stride + g] (the canonical grid, ceil(K / 128) a row); else null.
  const float* act_scales;
  long long act_scale_stride;
  long long ldc;
  int m, n, k;
  int n_padded, n_tiles, k_chunks, groups;
  int n_blocks, m_blocks, splits, chunks_per_split;
  float global_scale;
  float glu_alpha, glu_limit;  // a fused clamped SwiGLU's (grouped, kGlu)
  // Grouped (MoE) GEMM over the indexed layout (include/qgemm/moe.hpp), null: dense. A's rows
  // are the routed rows in expert order; the units cover the token blocks below the routed
  // total (*routed_total, read on the device; m_blocks covers the capacity); token block b lies
  // in routing block b / blocks_per_route, whose expert is block_experts[that]. The experts'
  // prepared weights are back to back (expert e's tiles from e · n_tiles, its scale and zero
  // rows from e · groups), their biases too (e · n floats in).
  const int* block_experts;
  const int* routed_total;
  int blocks_per_route;
  // Rows grouped in place by the caller (moe/routing_args.cuh, MoeRowBlocksArgs): token block
  // b's token l is row load0 + l of A and C, stored for l in [skip, skip + count) (the fields of
  // its table entry; its expert block_experts[b], blocks_per_route 1); null: the indexed layout
  // above.
  const int* row_blocks;
};

}  // namespace qgemm::kernels
