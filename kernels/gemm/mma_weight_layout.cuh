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
//   code c sits at bits [c · bits, (c + 1) · bits) of the lane's words, LSB first.
//
//   so t = 0, 1 fill B register b0 (k 2t', 2t'+1) and t = 2, 3 fill b1 (k + 8), per mma_sync.cuh.
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
#pragma once

#if defined(__CUDACC__)
#define QGEMM_HOST_DEVICE __host__ __device__
#else
#define QGEMM_HOST_DEVICE
#endif

namespace qgemm::kernels {

struct MmaWeightLayout {
  static constexpr int kSliceN = 64;
  static constexpr int kBlockK = 16;
  static constexpr int kCodesPerLane = 32;

  QGEMM_HOST_DEVICE static constexpr long long padded_n(long long n) { return (n + 63) / 64 * 64; }
  QGEMM_HOST_DEVICE static constexpr long long k_blocks(long long k) { return (k + 15) / 16; }

  // Where element (n, k) lives: the lane and its code index c.
  QGEMM_HOST_DEVICE static constexpr int lane_of(int n, int k) {
    return (n % 8) * 4 + (k % 8) / 2;
  }
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
  QGEMM_HOST_DEVICE static constexpr long long scale_column(long long n) {
    return (n / 64) * 64 + (n % 8) * 8 + (n % 64) / 8;
  }
};

}  // namespace qgemm::kernels
