// The shape of the SM90 wgmma GEMM (gemm/sm90_wgmma.cuh): threads, the stage's pieces and the
// shared memory, as constexpr functions that the kernel evaluates at compile time and the
// dispatcher (src/dispatch/wgmma_family.cpp) at run time.
//
//   block   warpgroup 0: the producer (one thread of warp 0 issues every copy); with
//           `transform`, warps 1-3 dequantize every weight tile of a chunk into shared memory
//           warpgroups 1 .. consumers: one 64-row weight tile each (block_n = 64 · consumers)
//   stage   A  stage_chunks boxes of tokens × 64 activations (128-byte rows, 128-byte swizzle,
//              1024-byte aligned: wgmma's B operand as TMA writes it); 8-bit codes (eight_bit):
//              stage_chunks / 2 boxes of tokens × 128 one-byte codes, a box per two chunks
//           W  consumers × stage_chunks × 128 threads × bits words (gemm/wgmma_weight_layout.cuh)
//           S  scale rows × block_n floats (the stage's groups), then as many zero rows
//           (the stage rounded up to 1024 bytes)
//   dequantized weight (transform only): kWgmmaTransformBuffers buffers of one chunk, each
//           consumers tiles of 64 rows × 64 k 16-bit values in the same K-major 128-byte-swizzled
//           rows as A (wgmma's A operand from shared memory), 8 KB a tile
//   staging (16-bit outputs): per consumer, epilogue_tokens rows × 64 outputs (128-byte rows):
//           the accumulators transposed by stmatrix so that C is written along its rows
//   activation group scales (8-bit tiles): per consumer, two slots of tokens floats (the 1x128
//           group scales of its token block for two groups in turn)
//   shared  [1024 alignment slack] [stage 0] ... [stage stages − 1] [dequantized buffers]
//           [staging per consumer] [activation group scales per consumer (8-bit)]
//           [full, empty barriers per stage]
//           [filled, drained barriers per buffer] [one split-K flag per consumer]
#pragma once

#include "common/host_device.cuh"

