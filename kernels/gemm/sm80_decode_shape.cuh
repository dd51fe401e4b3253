// The shape of the streamed decode GEMM (gemm/sm80_decode.cuh, M ≤ 16): threads and shared
// memory as constexpr functions that the kernel evaluates at compile time and the dispatcher
// (src/dispatch/mma_family.cpp) at run time.
//
//   block    warps × 32 threads, every warp with a private ring of `stages` stages
//   one warp [zero row: stage_k · 2 B] [stage 0] ... [stage stages − 1]
//   a stage  W  stage_blocks × 32 lanes × bits words
//            A  rows × (stage_k · 2 + 16) bytes (16 B pad: the 8 rows of an ldmatrix on 8
//               different bank quads)
//            S  scale rows × 64 floats (the stage's groups), then as many zero rows
//   shared   warps × one warp, or the cross-warp sum when that is larger (it reuses the
//            pipeline's memory): warps × (16 or 32 values) × 32 lanes floats (the dense
//            kernels' warp 0 keeps its own in registers; grouped, every warp's go through it)
#pragma once

#include "common/host_device.cuh"

namespace qgemm::kernels {

// One config of the family; `rows` is the instantiation's A rows (M rounded up to 1, 2, 4, 8
// or 16).
struct DecodeTile {
  int rows = 1, warps = 4, stage_blocks = 8, stages = 3;
};

struct DecodeShape {
  int threads = 0, stage_k = 0;
  int w_bytes = 0, a_row_bytes = 0, a_bytes = 0, scale_rows = 0, s_bytes = 0, stage_bytes = 0;
  int zero_row_bytes = 0, warp_bytes = 0, pipeline_bytes = 0, reduce_bytes = 0, shared_bytes = 0;
};

QGEMM_HOST_DEVICE constexpr DecodeShape decode_shape(DecodeTile t, int bits, int group,
                                                     bool stored_zeros) {
  DecodeShape s;
  s.threads = 32 * t.warps;
  s.stage_k = t.stage_blocks * 16;
  s.w_bytes = t.stage_blocks * 32 * bits * 4;
  s.a_row_bytes = s.stage_k * 2 + 16;
  s.a_bytes = t.rows * s.a_row_bytes;
  s.scale_rows = (group == 0 || group >= s.stage_k) ? 1 : s.stage_k / group;
  s.s_bytes = s.scale_rows * 64 * 4 * (stored_zeros ? 2 : 1);
  s.stage_bytes = s.w_bytes + s.a_bytes + s.s_bytes;
  s.zero_row_bytes = s.stage_k * 2;
  s.warp_bytes = s.zero_row_bytes + t.stages * s.stage_bytes;
  s.pipeline_bytes = t.warps * s.warp_bytes;
  s.reduce_bytes = t.warps * (t.rows > 8 ? 32 : 16) * 32 * 4;
  s.shared_bytes = s.pipeline_bytes > s.reduce_bytes ? s.pipeline_bytes : s.reduce_bytes;
  return s;
}

// Why the config cannot be instantiated (nullptr when it can): the rules the kernel
// static_asserts.
QGEMM_HOST_DEVICE constexpr const char* decode_tile_error(DecodeTile t, int group) {
  if (!(t.rows == 1 || t.rows == 2 || t.rows == 4 || t.rows == 8 || t.rows == 16))
    return "decode instantiations take 1, 2, 4, 8 or 16 rows";
  if (t.stages < 2) return "a warp's ring needs two stages";
  const int stage_k = t.stage_blocks * 16;
  if (group != 0 && (group % 16 != 0 || (group % stage_k != 0 && stage_k % group != 0)))
    return "the weight group must be a multiple of 16 that divides the stage's K or is a "
           "multiple of it";
  return nullptr;
}

}  // namespace qgemm::kernels
