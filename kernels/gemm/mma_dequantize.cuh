// mma_dequantize: rows [n_begin, n_begin + rows) of a prepared mma weight
// (gemm/mma_weight_layout.cuh) -> a row-major 16-bit [rows][ld_out] chunk that cuBLAS multiplies
// (the dequantize + cuBLAS path, gemm/dequant_cublas.cuh), at the speed of a copy. Launch shape,
// staging swizzle and grid: gemm/mma_dequantize_shape.cuh.
//
//   one warp tile:  slice (64 rows) × 4 k16 blocks (64 k)
//
//          k0        k0+16      k0+32      k0+48      k0+64
//     n0   ┌──────────┬──────────┬──────────┬──────────┐   words: 4 × 32 lanes × bits, one
//          │ block b=0│    1     │    2     │    3     │   contiguous run (a slice's k16
//          │ lane (q,t): rows 8j + q, j = 0..7;        │   blocks are consecutive); scales:
//          │ k 2t, 2t+1, 2t+8, 2t+9 of each block      │   8 floats per lane and scale row
//     n0+64└──────────┴──────────┴──────────┴──────────┘
//
//   1. load       every word and scale (zero) the tile needs, before the first use: 4 · bits
//                 words per lane (16-byte loads where bits allows), 1–4 scale rows
//   2. dequantize per k16 block in registers (dequant/mma_dequant.cuh): the exact value in 16
//                 bits (the decode kernel's unscaled pairs: int16, int_f32, float16) times the
//                 scale, in 16 bits where it is exact there (one fma per pair) or in fp32 rounded
//                 to odd; formats without an exact 16-bit value (float zeros) in fp32 math
//                 rounded to odd. Each value is rounded to 16 bits once, bit for bit as
//                 layout::mma_weight_value rounded to the output type
//   3. stage      each pair (one 32-bit word) into the warp's swizzled 8 KiB region
//   4. store      16-byte chunks, 4 rows × 128 bytes per warp instruction (whole lines);
//                 columns in [k, round_up(k, 8)) as zero, rows past the chunk not at all
//
// Either fragment order (kOrder, = layout::FragmentOrder): a warp tile is one k64 chunk of the
// wgmma order, the same 4 runs of 32 lanes × bits words at the same address; block b's pair
// (j, h) comes from run decode_run(b, j) at decode_pair(b, j, h), its scales at
// decode_scale_offset (gemm/mma_weight_layout.cuh, wgmma_weight_layout.cuh), as the decode
// kernel reads them.
//
// Warps never wait for each other (each has its own region; __syncwarp orders a tile's staging
// and reading); 24 resident warps per SM keep about 48 KiB (4-bit) of loads in flight.
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/dequant_cublas_args.cuh"
#include "gemm/mma_dequantize_shape.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "gemm/wgmma_weight_layout.cuh"

