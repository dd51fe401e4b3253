// The prepared weight layout of the mma.sync GEMM family ("n64 fragment order"). Shared by the
// GPU kernels and the CPU repack (src/layout/mma_layout.cpp), which is why it is plain constexpr
// C++ that both compilers read.
//
// The weight W[n, k] is cut into slices of 64 output columns and blocks of 16 along K. One
// (slice, k-block) is what one warp consumes for 8 mma.m16n8k16 B operands; each lane owns the
// 32 codes its fragments need, stored as `bits` consecutive 32-bit words:
//
//   word index  = ((slice · k_blocks + k_block) · 32 + lane) · bits + w
//   lane code c = j · 4 + t          j = n8 block (0..7), t = fragment element (0..3)
//     n = slice · 64 + j · 8 + lane / 4
//     k = k_block · 16 + 2 · (lane % 4) + (t & 1) + 8 · (t >> 1)
//   so codes 2p and 2p + 1 are the two 16-bit halves of one B register ("pair" p = c / 2:
//   t = 0, 1 fill b0, t = 2, 3 fill b1, per ptx/mma_sync.cuh).
//
// Bit order: the first elements of the 16 pairs form one stream of 16 · bits bits, the second
// elements another; stream bit i lives in word i / 16 at bit i % 16, the first stream in the low
// halves and the second in the high halves:
//
//   word w:   [ 31 ........ 16 | 15 ......... 0 ]
//             [ second[16w..]  | first[16w..]   ]     pair p: both codes at stream bit p · bits
//
// so one shift and one AND with a mask repeated in both halves lift a whole pair out, already
// in the two 16-bit lanes of a register; a code that crosses a word takes its top bits from the
// same half of the next word. Dense for every width (bits words hold exactly 32 codes).
//
// Codes are "offset codes": integer weights are stored unsigned (signed q as q + 2^(b-1)), so
// the kernel always computes (u − zero) with zero = 2^(b-1) folded in; float codes are raw.
// N is padded to a multiple of 64 and K to a multiple of 16 with code 0 (a finite value, and
// the matching activations are zero-filled, so padding contributes nothing).
//
// Scales (and zero points, when stored) are fp32 [groups][n_padded], one row per group of K
// (per-channel and per-tensor: one row), with the columns of a slice permuted so that a lane
// reads its 8 scales (j = 0..7 at column j · 8 + lane / 4) as 8 consecutive floats:
//   column n is stored at  slice · 64 + (n % 8) · 8 + (n % 64) / 8
// groups = ceil(K / G): when G does not divide K the last group is shorter. G is a multiple of
// 16, so a k16 block lies in one group, group = kb · 16 / G, and the last block (K padding
// included) still belongs to the last group: kb · 16 ≤ K − 1 for every kb < k_blocks.
#pragma once

#include "common/host_device.cuh"

namespace qgemm::kernels {

struct MmaWeightLayout {
  static constexpr int kSliceN = 64;
  static constexpr int kBlockK = 16;
  static constexpr int kCodesPerLane = 32;
  // The repack's view, shared with WgmmaWeightLayout: a unit is one (slice, k-block), owned by
  // kUnitThreads threads of 32 codes each.
  static constexpr int kUnitK = kBlockK;
  static constexpr int kUnitThreads = 32;

  QGEMM_HOST_DEVICE static constexpr long long padded_n(long long n) { return (n + 63) / 64 * 64; }
  QGEMM_HOST_DEVICE static constexpr long long k_blocks(long long k) { return (k + 15) / 16; }

