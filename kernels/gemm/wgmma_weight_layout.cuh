// The prepared weight layout of the SM90 wgmma family ("k64 warpgroup fragment order"), shared
// by the GPU kernels (gemm/sm90_wgmma.cuh, gemm/mma_repack.cuh) and the CPU twin
// (src/layout/wgmma_layout.cpp): plain constexpr C++ that both compilers read.
//
// The family computes Cᵀ = W · Aᵀ with the weight as wgmma's register operand A (m64nNk16): a
// warpgroup of 128 threads multiplies 64 weight rows, warp w its rows 16w .. 16w + 15, and each
// thread holds the mma.m16n8k16 A fragment of its warp (g = lane / 4, t = lane % 4):
//
//   register a0: row g,     k 2t, 2t+1      a1: row g + 8, k 2t, 2t+1
//            a2: row g,     k 2t+8, 2t+9    a3: row g + 8, k 2t+8, 2t+9
//
// W[n, k] is cut into tiles of 64 rows and chunks of 64 along K. One (tile, chunk) is what a
// warpgroup consumes for four k16 steps; each thread owns the 32 codes of its four fragments,
// stored as `bits` consecutive 32-bit words (for 4-bit codes: one 16-byte load per chunk):
//
//   word index = ((tile · k_chunks + chunk) · 128 + thread) · bits + w,  thread = warp · 32 + lane
//   code c = kb · 8 + r · 2 + h     kb: k16 step 0..3, r: register a0..a3, h: its half (0 low)
//     n = tile · 64 + warp · 16 + lane / 4 + 8 · (r & 1)
//     k = chunk · 64 + kb · 16 + 2 · (lane % 4) + h + 8 · (r >> 1)
//   so codes 2p and 2p + 1 (pair p = kb · 4 + r) are the two 16-bit halves of register r of
//   k16 step kb.
//
// Bit order inside a thread's words is MmaWeightLayout's (gemm/mma_weight_layout.cuh): the first
// elements of the 16 pairs form one stream of 16 · bits bits in the low halves of the words, the
// second elements another in the high halves, pair p at stream bit p · bits; so the same
// extract_pair (dequant/mma_dequant.cuh) lifts a whole register's two codes out at once.
//
// Codes are offset codes as in the mma layout (signed integers stored as q + 2^(b-1)); N is padded
// to a multiple of 64 and K to a multiple of 64 with code 0 (the matching activations are
// zero-filled, so padding contributes nothing). The host describes both layouts with one
// layout::MmaWeight (its `order`); here k_blocks (k16 blocks) is 4 · k_chunks, so both hold
// n_padded / 64 · k_blocks · 32 · bits words.
//
// Scales (and zero points, when stored) are fp32 [groups][n_padded] (groups = ceil(K / G); per
// channel and per tensor: one row), the columns of each tile permuted so that the two rows of a
// thread (warp · 16 + g and + 8) are adjacent, one 8-byte load:
//
//   column n is stored at  (n / 64) · 64 + ((n % 64) / 16) · 16 + (n % 8) · 2 + (n % 16) / 8
#pragma once

#include "common/host_device.cuh"
#include "gemm/mma_weight_layout.cuh"

namespace qgemm::kernels {

struct WgmmaWeightLayout {
  static constexpr int kTileN = 64;
  static constexpr int kChunkK = 64;
  static constexpr int kThreads = 128;  // one warpgroup
  static constexpr int kCodesPerThread = 32;
  static constexpr int kUnitK = kChunkK;  // the repack's view (as MmaWeightLayout's)
  static constexpr int kUnitThreads = kThreads;

  QGEMM_HOST_DEVICE static constexpr long long padded_n(long long n) { return (n + 63) / 64 * 64; }
  QGEMM_HOST_DEVICE static constexpr long long k_chunks(long long k) { return (k + 63) / 64; }

