// The launch shape of mma_dequantize (gemm/mma_dequantize.cuh): threads, shared memory, warp
// tile, staging swizzle and grid. The kernel is built from these constants and the host launch
// (src/runtime/mma_dequantize_launch.cpp) and the JIT spec (jit::mma_dequantize_spec) read the
// very same ones: nothing here is re-derived anywhere else.
//
//   warp tile   one 64-row slice × 4 k16 blocks = 64 rows × 64 k  (8 KiB of 16-bit output)
//   block       8 warps, each with its own 8 KiB staging region    (64 KiB dynamic smem)
//   grid        persistent: blocks_per_sm blocks per SM at most; warp w of block b takes tiles
//               b · 8 + w, then + 8 · gridDim.x, ...; tile t = slice · k_tiles + k tile, so
//               the 8 warps of a block read 8 consecutive tiles: one contiguous run of words.
//
// Staging region of a warp (64 rows × 128 bytes, 16-byte chunk c of row r at position
// c ^ (r % 8), the 128-byte XOR swizzle):
//
//   row r:  [ chunk 0^(r%8) | chunk 1^(r%8) | ... | chunk 7^(r%8) ]    8 × 16 B
//
//   writes  lane (q = lane / 4, t = lane % 4) stores word t of chunk 2b + h of row 8j + q:
//           banks 4 · ((2b + h) ^ q) + t, 32 distinct per instruction (no conflict);
//   reads   lane reads chunk lane % 8 of row 4i + lane / 8 (16 bytes): each quarter warp reads
//           one row's 8 chunks, 8 distinct positions (no conflict); then one 16-byte global store
//           per lane, 4 whole 128-byte row segments per warp instruction.
#pragma once

#include "gemm/mma_weight_layout.cuh"

namespace qgemm::kernels {

struct MmaDequantizeShape {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTileRows = MmaWeightLayout::kSliceN;             // 64
  static constexpr int kTileBlocks = 4;                                  // k16 blocks per warp tile
  static constexpr int kTileK = kTileBlocks * MmaWeightLayout::kBlockK;  // 64
  static constexpr int kChunkValues = 8;                                 // one 16-byte store
  static constexpr int kChunksPerRow = kTileK / kChunkValues;            // 8
  static constexpr int kRowBytes = kTileK * 2;                           // 128: one cache line
  static constexpr int kWarpSmemBytes = kTileRows * kRowBytes;           // 8 KiB
  static constexpr int kSmemBytes = kWarps * kWarpSmemBytes;             // 64 KiB
  // Output rows are 16-byte aligned: ld_out a multiple of 8 values.
  static constexpr int kLdOutMultiple = kChunkValues;

  // Byte offset, inside a warp's region, of 32-bit word `word` (0..31) of row `row`.
  QGEMM_HOST_DEVICE static constexpr unsigned staging_offset(unsigned row, unsigned word) {
    return row * kRowBytes + (((word / 4) ^ (row % 8)) * 16) + (word % 4) * 4;
  }

  // The same offsets as the kernel's unrolled loops use them, one lane-dependent base plus an
  // immediate each (tests/cpu check that they agree with staging_offset):
  //   write of word t of chunk c of row 8j + q   = 1024 · j + write_base(c, lane)
  //   read of chunk lane % 8 of row 4i + lane / 8 = 1024 · (i / 2) + read_base(i % 2, lane)
  QGEMM_HOST_DEVICE static constexpr unsigned write_base(unsigned chunk, unsigned lane) {
    return staging_offset(lane / 4, 4 * chunk + lane % 4);
  }
  QGEMM_HOST_DEVICE static constexpr unsigned read_base(unsigned odd, unsigned lane) {
    return staging_offset(4 * odd + lane / kChunksPerRow, 4 * (lane % kChunksPerRow));
  }

  // The smallest valid output leading dimension for K: K rounded up to 8.
  QGEMM_HOST_DEVICE static constexpr long long ld_out(long long k) {
    return (k + kLdOutMultiple - 1) / kLdOutMultiple * kLdOutMultiple;
  }
  QGEMM_HOST_DEVICE static constexpr long long k_tiles(long long k_blocks) {
    return (k_blocks + kTileBlocks - 1) / kTileBlocks;
  }
  // Warp tiles of `rows` rows starting on a slice (n_begin % 64 == 0) of a weight of k_blocks.
  QGEMM_HOST_DEVICE static constexpr long long tiles(long long rows, long long k_blocks) {
    return (rows + kTileRows - 1) / kTileRows * k_tiles(k_blocks);
  }
  // Blocks per SM the kernel is built for (its __launch_bounds__) and launched with, from the
  // registers a thread holds for a whole tile: its words (4 · bits), 8 scales per scale row and
  // as many zeros where they are stored, and a float zero's extra arithmetic. 3 blocks
  // (3 × 65 KiB of the SM's 228 KiB of shared memory, 24 warps) leave 80 registers a thread, 2
  // blocks 128, 1 block 255 (8 warps, still ≥ 16 KiB of loads in flight per SM). The common
  // formats (≤ 4-bit codes, one scale row; 8-bit without zeros) take 3.
  QGEMM_HOST_DEVICE static constexpr int tile_operand_registers(int bits, bool stored_zeros,
                                                                bool float_zeros, int group) {
    return 4 * bits + 8 * scale_rows(group) * (stored_zeros ? 2 : 1) + (float_zeros ? 32 : 0);
  }
  QGEMM_HOST_DEVICE static constexpr int blocks_per_sm(int bits, bool stored_zeros,
                                                       bool float_zeros, int group) {
    return tile_operand_registers(bits, stored_zeros, float_zeros, group) <= 48   ? 3
           : tile_operand_registers(bits, stored_zeros, float_zeros, group) <= 96 ? 2
                                                                                  : 1;
  }
  // Whether a warp loads its next tile's operands before storing the current one (they then
  // stay live through the store phase): where they are few enough to fit beside it, the
  // 3-block configurations (80 registers); more (8-bit codes with 4 scale and zero rows) spill.
  QGEMM_HOST_DEVICE static constexpr bool prefetches_next_tile(int bits, bool stored_zeros,
                                                              bool float_zeros, int group) {
    return tile_operand_registers(bits, stored_zeros, float_zeros, group) <= 48;
  }
  // Blocks to launch: enough for every tile, at most the resident ones (persistent loop).
  QGEMM_HOST_DEVICE static constexpr long long grid_blocks(long long tiles, int sm_count,
                                                           int blocks_per_sm) {
    const long long needed = (tiles + kWarps - 1) / kWarps;
    const long long resident = static_cast<long long>(sm_count) * blocks_per_sm;
    return needed < resident ? (needed < 1 ? 1 : needed) : resident;
  }

  // Scale rows (groups) one warp tile touches, and which of them k16 block b of the tile uses:
  // one row when a group spans whole tiles (or there is one row for all of K), 64 / group rows
  // when groups divide the tile, else (groups of 48, 80, ...) one row per k16 block at most.
  QGEMM_HOST_DEVICE static constexpr int scale_rows(int group) {
    return group == 0 || group % kTileK == 0 ? 1
           : kTileK % group == 0             ? kTileK / group
                                             : kTileBlocks;
  }
  QGEMM_HOST_DEVICE static constexpr int scale_row_of_block(int group, int b) {
    return b / (kTileBlocks / scale_rows(group));
  }
  // The tile's first k16 block that uses scale row s (its group is that block's k / group).
  QGEMM_HOST_DEVICE static constexpr int first_block_of_scale_row(int group, int s) {
    return s * (kTileBlocks / scale_rows(group));
  }
};

}  // namespace qgemm::kernels