  // Where element (n, k) lives: the lane and its code index c.
  QGEMM_HOST_DEVICE static constexpr int lane_of(int n, int k) { return (n % 8) * 4 + (k % 8) / 2; }
  QGEMM_HOST_DEVICE static constexpr int thread_of(int n, int k) { return lane_of(n, k); }
  QGEMM_HOST_DEVICE static constexpr int code_of(int n, int k) {
    return ((n % 64) / 8) * 4 + (k % 2) + 2 * ((k % 16) / 8);
  }
  // Inverse: the (n, k) inside a (slice, k-block) of lane `lane`'s code `c`.
  QGEMM_HOST_DEVICE static constexpr int n_of(int lane, int c) { return (c / 4) * 8 + lane / 4; }
  QGEMM_HOST_DEVICE static constexpr int k_of(int lane, int c) {
    return 2 * (lane % 4) + (c % 4 & 1) + 8 * ((c % 4) >> 1);
  }
  QGEMM_HOST_DEVICE static constexpr long long word_index(long long slice, long long k_block,
                                                          long long k_blocks_total, int lane,
                                                          int bits) {
    return ((slice * k_blocks_total + k_block) * 32 + lane) * bits;
  }
  // Code c's first bit: the word (within the lane's words) and the bit in that word.
  QGEMM_HOST_DEVICE static constexpr int code_word(int c, int bits) { return (c / 2) * bits / 16; }
  QGEMM_HOST_DEVICE static constexpr int code_shift(int c, int bits) {
    return (c / 2) * bits % 16 + 16 * (c % 2);
  }
  // Bits of code c in its first word (the rest come from the next word, same half).
  QGEMM_HOST_DEVICE static constexpr int code_bits_in_first_word(int c, int bits) {
    return 16 - (c / 2) * bits % 16 < bits ? 16 - (c / 2) * bits % 16 : bits;
  }
  QGEMM_HOST_DEVICE static constexpr long long scale_column(long long n) {
    return (n / 64) * 64 + (n % 8) * 8 + (n % 64) / 8;
  }

  // How the streamed decode kernel (gemm/sm80_decode.cuh) reads this order. A stage's codes are
  // runs of 32 lanes × bits words, one per k16 block; a lane reads its words of kDecodeReadBlocks
  // runs at once (here 1: block kb's own). The B register b (0, 1) of n8 tile j at block kb is
  // pair decode_pair(kb, j, b) of run decode_run(kb, j); the 8 scales of the lane's columns
  // j · 8 + g (g = lane / 4) lie at decode_scale_offset(j, g) of a scale row's slice: here 8
  // consecutive floats. WgmmaWeightLayout answers the same questions for its order.
  static constexpr int kDecodeReadBlocks = 1;
  QGEMM_HOST_DEVICE static constexpr int decode_run(int kb, int /*j*/) { return kb; }
  QGEMM_HOST_DEVICE static constexpr int decode_pair(int /*kb*/, int j, int b) { return 2 * j + b; }
  QGEMM_HOST_DEVICE static constexpr int decode_scale_offset(int j, int g) { return g * 8 + j; }

  // 8-bit operands (mma.m16n8k32, gemm/sm80_dense.cuh): a B register holds 4 consecutive k of
  // the mma's K order, lane t = lane % 4 owning 4t..4t+3 of each 16. The codes a lane holds for
  // one (k-block, n8 tile j) are the k {2t, 2t+1, 8+2t, 9+2t} of the layout above; the kernel
  // puts them in one register as codes 4j, 4j+2, 4j+1, 4j+3 (for 8-bit codes that is word j as
  // stored, no instruction), i.e. k 2t, 8+2t, 2t+1, 9+2t. The activations are stored in the same
  // order, K permuted inside each run of 16:
  //
  //   k % 16:     0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
  //   position:   0  2  4  6  8 10 12 14  1  3  5  7  9 11 13 15
  //
  // and rows of round_up(K, 16) bytes whose positions of k >= K hold zero.
  QGEMM_HOST_DEVICE static constexpr int operand8_position(int k) {
    return (k / 16) * 16 + 4 * ((k % 8) / 2) + 2 * (k % 2) + (k % 16) / 8;
  }
};

}  // namespace qgemm::kernels