  // Where element (n, k) of a (tile, chunk) lives (n, k taken modulo 64): the thread and its code.
  QGEMM_HOST_DEVICE static constexpr int thread_of(int n, int k) {
    return ((n % 64) / 16) * 32 + (n % 8) * 4 + (k % 8) / 2;
  }
  QGEMM_HOST_DEVICE static constexpr int code_of(int n, int k) {
    return ((k % 64) / 16) * 8 + (((n % 16) / 8) + 2 * ((k % 16) / 8)) * 2 + k % 2;
  }
  // Inverse: the (n, k) inside a (tile, chunk) of thread `thread`'s code `c`.
  QGEMM_HOST_DEVICE static constexpr int n_of(int thread, int c) {
    return (thread / 32) * 16 + (thread % 32) / 4 + 8 * ((c % 8) / 2 & 1);
  }
  QGEMM_HOST_DEVICE static constexpr int k_of(int thread, int c) {
    return (c / 8) * 16 + 2 * (thread % 4) + c % 2 + 8 * (((c % 8) / 2) >> 1);
  }
  QGEMM_HOST_DEVICE static constexpr long long word_index(long long tile, long long chunk,
                                                          long long k_chunks_total, int thread,
                                                          int bits) {
    return ((tile * k_chunks_total + chunk) * kThreads + thread) * bits;
  }
  // Code c's first bit: the same packing as the mma layout's lane codes.
  QGEMM_HOST_DEVICE static constexpr int code_word(int c, int bits) {
    return MmaWeightLayout::code_word(c, bits);
  }
  QGEMM_HOST_DEVICE static constexpr int code_shift(int c, int bits) {
    return MmaWeightLayout::code_shift(c, bits);
  }
  QGEMM_HOST_DEVICE static constexpr int code_bits_in_first_word(int c, int bits) {
    return MmaWeightLayout::code_bits_in_first_word(c, bits);
  }
  QGEMM_HOST_DEVICE static constexpr long long scale_column(long long n) {
    return (n / 64) * 64 + ((n % 64) / 16) * 16 + (n % 8) * 2 + (n % 16) / 8;
  }

  // The streamed decode kernel (gemm/sm80_decode.cuh, one warp per 64-row slice) reads this
  // order too (MmaWeightLayout::decode_run and the rest say how it reads that one), so that SM90
  // keeps one copy of a weight for decode and prefill. Lane L needs, per k16 step kb, the
  // mma.m16n8k16 B fragments of 8 n8 tiles j (column j · 8 + g, g = L / 4): the A fragments of
  // the chunk's four 16-row bands, as one lane sees them. Those are in the words of threads
  // w · 32 + L, w = 0..3: the chunk's 128 threads are 4 runs of 32 lanes × bits words, so a lane
  // reads its words of all 4 runs at once (for 4-bit codes 4 × 16 bytes, what the mma order
  // holds for 4 k16 blocks):
  //
  //   tile j: run w = j / 2 (rows 16w .. 16w + 15), its row band g (a0, a2) or g + 8 (a1, a3)
  //   B register b of tile j at step kb = register r = j % 2 + 2b of step kb % 4
  //                                     = pair 4 (kb % 4) + j % 2 + 2b of run w
  //
  // a fixed permutation of which extracted pair feeds which mma, no extra instruction. Its 8
  // scales lie at 16 (j / 2) + 2g + j % 2 of the tile's scale row: four adjacent pairs.
  static constexpr int kDecodeReadBlocks = 4;
  QGEMM_HOST_DEVICE static constexpr int decode_run(int kb, int j) { return (kb / 4) * 4 + j / 2; }
  QGEMM_HOST_DEVICE static constexpr int decode_pair(int kb, int j, int b) {
    return (kb % 4) * 4 + j % 2 + 2 * b;
  }
  QGEMM_HOST_DEVICE static constexpr int decode_scale_offset(int j, int g) {
    return (j / 2) * 16 + 2 * g + j % 2;
  }
};

// The layout struct of a fragment order, by the JIT families' "order" (= layout::FragmentOrder:
// 0 mma, 1 wgmma), for the kernels that write or read either (mma_repack, the streamed decode
// GEMM, mma_dequantize).
template <int kOrder>
struct FragmentOrderLayout {
  using Layout = MmaWeightLayout;
};
template <>
struct FragmentOrderLayout<1> {
  using Layout = WgmmaWeightLayout;
};

}  // namespace qgemm::kernels
