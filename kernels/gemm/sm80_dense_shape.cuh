// The shape of the tiled mma.sync GEMM (gemm/sm80_dense.cuh): threads, tile sizes and shared
// memory as constexpr functions that the kernel evaluates at compile time and the dispatcher
// (src/dispatch/mma_family.cpp) at run time, so the host never derives them a second time.
//
//   block tile  BM × BN × BK     BM = 16 · m_tiles · warps_m,  BN = 64 · warps_n,  BK = block_k
//   one stage   A  BM rows × BK operand elements (2 bytes, or 1 for int8/e4m3 codes)
//               W  warps_n slices × BK/16 k16 blocks × 32 lanes × bits words
//               S  scale rows × BN floats (the stage's groups), then as many zero rows
//   shared      stages × stage, or the cross-warp K reduction when that is larger (it reuses
//               the pipeline's memory): (warps_k − 1) · warps_m · warps_n warps × 32 lanes ×
//               m_tiles · 8 · 4 floats
#pragma once

#include "common/host_device.cuh"

namespace qgemm::kernels {

// One tile config of the family (the dispatcher's configs are lists of these).
struct DenseTile {
  int m_tiles = 1, warps_m = 1, warps_n = 1, warps_k = 1;
  int block_k = 64, stages = 4;
};

struct DenseShape {
  int threads = 0, block_m = 0, block_n = 0, k_blocks = 0;
  int scale_rows = 0;  // of one stage: 1 for groups of ≥ BK (or none), else BK / group
  int a_bytes = 0, b_bytes = 0, s_bytes = 0, stage_bytes = 0;
  int pipeline_bytes = 0, reduce_bytes = 0, shared_bytes = 0;
};

// `group`: K values per scale row (0: one row for all of K); `operand_bytes`: 2 for bf16/fp16
// activations, 1 for 8-bit codes (mma.m16n8k32).
QGEMM_HOST_DEVICE constexpr DenseShape dense_shape(DenseTile t, int bits, int group,
                                                   bool stored_zeros, int operand_bytes) {
  DenseShape s;
  s.threads = 32 * t.warps_m * t.warps_n * t.warps_k;
  s.block_m = 16 * t.m_tiles * t.warps_m;
  s.block_n = 64 * t.warps_n;
  s.k_blocks = t.block_k / 16;
  s.scale_rows = (group == 0 || group >= t.block_k) ? 1 : t.block_k / group;
  s.a_bytes = s.block_m * t.block_k * operand_bytes;
  s.b_bytes = t.warps_n * s.k_blocks * 32 * bits * 4;
  s.s_bytes = s.scale_rows * s.block_n * 4 * (stored_zeros ? 2 : 1);
  s.stage_bytes = s.a_bytes + s.b_bytes + s.s_bytes;
  s.pipeline_bytes = s.stage_bytes * t.stages;
  s.reduce_bytes = (t.warps_k - 1) * t.warps_m * t.warps_n * 32 * t.m_tiles * 8 * 4 * 4;
  s.shared_bytes = s.pipeline_bytes > s.reduce_bytes ? s.pipeline_bytes : s.reduce_bytes;
  return s;
}

// Why the tile cannot be instantiated for these operands (nullptr when it can): the rules the
// kernel static_asserts, for the dispatcher to state before it asks for a compile.
QGEMM_HOST_DEVICE constexpr const char* dense_tile_error(DenseTile t, int group,
                                                         int operand_bytes) {
  if (t.block_k * operand_bytes % 128 != 0) return "A rows of BK must span 8 16-byte chunks";
  if ((t.block_k / 16) % t.warps_k != 0) return "the K warps must share BK's k16 blocks evenly";
  if (group != 0 && (group % 16 != 0 || (group % t.block_k != 0 && t.block_k % group != 0)))
    return "the weight group must be a multiple of 16 that divides BK or is a multiple of it";
  if (operand_bytes == 1 && t.warps_k != 1) return "8-bit activations take one K warp";
  if (t.stages < 2) return "the pipeline needs two stages";
  return nullptr;
}

}  // namespace qgemm::kernels