namespace qgemm::kernels {

// How the exact value of a code is made (the JIT family's "dequant" choice): fp32 math
// (dequantize_pair), or an unscaled 16-bit dequantization of the decode kernel, kUnscaled + 1.
enum MmaDequantizeValue {
  kValueFp32 = 0,
  kValueInt16 = 1 + kDequantInt16,
  kValueIntF32 = 1 + kDequantIntF32,
  kValueFloat16 = 1 + kDequantFloat16,
};
// How the scale is applied to a 16-bit exact value (the "scale" choice): in fp32 rounded to odd,
// or in the 16-bit type, where the host has checked that every scale is exact.
enum MmaDequantizeScale { kScaleFp32 = 0, kScaleHalf = 1 };

// A lane's `bits` words (consecutive; 16- or 8-byte aligned when bits is a multiple of 4 or 2).
template <int kBits>
__device__ __forceinline__ void load_lane_words(const unsigned* from, unsigned (&words)[kBits]) {
  if constexpr (kBits % 4 == 0) {
#pragma unroll
    for (int v = 0; v < kBits / 4; ++v) {
      const uint4 x = reinterpret_cast<const uint4*>(from)[v];
      words[4 * v] = x.x, words[4 * v + 1] = x.y, words[4 * v + 2] = x.z, words[4 * v + 3] = x.w;
    }
  } else if constexpr (kBits % 2 == 0) {
#pragma unroll
    for (int v = 0; v < kBits / 2; ++v) {
      const uint2 x = reinterpret_cast<const uint2*>(from)[v];
      words[2 * v] = x.x, words[2 * v + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int w = 0; w < kBits; ++w) words[w] = from[w];
  }
}

// The mask that keeps the first `valid` (1..8) of a chunk's 8 16-bit values and zeroes the rest.
__device__ __forceinline__ uint4 first_values_mask(unsigned valid) {
  unsigned words[4];
#pragma unroll
  for (unsigned w = 0; w < 4; ++w)
    words[w] = valid >= 2 * w + 2 ? 0xffffffffu : valid == 2 * w + 1 ? 0x0000ffffu : 0u;
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// kGroup: K values per scale row (a multiple of 16), 0 for one row for all of K.
template <unsigned long long kWeightFormat, int kZeroMode, int kGroup, int kValue, int kScale,
          int kOutput, int kOrder, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(
    kThreads,
    MmaDequantizeShape::blocks_per_sm(FormatCode::unpack(kWeightFormat).bits,
                                      kZeroMode == kZeroInteger || kZeroMode == kZeroFloat,
                                      kZeroMode == kZeroFloat, kGroup))
    mma_dequantize_kernel(MmaDequantizeArgs args) {
  using Shape = MmaDequantizeShape;
  using Order = typename FragmentOrderLayout<kOrder>::Layout;
  static_assert(Shape::kTileBlocks % Order::kDecodeReadBlocks == 0, "a tile holds whole chunks");
  constexpr FormatCode kFormat = FormatCode::unpack(kWeightFormat);
  constexpr int kBits = kFormat.bits;
  constexpr bool kBf16 = kOutput == kOutBf16;
  constexpr int kUnscaled = kValue - 1;  // the UnscaledDequant of kValue > kValueFp32
  constexpr bool kStoredZeros = kZeroMode == kZeroInteger || kZeroMode == kZeroFloat;
  constexpr int kScaleRows = Shape::scale_rows(kGroup);
  constexpr int kBlocks = Shape::kTileBlocks;
  static_assert(kThreads == Shape::kThreads && kDynamicSmemBytes == Shape::kSmemBytes,
                "mma_dequantize launches with MmaDequantizeShape's threads and shared memory");
  static_assert(kOutput == kOutBf16 || kOutput == kOutFp16, "16-bit output");
  static_assert(kGroup >= 0 && kGroup % MmaWeightLayout::kBlockK == 0,
                "groups are multiples of 16 (a k16 block never straddles two)");
  static_assert(kValue != kValueFp32 || kScale == kScaleFp32, "fp32 values take fp32 scales");
  static_assert(kValue == kValueFp32 || kZeroMode != kZeroFloat,
                "float zeros make u − zero inexact in 16 bits: fp32 values");

  extern __shared__ uint4 shared_chunks[];
  // Unsigned lane arithmetic: the compiler then sees q < 8 and t < 4 and folds the staging
  // offsets of the unrolled loops into one base register and immediates.
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned q = lane / 4, t = lane % 4;
  unsigned char* const staging =
      reinterpret_cast<unsigned char*>(shared_chunks) + warp * Shape::kWarpSmemBytes;

  // 32-bit tile indices (the host checks that the tiles fit); 64-bit only in addresses.
  const unsigned k_blocks = static_cast<unsigned>(args.k_blocks);
  const unsigned k_tiles = static_cast<unsigned>(Shape::k_tiles(args.k_blocks));
  const unsigned tiles = static_cast<unsigned>(Shape::tiles(args.rows, args.k_blocks));
  const unsigned first_slice = static_cast<unsigned>(args.n_begin / Shape::kTileRows);
  const long long ld_out = args.ld_out;
  const unsigned k = static_cast<unsigned>(args.k);
  // A warp's tiles: tile, tile + stride, ... Where the operands fit beside the store phase, each
  // tile's words and scales are loaded while the previous tile is stored (1 below, issued after
  // its dequantization freed the registers), so the store phase no longer waits with nothing in
  // flight; else at the start of its own turn.
  constexpr bool kPrefetch = Shape::prefetches_next_tile(kBits, kStoredZeros,
                                                         kZeroMode == kZeroFloat, kGroup);
  struct TileAt {
    unsigned chunk_slice, kb0, slice, blocks;  // slice within the chunk, first k16 block, 1..4
  };
  auto tile_at = [&](unsigned tile) {
    TileAt at;
    at.chunk_slice = tile / k_tiles;
    at.kb0 = (tile - at.chunk_slice * k_tiles) * kBlocks;
    at.slice = first_slice + at.chunk_slice;
    at.blocks = min(k_blocks - at.kb0, static_cast<unsigned>(kBlocks));
    return at;
  };
  // The scale row of k16 block kb: the wgmma order pads K to whole chunks of 64, whose blocks
  // past the last group take its row (the columns past K are stored as zero anyway; the mma
  // order's last block already lies in the last group).
  auto group_of_block = [&](unsigned kb) {
    if constexpr (kGroup == 0) {
      return 0u;
    } else {
      return min(kb * MmaWeightLayout::kBlockK / kGroup, (k - 1) / kGroup);
    }
  };
  unsigned words[kBlocks][kBits];
  float scales[kScaleRows][8], zeros[kScaleRows][8];
  // 1. Every load of a tile, issued before any is used.
  auto load_tile = [&](const TileAt& of) {
    const unsigned* tile_words =
        args.words + MmaWeightLayout::word_index(of.slice, of.kb0, k_blocks, lane, kBits);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int w = 0; w < kBits; ++w) words[b][w] = 0u;
      if (b < of.blocks) load_lane_words<kBits>(tile_words + b * 32 * kBits, words[b]);
    }
    const long long slice_column = static_cast<long long>(of.slice) * Shape::kTileRows;
#pragma unroll
    for (int s = 0; s < kScaleRows; ++s) {
#pragma unroll
      for (int j = 0; j < 8; ++j) scales[s][j] = zeros[s][j] = 0.0f;
      const int b = Shape::first_block_of_scale_row(kGroup, s);
      if (b < of.blocks) {
        const unsigned group = group_of_block(of.kb0 + b);
        const long long column = static_cast<long long>(group) * args.n_padded + slice_column;
        load_lane_columns<Order>(args.scales + column, q, scales[s]);
        if constexpr (kStoredZeros) load_lane_columns<Order>(args.zeros + column, q, zeros[s]);
      }
    }
  };
  const unsigned stride = gridDim.x * Shape::kWarps;
  unsigned tile = blockIdx.x * Shape::kWarps + warp;
  TileAt at = tile_at(tile < tiles ? tile : 0);
  if (kPrefetch && tile < tiles) load_tile(at);
  for (; tile < tiles; tile += stride) {
    if constexpr (!kPrefetch) {
      at = tile_at(tile);
      load_tile(at);
    }
    const unsigned chunk_slice = at.chunk_slice, kb0 = at.kb0, slice = at.slice;
    const unsigned blocks = at.blocks;
    const unsigned* tile_words =
        args.words + MmaWeightLayout::word_index(slice, kb0, k_blocks, lane, kBits);
    const long long slice_column = static_cast<long long>(slice) * Shape::kTileRows;

    // 2-3. Dequantize each k16 block and stage its pairs: pair h of n8 block j is word
    // 8b + 4h + t of row 8j + q (k = 16b + 8h + 2t, 2t + 1). Its codes: pair decode_pair(b, j, h)
    // of the tile's run decode_run(b, j).
    auto run_of = [](int b, int j) { return Order::decode_run(b, j) % kBlocks; };
    auto stage = [&](const unsigned(&pairs)[8][2], unsigned b) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<unsigned*>(staging + j * 8 * Shape::kRowBytes +
                                       Shape::write_base(2 * b + h, lane)) = pairs[j][h];
    };
    if constexpr (kValue != kValueFp32) {
      // The exact value in 16 bits, then the scale: one rounding either way.
      unsigned offsets[kScaleRows][8], scale_pairs[kScaleRows][8];
#pragma unroll
      for (int s = 0; s < kScaleRows; ++s) {
        unscaled_offsets<kWeightFormat, kZeroMode, kUnscaled, kBf16>(zeros[s], offsets[s]);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          scale_pairs[s][j] =
              kScale == kScaleHalf ? ptx::pack_pair<kBf16>(scales[s][j], scales[s][j]) : 0u;
      }
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        if (b >= blocks) break;  // past K: those columns are never stored
        const int s = Shape::scale_row_of_block(kGroup, b);
        unsigned pairs[8][2];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const unsigned exact = dequantize_pair_unscaled<kWeightFormat, kUnscaled, kBf16>(
                words[run_of(b, j)], Order::decode_pair(b, j, h), offsets[s][j]);
            pairs[j][h] = kScale == kScaleHalf
                              ? scale_pair_exact<kBf16>(exact, scale_pairs[s][j])
                              : scale_pair_to_odd<kBf16>(exact, scales[s][j]);
          }
        stage(pairs, b);
      }
    } else {
      // Float zeros: the rare tile with a zero whose u − zero fp32 cannot hold takes the double
      // arithmetic (a warp-uniform choice), one k16 block at a time and reloading its operands
      // (L1 hits), so that its doubles do not compete with the hoisted operands for registers.
      bool fp32_exact = true;
      if constexpr (kZeroMode == kZeroFloat) {
#pragma unroll
        for (int s = 0; s < kScaleRows; ++s)
#pragma unroll
          for (int j = 0; j < 8; ++j) fp32_exact &= zero_exact_in_fp32(zeros[s][j]);
        fp32_exact = __all_sync(0xffffffffu, fp32_exact);
      }
      if (fp32_exact) {
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          if (b >= blocks) break;
          const int s = Shape::scale_row_of_block(kGroup, b);
          unsigned pairs[8][2];
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              pairs[j][h] = dequantize_pair<kWeightFormat, kZeroMode, kBf16, kRoundOnce>(
                  words[run_of(b, j)], Order::decode_pair(b, j, h), scales[s][j], zeros[s][j]);
          stage(pairs, b);
        }
      } else if constexpr (kZeroMode == kZeroFloat) {
        // Unrolled (block b a constant) so that the wgmma order's pair indices stay constants.
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          if (b >= static_cast<int>(blocks)) break;
          // The read block b's pairs come from: its own run (mma), the tile's 4 runs (wgmma).
          constexpr int kRead = Order::kDecodeReadBlocks;
          unsigned block_words[kRead][kBits];
#pragma unroll
          for (int run = 0; run < kRead; ++run)
            load_lane_words<kBits>(tile_words + ((b / kRead) * kRead + run) * 32 * kBits,
                                   block_words[run]);
          const unsigned group = group_of_block(kb0 + b);
          const long long column = static_cast<long long>(group) * args.n_padded + slice_column;
          float block_scales[8], block_zeros[8];
          load_lane_columns<Order>(args.scales + column, q, block_scales);
          load_lane_columns<Order>(args.zeros + column, q, block_zeros);
          unsigned pairs[8][2];
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              pairs[j][h] = dequantize_pair<kWeightFormat, kZeroMode, kBf16, kRoundOnceDouble>(
                  block_words[Order::decode_run(b, j) % kRead], Order::decode_pair(b, j, h),
                  block_scales[j], block_zeros[j]);
          stage(pairs, b);
        }
      }
    }
    // The next tile's loads, in flight while this one is stored.
    if (kPrefetch && tile + stride < tiles) {
      at = tile_at(tile + stride);
      load_tile(at);
    }
    __syncwarp();

    // 4. Whole rows out: chunk c = lane % 8 of rows 4i + lane / 8, 16 bytes each. Full tiles
    // (all 64 rows in the chunk, the lane's 8 columns below k) store without a check.
    const unsigned c = lane % Shape::kChunksPerRow, first_row = lane / Shape::kChunksPerRow;
    const unsigned chunk_k = kb0 * MmaWeightLayout::kBlockK + c * Shape::kChunkValues;
    const long long rows_left = args.rows - static_cast<long long>(chunk_slice) * Shape::kTileRows;
    const unsigned read_base[2] = {Shape::read_base(0, lane), Shape::read_base(1, lane)};
    unsigned short* to =
        args.out + (static_cast<long long>(chunk_slice) * Shape::kTileRows + first_row) * ld_out +
        chunk_k;
    auto staged = [&](int i) {
      return *reinterpret_cast<const uint4*>(staging + (i / 2) * 8 * Shape::kRowBytes +
                                             read_base[i % 2]);
    };
    if (rows_left >= Shape::kTileRows && chunk_k + Shape::kChunkValues <= k) {
#pragma unroll
      for (int i = 0; i < Shape::kTileRows / 4; ++i)
        *reinterpret_cast<uint4*>(to + i * 4 * ld_out) = staged(i);
    } else if (chunk_k < k) {
      const int rows =
          rows_left < Shape::kTileRows ? static_cast<int>(rows_left) : Shape::kTileRows;
      const uint4 mask = first_values_mask(min(k - chunk_k, 8u));
#pragma unroll
      for (int i = 0; i < Shape::kTileRows / 4; ++i) {
        if (static_cast<int>(4 * i + first_row) >= rows) break;
        const uint4 chunk = staged(i);
        *reinterpret_cast<uint4*>(to + i * 4 * ld_out) =
            make_uint4(chunk.x & mask.x, chunk.y & mask.y, chunk.z & mask.z, chunk.w & mask.w);
      }
    }
    __syncwarp();  // the next tile's staging overwrites what this one read
  }
}

}  // namespace qgemm::kernels