namespace qgemm::kernels {

// How the weight is dequantized (dequant/wgmma_dequant.cuh); the spec's "dequant" parameter.
// kWgmmaE4m3 / kWgmmaS8: the weight's values as e4m3 / s8 codes (exact, unscaled) for the 8-bit
// wgmma against e4m3 / int8 activation codes (the tile's eight_bit).
enum WgmmaDequant {
  kWgmmaFp32 = 0,
  kWgmmaPacked16 = 1,
  kWgmmaFloat16 = 2,
  kWgmmaE4m3 = 3,
  kWgmmaS8 = 4
};

// Chunks the transform warps may run ahead of the consumers, and how many there are (warps 1-3
// of the producer's warpgroup: a fourth warpgroup would cap every thread at 128 registers,
// fewer than a 64×256 wgmma's 128 accumulators need).
inline constexpr int kWgmmaTransformBuffers = 2;
inline constexpr int kWgmmaTransformWarps = 3;

struct WgmmaTile {
  int consumers = 2;      // consumer warpgroups: 1 to 4
  int tokens = 128;       // wgmma N: 8, 16, 32, 64, 128 or 256
  int stage_chunks = 1;   // K chunks of 64 per stage: 1, 2 or 4
  int stages = 4;
  bool transform = false; // transform warps dequantize into shared memory (the consumers'
                          // wgmma read both operands there); else each consumer dequantizes its
                          // tile into registers
  bool eight_bit = false; // 8-bit activation codes (e4m3 or int8, as the spec's act says) and
                          // the 8-bit wgmma (m64nNk32): the weight becomes e4m3 or s8 codes in
                          // registers, every scale group is promoted
};

struct WgmmaShape {
  int threads = 0, block_n = 0, stage_k = 0;
  int a_box_bytes = 0, a_bytes = 0, w_chunk_bytes = 0, w_tile_bytes = 0, w_bytes = 0;
  int scale_rows = 0, s_row_bytes = 0, s_bytes = 0, stage_bytes = 0;
  int dequantized_offset = 0, dequantized_tile_bytes = 0, dequantized_buffer_bytes = 0;
  int epilogue_tokens = 0, epilogue_offset = 0, epilogue_bytes = 0;
  int act_scales_offset = 0, act_scales_bytes = 0;  // per consumer; 0 bytes unless eight_bit
  int barriers_offset = 0, flags_offset = 0, shared_bytes = 0;
};

QGEMM_HOST_DEVICE constexpr int round_up_to(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

QGEMM_HOST_DEVICE constexpr WgmmaShape wgmma_shape(WgmmaTile t, int bits, int group,
                                                   bool stored_zeros) {
  WgmmaShape s;
  s.threads = 128 * (1 + t.consumers);
  s.block_n = 64 * t.consumers;
  s.stage_k = 64 * t.stage_chunks;
  s.a_box_bytes = t.tokens * 128;
  s.a_bytes = (t.eight_bit ? t.stage_chunks / 2 : t.stage_chunks) * s.a_box_bytes;
  s.w_chunk_bytes = 128 * bits * 4;
  s.w_tile_bytes = t.stage_chunks * s.w_chunk_bytes;
  s.w_bytes = t.consumers * s.w_tile_bytes;
  s.scale_rows = (group == 0 || group >= s.stage_k) ? 1 : s.stage_k / group;
  s.s_row_bytes = s.block_n * 4;
  s.s_bytes = s.scale_rows * s.s_row_bytes * (stored_zeros ? 2 : 1);
  s.stage_bytes = round_up_to(s.a_bytes + s.w_bytes + s.s_bytes, 1024);
  s.dequantized_offset = 1024 + t.stages * s.stage_bytes;
  s.dequantized_tile_bytes = t.transform ? 64 * 64 * 2 : 0;
  s.dequantized_buffer_bytes = t.consumers * s.dequantized_tile_bytes;
  s.epilogue_offset =
      s.dequantized_offset + (t.transform ? kWgmmaTransformBuffers : 0) * s.dequantized_buffer_bytes;
  s.epilogue_tokens = t.tokens < 32 ? t.tokens : 32;
  s.epilogue_bytes = s.epilogue_tokens * 128;
  s.act_scales_offset = s.epilogue_offset + t.consumers * s.epilogue_bytes;
  s.act_scales_bytes = t.eight_bit ? 2 * t.tokens * 4 : 0;
  s.barriers_offset = s.act_scales_offset + t.consumers * s.act_scales_bytes;
  const int barriers = 2 * t.stages + (t.transform ? 2 * kWgmmaTransformBuffers : 0);
  s.flags_offset = s.barriers_offset + barriers * 8;
  s.shared_bytes = s.flags_offset + 4 * t.consumers;
  return s;
}

// Whether the consumers keep the group scales out of the weights: they multiply the unscaled
// weight (u − zero, exact in 16 bits) in wgmma and scale each group's fp32 sums once, in two
// accumulator sets that alternate by group (one is scaled into the result while the next
// group's wgmma run). That trades one multiply per pair of weights (HMUL2, a quarter of the
// dequantization) for a few FFMA per group; it needs the group to cover whole 64-K chunks (or
// the whole row: channel and tensor scales, applied once at the end) and registers for three
// accumulator sets (token widths up to 64). The fp32 path rounds scaled values: it keeps the
// scale in the weights; so do the transform warps (their dequantization is off the consumers'
// path).
//
// The 8-bit tiles always promote (their e4m3 / s8 weights hold no scale; wgmma_tile_error keeps
// their groups whole chunks), up to 128 tokens: with one accumulator set for the group (two above
// 64 tokens would not fit the registers), so that a group's sums are scaled in after its last
// wgmma has completed and before the next group's first one starts (wgmma_promote_sets).
QGEMM_HOST_DEVICE constexpr bool wgmma_promotes_scales(WgmmaTile t, int group, int dequant) {
  if (t.eight_bit) return true;
  return !t.transform && t.tokens <= 64 && dequant != kWgmmaFp32 && group % 64 == 0;
}
// Group accumulator sets of a promoting tile: two that alternate by group up to 64 tokens, one
// above (8-bit at 128 tokens).
QGEMM_HOST_DEVICE constexpr int wgmma_promote_sets(WgmmaTile t) { return t.tokens <= 64 ? 2 : 1; }

// K chunks a split must be a multiple of: whole stages, and whole groups where the scales are
// promoted (a group's sums are scaled once, by the split that holds all of it).
QGEMM_HOST_DEVICE constexpr int wgmma_split_step(WgmmaTile t, int group, int dequant) {
  const int group_chunks = wgmma_promotes_scales(t, group, dequant) && group > 0 ? group / 64 : 1;
  int step = t.stage_chunks;
  while (step % group_chunks != 0) step += t.stage_chunks;
  return step;
}

// Why the config cannot be instantiated for this weight (nullptr when it can): the rules the
// kernel static_asserts.
QGEMM_HOST_DEVICE constexpr const char* wgmma_tile_error(WgmmaTile t, int group) {
  if (t.consumers < 1 || t.consumers > 4) return "one to four consumer warpgroups";
  if (t.transform && t.consumers != 2) return "the transform warps serve two consumers";
  if (!(t.tokens == 8 || t.tokens == 16 || t.tokens == 32 || t.tokens == 64 || t.tokens == 128 ||
        t.tokens == 256))
    return "wgmma tokens (N) of 8, 16, 32, 64, 128 or 256";
  if (!(t.stage_chunks == 1 || t.stage_chunks == 2 || t.stage_chunks == 4))
    return "stages of 1, 2 or 4 K chunks of 64";
  if (t.stages < 2) return "the ring needs two stages";
  const int stage_k = 64 * t.stage_chunks;
  if (group != 0 && (group % 16 != 0 || (group % stage_k != 0 && stage_k % group != 0)))
    return "the weight group must be a multiple of 16 that divides the stage's K or is a "
           "multiple of it";
  if (t.eight_bit) {
    if (t.transform) return "the 8-bit tiles dequantize in the consumers (no transform warps)";
    if (t.tokens > 128) return "8-bit tiles of at most 128 tokens (two accumulator sets)";
    if (t.stage_chunks % 2 != 0)
      return "8-bit stages of 2 or 4 K chunks (8-bit activations come in 128-K boxes)";
    if (group % 64 != 0)
      return "8-bit tiles promote each scale group: groups of whole 64-K chunks (or one per "
             "row)";
  }
  return nullptr;
}

}  // namespace qgemm::kernels
