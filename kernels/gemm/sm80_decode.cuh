// Decode GEMM on mma.sync (SM80+), M ≤ 16: C[M, N] = A[M, K] · dequant(W)[N, K]ᵀ, built to stream
// the prepared weight (gemm/mma_weight_layout.cuh) once, at memory bandwidth.
//
//   grid   x: 64-column slices, z: K splits;   block: kWarps warps on one slice
//   warp   w of split z owns the k16 blocks [(z · kWarps + w) · P, + P) of the slice
//          (P = blocks_per_warp, a multiple of kStageBlocks) and streams them through a ring of
//          kStages stages of its own: cp.async, wait, __syncwarp, compute. No block barrier in
//          the main loop, so a warp never waits for another one.
//
//   one warp's shared memory:
//     [zero row, kStageBlocks · 32 B]  where ldmatrix lanes of rows ≥ M point
//     stage × kStages:
//       W  kStageBlocks × 32 lanes × bits words   the codes, verbatim (one contiguous run)
//       A  kRows rows × (kStageBlocks · 32 B + 16 B pad)   only rows < M are copied; the pad
//          puts the 8 rows of an ldmatrix on 8 different bank quads
//       S  kScaleRows rows of 64 scales (the stage's groups, lane-permuted), then as many zero
//          rows when the weight stores zeros
//
// Operands are swapped: the mma computes Cᵀ = W · Aᵀ, the weight as its 16×16 A operand and
// the activations as its 16×8 B operand, so M ≤ 8 wastes nothing (Aᵀ's 8 columns are the
// batch rows) and a k16 block of a slice takes 4 mma instead of 8. The layout needs no change:
// the weight's B fragments of n8 tiles 2q and 2q + 1 are exactly the A fragment of the 16 rows
// q · 16 .. q · 16 + 15 (a0 = b[2q][0], a1 = b[2q + 1][0], a2 = b[2q][1], a3 = b[2q + 1][1]),
// and the activations' ldmatrix rows are the B fragment. A lane's accumulators are then
//   acc[q][bt][e]:  column n = (2q + e / 2) · 8 + g,  batch row m = bt · 8 + 2t + e % 2
// (g = lane / 4, t = lane % 4; bt = 0, 1 batch tiles of 8 rows).
//
// Scales go on the accumulators: inside a group the mma sums exact unscaled codes into `part`,
// and at the group's end acc += part · scale in fp32. A lane's columns are j · 8 + g
// (j = 2q + e / 2), whose scales are the 8 consecutive floats at 8g of the permuted row.
// Integer codes of ≤ 7 bits go to the mma lifted, as base + u (128 for bf16, 1024 for fp16;
// dequant/mma_dequant.cuh, lift_pair_int16), and the flush takes off (base + zero) · Σ_k A, the
// row sums coming from one more mma with the weight operand = 1; every zero mode (none, constant,
// stored integer or float) is then the same subtraction, and the dequantization is a shift and a
// LOP3 per pair. 8-bit integers (int_f32) subtract base + zero per pair; floats need neither.
//
// Weight order (kWgmmaOrder): the kernel reads the mma order or, on SM90, the wgmma family's
// k64 order (gemm/wgmma_weight_layout.cuh), so that one copy of a weight serves decode and
// prefill. Both hold the same codes in the same 16-bit pairs, grouped differently; a stage is
// the same contiguous run of words in either (k_blocks is a multiple of 4 in the wgmma order and
// stages hold whole chunks). Only which pair feeds which mma and where a lane's 8 scales lie
// differ: the layout headers' decode_run / decode_pair / decode_scale_offset say so, and the
// lane reads the words of kDecodeReadBlocks runs at once (mma 1, wgmma a chunk's 4).
//
// Grouped (MoE, kGrouped; issue #17): A holds the routed rows in expert order (moe.hpp: each
// expert's run padded to whole routing blocks), and the experts' prepared weights lie back to
// back (Engine::prepare_experts, in either order):
//
//   grid   x: 64-column slices of ONE expert, y: token blocks of kRows rows, z: 1 (no split-K:
//          a split's partial sums would cover every token block of the capacity)
//   block (slice, y): rows [y · kRows, + kRows) of A and C (rows grouped in place by the caller,
//          params.row_blocks: kRows rows from the table entry y's load0, of which it stores
//          `count` from `skip` on; the table keeps them inside A); if
//          y · kRows ≥ *routed_total it returns at once (the capacity is a bound, the routed
//          total is known on the device only); else its expert e = block_experts[y /
//          blocks_per_route] and
//            codes   slice e · slices + slice of the whole (slices = n_padded / 64)
//            scales  rows e · groups .. of the whole [E · groups][n_padded] (zeros likewise)
//            bias    bias + e · n
//          all kRows rows are multiplied (the indexed layout's padding rows too: the gather
//          writes them, the combine never reads them; in place, the rows around an expert's are
//          another expert's or none's, never stored), so the block's M is kRows, not params.m.
// Offsets are int counts (expert · slices, expert · groups) turned into addresses where the
// dense kernel already forms its per-lane pointers: nothing 64-bit is held for the expert.
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "gemm/sm80_decode_shape.cuh"
#include "gemm/wgmma_weight_layout.cuh"
#include "moe/glu.cuh"
#include "moe/routing_args.cuh"  // the in-place row-block table
#include "ptx/async_copy.cuh"
#include "ptx/convert.cuh"
#include "ptx/mma_sync.cuh"

namespace qgemm::kernels {

// The instantiation's shape (gemm/sm80_decode_shape.cuh, which the dispatcher evaluates too),
// as compile-time constants.
template <int kRows, int kWarps, int kStageBlocks, int kStages, int kBits, int kGroup,
          bool kStoredZeros>
struct DecodeGemmShape {
  static constexpr DecodeTile kTile = {kRows, kWarps, kStageBlocks, kStages};
  static constexpr DecodeShape kShape = decode_shape(kTile, kBits, kGroup, kStoredZeros);
  static constexpr int kThreads = kShape.threads;
  static constexpr int kStageK = kShape.stage_k;
  static constexpr int kWBytes = kShape.w_bytes;
  static constexpr int kARowBytes = kShape.a_row_bytes;
  static constexpr int kABytes = kShape.a_bytes;
  static constexpr int kScaleRows = kShape.scale_rows;
  static constexpr int kSBytes = kShape.s_bytes;
  static constexpr int kStageBytes = kShape.stage_bytes;
  static constexpr int kZeroRowBytes = kShape.zero_row_bytes;
  static constexpr int kWarpBytes = kShape.warp_bytes;
  static constexpr int kSharedBytes = kShape.shared_bytes;

  static_assert(decode_tile_error(kTile, kGroup) == nullptr,
                "decode config and weight disagree (decode_tile_error says why)");
};

// Where a grouped block's work lies in A, C and the prepared weight: its expert's slice against
// one token block. (Dense blocks take slice blockIdx.x of the one weight against rows [0, M).)
struct DecodeBlockWork {
  int weight_slice;  // 64-column slice of the whole prepared weight (expert · slices + slice)
  int scale_row0;    // first scale (and zero) row of [rows][n_padded] (expert · groups)
  int row0;          // first row of A and C
};

template <int kRows, int kWarps, int kStageBlocks, int kStages, unsigned long long kFormat,
          int kZeroMode, int kGroup, bool kBf16, int kOutput, bool kSplitK, int kDequant,
          bool kGrouped = false, bool kWgmmaOrder = false, int kGlu = 0>
struct DecodeGemm {
  static_assert(!(kGrouped && kSplitK), "the grouped decode GEMM takes one K split");
  static_assert(kGlu == 0 || (kGrouped && kOutput != kOutFp32),
                "a fused GLU is the grouped gate_up GEMM's, with 16-bit rows out");
  using Order = typename FragmentOrderLayout<kWgmmaOrder ? 1 : 0>::Layout;
  static constexpr int kReadBlocks = Order::kDecodeReadBlocks;
  static_assert(kStageBlocks % kReadBlocks == 0, "a stage holds whole reads of the weight order");
  static constexpr FormatCode kF = FormatCode::unpack(kFormat);
  static constexpr int kBits = kF.bits;
  static constexpr bool kStoredZeros = kZeroMode == kZeroInteger || kZeroMode == kZeroFloat;
  // Offsets taken off in the flush, from row sums (above): integer codes lifted into 16 bits.
  static constexpr bool kLifted = kDequant == kDequantInt16;
  static constexpr bool kRowSums = kLifted || kZeroMode == kZeroFloat;
  // Where zeros are read at a group's start (the per-pair offsets), not at its flush.
  static constexpr bool kZerosAtStart = kZeroMode == kZeroInteger && !kLifted;
  static constexpr int kBatchTiles = kRows > 8 ? 2 : 1;  // 8 batch rows per mma
  using Accumulators = float[4][kBatchTiles][4];
  using RowSums = float[kBatchTiles][4];
  using Shape = DecodeGemmShape<kRows, kWarps, kStageBlocks, kStages, kBits, kGroup, kStoredZeros>;
  // k16 blocks per group; one group for all of K (per channel) never ends inside the range.
  static constexpr int kGroupBlocks = kGroup == 0 ? 1 << 30 : kGroup / 16;

  // What one lane copies into every stage. The lane's sources are set once per warp and a stage
  // adds one product of its first k16 block to each; destinations are the lane's fixed offsets in
  // the stage. (Derived from the lane per stage, under every copy's predicate, they cost ~85
  // instructions a stage, as much as two k16 blocks of dequantization and mma.)
  //   W      chunks lane + 32 i of the stage's contiguous run of codes
  //   A      chunk c = lane % C of rows r = lane / C + i · 32 / C (C = 16-byte chunks per row,
  //          a divisor of 32), rows < M only
  //   S      chunk lane % 16 of scale (or zero) row i · 2 + lane / 16 (16 chunks per row)
  struct StageLoader {
    static constexpr int kWChunks = Shape::kWBytes / 16;
    static constexpr int kWPerLane = (kWChunks + 31) / 32;
    static constexpr int kAChunksPerRow = Shape::kStageK / 8;
    static_assert(32 % kAChunksPerRow == 0 || kAChunksPerRow % 32 == 0, "A chunks tile the warp");
    static constexpr int kARowsPerPass = kAChunksPerRow >= 32 ? 1 : 32 / kAChunksPerRow;
    static constexpr int kAPasses = kAChunksPerRow >= 32
                                        ? kRows * (kAChunksPerRow / 32)
                                        : (kRows + kARowsPerPass - 1) / kARowsPerPass;
    static constexpr int kSRows = (kStoredZeros ? 2 : 1) * Shape::kScaleRows;
    static constexpr int kSPerLane = (kSRows * 16 + 31) / 32;

    const char* w;   // the lane's first W chunk at k16 block 0 of the slice
    const char* a;   // the lane's A chunk in its first row, at k = 0
    const char* s;   // the lane's scale chunk in group row 0 (slice, chunk)
    const char* z;   // the same in the zeros, when stored
    int a_passes;    // passes whose row is < M (rows grow with the pass)
    unsigned w_dst;  // the lane's W chunk in a stage: lane · 16
    unsigned a_dst;  // the lane's A chunk of pass 0 in a stage

    // Activations through L1: the warps of an SM that share a K range (same split and warp
    // index, other slices) copy the same chunks at about the same time.
    __device__ static void a_copy(unsigned dst, const void* src, int bytes) {
      ptx::cp_async_16<ptx::CacheIn::kL1>(dst, src, bytes);
    }

    __device__ static int a_row_of(int lane) {
      return kAChunksPerRow >= 32 ? 0 : lane / kAChunksPerRow;
    }
    __device__ static int a_chunk_k_of(int lane) {
      return kAChunksPerRow >= 32 ? (lane % 32) * 8 : (lane % kAChunksPerRow) * 8;
    }
    __device__ static int row_of_pass(int i) {
      return kAChunksPerRow >= 32 ? i / (kAChunksPerRow / 32) : i * kARowsPerPass;
    }
    // The lane's offset in a stage of its A chunk of pass i.
    __device__ static unsigned a_offset(int lane, int i) {
      const int chunk_k =
          kAChunksPerRow >= 32 ? ((i % (kAChunksPerRow / 32)) * 32 + lane) * 8 : a_chunk_k_of(lane);
      return Shape::kWBytes + (a_row_of(lane) + row_of_pass(i)) * Shape::kARowBytes + chunk_k * 2;
    }

    // `slice`: the 64-column slice of the output (the scales' columns); `work`: where a grouped
    // block's weight and rows lie (dense: not read; the expressions are the dense kernel's own,
    // so that its code stays as it was).
    __device__ StageLoader(const DenseGemmParams& p, int slice, const DecodeBlockWork& work,
                           int lane) {
      const int weight_slice = kGrouped ? work.weight_slice : slice;
      const int rows = kGrouped ? kRows : p.m;
      w = reinterpret_cast<const char*>(p.b) +
          static_cast<long long>(weight_slice) * p.k_blocks * (32 * kBits * 4) + lane * 16;
      a = static_cast<const char*>(p.a) +
          (static_cast<long long>(a_row_of(lane)) * p.lda + a_chunk_k_of(lane)) * 2;
      if constexpr (kGrouped) a += static_cast<long long>(work.row0) * p.lda * 2;
      a_passes = 0;
      for (int i = 0; i < kAPasses; ++i) a_passes += a_row_of(lane) + row_of_pass(i) < rows;
      const int s_offset = (slice * 64 + (lane % 16) * 4) * 4;
      // Grouped: the expert's first scale row (64-bit: E · groups · n_padded floats may pass 2^31
      // bytes); dense: row 0.
      s = reinterpret_cast<const char*>(p.scales) + s_offset;
      z = kStoredZeros ? reinterpret_cast<const char*>(p.zeros) + s_offset : nullptr;
      if constexpr (kGrouped) {
        const long long s_rows = static_cast<long long>(work.scale_row0) * p.n_padded * 4;
        s += s_rows;
        if (kStoredZeros) z += s_rows;
      }
      // Held, not derived from the lane per stage (the compiler would re-read the lane index
      // and redo the arithmetic under every copy's predicate).
      w = ptx::opaque(w), a = ptx::opaque(a), s = ptx::opaque(s);
      w_dst = ptx::opaque(static_cast<unsigned>(lane) * 16);
      a_dst = ptx::opaque(a_offset(lane, 0));
    }

    // A full stage inside K: the copies without predicates but the lane's rows < M, each at a
    // held offset from the stage, the sources one product of kb0 from the lane's.
    __device__ void load_full(const DenseGemmParams& p, unsigned stage, int kb0, bool with_scales,
                              int lane) const {
      const char* w_stage = w + static_cast<long long>(kb0) * (32 * kBits * 4);
      const unsigned w_to = stage + w_dst;
#pragma unroll
      for (int i = 0; i < kWPerLane; ++i) {
        if (kWChunks % 32 == 0 || lane + 32 * i < kWChunks)
          ptx::cp_async_16(w_to + i * 512, w_stage + i * 512, 16);
      }
      const char* a_stage = a + kb0 * 32;
      const unsigned a_to = stage + a_dst;
#pragma unroll
      for (int i = 0; i < kAPasses; ++i) {
        if (i >= a_passes) break;
        const int chunk_k = kAChunksPerRow >= 32 ? (i % (kAChunksPerRow / 32)) * 256 : 0;
        const int rows = row_of_pass(i);
        a_copy(a_to + rows * Shape::kARowBytes + chunk_k * 2,
               a_stage + static_cast<long long>(rows) * p.lda * 2 + chunk_k * 2, 16);
      }
      if (with_scales) load_scales(p, stage, kb0, lane);
    }

    // Whether the stage of blocks [kb0, kb0 + blocks) is full and inside K (every stage but a
    // range's last, as a rule): load_full serves it, load_edge the others.
    __device__ static bool full_stage(const DenseGemmParams& p, int kb0, int blocks) {
      return blocks == kStageBlocks && (kb0 + kStageBlocks) * 16 <= p.k;
    }

    // A stage that is not full_stage: the blocks [kb0, kb0 + blocks) of the slice into the stage
    // at shared address `stage`, predicated copies; the scales only when `with_scales` (see
    // scales_needed).
    __device__ void load_edge(const DenseGemmParams& p, unsigned stage, int kb0, int blocks,
                              bool with_scales, int lane) const {
      // W: the stage's blocks are one contiguous run of the slice.
      const char* w_stage = w + static_cast<long long>(kb0) * (32 * kBits * 4);
#pragma unroll
      for (int i = 0; i < kWPerLane; ++i) {
        const int chunk = lane + 32 * i;
        if ((kWChunks % 32 == 0 || chunk < kWChunks) && chunk < blocks * 8 * kBits)
          ptx::cp_async_16(stage + chunk * 16, w_stage + i * 512, 16);
      }
      // A: rows < M, 16 bytes of K each; bytes past K are zero-filled (the source then stays in
      // the row, at its start).
      const char* a_stage = a + kb0 * 32;
#pragma unroll
      for (int i = 0; i < kAPasses; ++i) {
        if (i >= a_passes) break;
        const int chunk_k = kAChunksPerRow >= 32
                                ? ((i % (kAChunksPerRow / 32)) * 32 + lane) * 8 - a_chunk_k_of(lane)
                                : 0;
        const char* src =
            a_stage + static_cast<long long>(row_of_pass(i)) * p.lda * 2 + chunk_k * 2;
        int bytes = (p.k - kb0 * 16 - chunk_k - a_chunk_k_of(lane)) * 2;
        bytes = bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes);
        if (bytes == 0) src = static_cast<const char*>(p.a);
        a_copy(stage + a_offset(lane, i), src, bytes);
      }
      if (with_scales) load_scales(p, stage, kb0, lane);
    }

    // Scales (then zeros) of the stage's groups; rows past the last group read as zero.
    __device__ void load_scales(const DenseGemmParams& p, unsigned stage, int kb0, int lane) const {
      const unsigned s_stage = stage + Shape::kWBytes + Shape::kABytes;
      const int g0 = kGroup == 0 ? 0 : static_cast<unsigned>(kb0) / kGroupBlocks;
      const int row_bytes = p.n_padded * 4;
#pragma unroll
      for (int i = 0; i < kSPerLane; ++i) {
        const int row = i * 2 + lane / 16;  // scale rows, then zero rows
        if (row >= kSRows) break;
        const int g = g0 + row % Shape::kScaleRows;
        const bool valid = g < p.groups;
        const char* base = kStoredZeros && row >= Shape::kScaleRows ? z : s;
        const char* src = base + static_cast<long long>(g) * row_bytes;
        ptx::cp_async_16(s_stage + (row * 16 + lane % 16) * 16, valid ? src : s, valid ? 16 : 0);
      }
    }
  };

  // The words of a lane's run that hold the pairs block i feeds the mma (a pair may run into the
  // next word).
  static constexpr int block_pair(int i, bool last) {
    int pair = last ? 0 : 31;
    for (int j = 0; j < 8; ++j)
      for (int b = 0; b < 2; ++b) {
        const int p = Order::decode_pair(i, j, b);
        pair = last ? (p > pair ? p : pair) : (p < pair ? p : pair);
      }
    return pair;
  }
  static constexpr int first_word(int i) { return block_pair(i, false) * kBits / 16; }
  static constexpr int last_word(int i) { return ((block_pair(i, true) + 1) * kBits - 1) / 16; }

  // The lane's 8 values (columns j · 8 + lane / 4) of a scale or zero row of the stage.
  __device__ static void lane_columns(const float* row, int lane, float (&v)[8]) {
    load_lane_columns<Order>(row, lane / 4, v);
  }

  // The B-side offsets of a group for this lane's columns j · 8 + lane / 4 (see
  // dequantize_pair_unscaled).
  __device__ static void group_offsets(const float* zero_row, int lane, unsigned (&off)[8]) {
    constexpr float kBase = kDequant == kDequantIntF32 ? 8388608.0f : (kBf16 ? 128.0f : 1024.0f);
    float zeros[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      zeros[j] = kZeroMode == kZeroConstant ? static_cast<float>(1 << (kBits - 1)) : 0.0f;
    if constexpr (kZeroMode == kZeroInteger) lane_columns(zero_row, lane, zeros);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kDequant == kDequantIntF32) {
        off[j] = __float_as_uint(kBase + zeros[j]);
      } else {
        off[j] = ptx::pack_pair<kBf16>(-(kBase + zeros[j]), -(kBase + zeros[j]));
      }
    }
  }

  // acc += (part − offset · rowsum) · scale for the group whose scale row is `scale_row`; the
  // offset is the zero, plus the base when the codes were lifted.
  __device__ static void flush_group(const float* scale_row, const float* zero_row, int lane,
                                     Accumulators& acc, Accumulators& part, RowSums& rowsum) {
    float s[8], z[8];
    lane_columns(scale_row, lane, s);
    if constexpr (kRowSums) {
      constexpr float kBase = kLifted ? (kBf16 ? 128.0f : 1024.0f) : 0.0f;
      if constexpr (kStoredZeros) {
        lane_columns(zero_row, lane, z);
      } else {
        constexpr float kZero =
            kZeroMode == kZeroConstant ? static_cast<float>(1 << (kBits - 1)) : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) z[j] = kZero;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) z[j] += kBase;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 2 * q + e / 2;
          float v = part[q][bt][e];
          if constexpr (kRowSums) v -= z[j] * rowsum[bt][e % 2];
          acc[q][bt][e] += v * s[j];
          part[q][bt][e] = 0.0f;
        }
#pragma unroll
    for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
      for (int e = 0; e < 4; ++e) rowsum[bt][e] = 0.0f;
  }

  // The lane's addresses in a stage, held (see StageLoader): its code words, and where its
  // ldmatrix row of block 0 starts (in the stage's A rows, or in the zero row for rows ≥ M).
  struct LaneOffsets {
    unsigned words;   // (lane · kBits) words into a block's codes
    unsigned x;       // from the stage (x_in_stage) or absolute, in the zero row
    bool x_in_stage;  // the lane's ldmatrix row is < M

    __device__ LaneOffsets(int rows, unsigned zero_row, int lane) {
      // x2 (8 rows): lanes 0-7 chunk 2i, lanes 8-15 chunk 2i + 1; x4 adds rows 8-15.
      const int row = kBatchTiles == 1 ? lane % 8 : lane % 8 + 8 * ((lane / 8) % 2);
      const int chunk = kBatchTiles == 1 ? (lane / 8) % 2 : lane / 16;
      x_in_stage = row < rows;
      words = ptx::opaque(static_cast<unsigned>(lane) * kBits * 4);
      x = ptx::opaque(x_in_stage ? Shape::kWBytes + row * Shape::kARowBytes + chunk * 16
                                 : zero_row + chunk * 16);
    }
  };

  __device__ static void compute_stage(const DenseGemmParams& p, const char* stage,
                                       const LaneOffsets& lanes, int kb0, int kb_begin, int kb_end,
                                       int lane, unsigned (&off)[8], Accumulators& acc,
                                       Accumulators& part, RowSums& rowsum) {
    const char* w_lane = stage + lanes.words;
    const unsigned x_lane = (lanes.x_in_stage ? ptx::shared_address(stage) : 0u) + lanes.x;
    const float* s_stage = reinterpret_cast<const float*>(stage + Shape::kWBytes + Shape::kABytes);
    const float* z_stage = s_stage + Shape::kScaleRows * 64;
    constexpr unsigned kOnes = kBf16 ? 0x3f803f80u : 0x3c003c00u;
    unsigned words[kReadBlocks][kBits];  // the lane's words of the runs block i reads
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      const int kb = kb0 + i;
      if (kb >= kb_end) break;  // uniform: the last stage of the warp's range may be partial
      const int scale_row = Shape::kScaleRows == 1 ? 0 : i / kGroupBlocks;
      if constexpr (kZerosAtStart) {
        if (kb == kb_begin || kb % kGroupBlocks == 0)
          group_offsets(z_stage + scale_row * 64, lane, off);
      }
      // Only the words holding block i's pairs: all of its run's in the mma order, a quarter of
      // each of the chunk's 4 runs' in the wgmma order (so that a chunk's 4 · bits words are not
      // live at once: 16-row instantiations with stored zeros spilled).
#pragma unroll
      for (int run = 0; run < kReadBlocks; ++run) {
        const unsigned* lane_words = reinterpret_cast<const unsigned*>(
            w_lane + ((i / kReadBlocks) * kReadBlocks + run) * 32 * kBits * 4);
#pragma unroll
        for (int w = first_word(i); w <= last_word(i); ++w) words[run][w] = lane_words[w];
      }
      // B register r of n8 tile j: a pair of one of the read's runs, where the order puts it.
      unsigned b[8][2];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const unsigned(&run)[kBits] = words[Order::decode_run(i, j) % kReadBlocks];
          const int pair = Order::decode_pair(i, j, r);
          if constexpr (kLifted) {
            b[j][r] = lift_pair_int16<kFormat, kBf16>(run, pair);
          } else {
            b[j][r] = dequantize_pair_unscaled<kFormat, kDequant, kBf16>(run, pair, off[j]);
          }
        }

      // Activations as the B operand: ldmatrix rows r < M from the stage, rows ≥ M from the
      // zero row (LaneOffsets); block i is 32 bytes further along either.
      unsigned x[kBatchTiles][2];
      if constexpr (kBatchTiles == 1) {
        ptx::ldmatrix_x2(x[0], x_lane + i * 32);
      } else {
        unsigned r[4];
        ptx::ldmatrix_x4(r, x_lane + i * 32);
        x[0][0] = r[0], x[0][1] = r[2], x[1][0] = r[1], x[1][1] = r[3];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const unsigned w[4] = {b[2 * q][0], b[2 * q + 1][0], b[2 * q][1], b[2 * q + 1][1]};
#pragma unroll
        for (int bt = 0; bt < kBatchTiles; ++bt)
          ptx::mma_m16n8k16<kBf16>(part[q][bt], w, x[bt][0], x[bt][1]);
      }
      if constexpr (kRowSums) {
        const unsigned ones[4] = {kOnes, kOnes, kOnes, kOnes};
#pragma unroll
        for (int bt = 0; bt < kBatchTiles; ++bt)
          ptx::mma_m16n8k16<kBf16>(rowsum[bt], ones, x[bt][0], x[bt][1]);
      }

      // A group ends at a multiple of G, or at the range's end (a split, or K: where a partial
      // last group ends, kb_end = k_blocks).
      if constexpr (kGroupBlocks < kStageBlocks) {  // groups end inside the stage
        if ((kb + 1) % kGroupBlocks == 0 || kb + 1 == kb_end)
          flush_group(s_stage + scale_row * 64, z_stage + scale_row * 64, lane, acc, part, rowsum);
      }
    }
    // Stages no longer than a group: the group can only end with the stage (or the range, in a
    // partial last stage), so one flush site serves the whole stage.
    if constexpr (kGroupBlocks >= kStageBlocks) {
      if ((kb0 + kStageBlocks) % kGroupBlocks == 0 || kb0 + kStageBlocks >= kb_end)
        flush_group(s_stage, z_stage, lane, acc, part, rowsum);
    }
  }

  // Whether compute_stage reads the stage's scale (and zero) rows: always where groups are
  // shorter than a stage or zeros are read at a group's start, else only in a stage
  // that ends a group or the range, the one that flushes (a group of 128 over stages of 64
  // copies its scales once instead of twice; per-channel scales once per range).
  __device__ static bool scales_needed(int kb0, int kb_end) {
    if (Shape::kScaleRows > 1 || kZerosAtStart) return true;
    return kb0 + kStageBlocks >= kb_end || (kb0 + kStageBlocks) % kGroupBlocks == 0;
  }

  // A grouped block's first row of A and C and the rows of its kRows it stores, [begin, end):
  // all of its token block's, or the in-place table's (read again where they are needed rather
  // than held through the main loop, where the kernel has no register to spare).
  struct GroupedRows {
    int row0, begin, end;
  };
  __device__ static GroupedRows grouped_rows(const DenseGemmParams& p) {
    if (p.row_blocks != nullptr) {
      const int* entry = p.row_blocks + kMoeRowBlockFields * blockIdx.y;
      const int begin = __ldg(entry + kRowBlockSkip);
      return {__ldg(entry + kRowBlockLoad0), begin, begin + __ldg(entry + kRowBlockCount)};
    }
    return {static_cast<int>(blockIdx.y) * kRows, 0, kRows};
  }

  // A grouped block's work (DecodeBlockWork); false when its token block lies at or past the
  // routed total (the whole block returns: uniform, before any barrier).
  __device__ static bool grouped_block_work(const DenseGemmParams& p, DecodeBlockWork& work) {
    if (static_cast<int>(blockIdx.y) * kRows >= __ldg(p.routed_total)) return false;
    const int expert = __ldg(p.block_experts + blockIdx.y / p.blocks_per_route);
    if (expert < 0) return false;  // past the total: routing never leaves −1 below it
    work.weight_slice = expert * (p.n_padded / 64) + static_cast<int>(blockIdx.x);
    work.scale_row0 = expert * p.groups;
    work.row0 = grouped_rows(p).row0;
    return true;
  }

  __device__ static void run(const DenseGemmParams& p, char* shared) {
    DecodeBlockWork work{};
    if constexpr (kGrouped) {
      if (!grouped_block_work(p, work)) return;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slice = blockIdx.x;
    const int kb_begin = (blockIdx.z * kWarps + warp) * p.blocks_per_warp;
    const int kb_limit = kb_begin + p.blocks_per_warp;
    const int kb_end = kb_limit < p.k_blocks ? kb_limit : p.k_blocks;
    const int stages =
        kb_end > kb_begin ? (kb_end - kb_begin + kStageBlocks - 1) / kStageBlocks : 0;

    char* mine = shared + warp * Shape::kWarpBytes;
    for (int i = lane; i < Shape::kZeroRowBytes / 4; i += 32)
      reinterpret_cast<unsigned*>(mine)[i] = 0u;  // the zero row
    const LaneOffsets lanes(kGrouped ? kRows : p.m, ptx::shared_address(mine), lane);
    char* ring = mine + Shape::kZeroRowBytes;

    Accumulators acc, part;
    RowSums rowsum;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][bt][e] = 0.0f, part[q][bt][e] = 0.0f;
#pragma unroll
    for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
      for (int e = 0; e < 4; ++e) rowsum[bt][e] = 0.0f;
    unsigned off[8] = {};
    // Offsets of constant and absent zeros now; stored ones at each group's first block
    // (compute_stage); none where the codes are lifted.
    if constexpr (!kLifted && !kZerosAtStart) group_offsets(nullptr, lane, off);

    const StageLoader loader(p, slice, work, lane);
    const unsigned ring_address = ptx::opaque(ptx::shared_address(ring));
    auto load = [&](int s) {
      const int kb0 = kb_begin + s * kStageBlocks;
      const int blocks = kb_end - kb0 < kStageBlocks ? kb_end - kb0 : kStageBlocks;
      const unsigned stage = ring_address + (s % kStages) * Shape::kStageBytes;
      if (StageLoader::full_stage(p, kb0, blocks)) {
        loader.load_full(p, stage, kb0, scales_needed(kb0, kb_end), lane);
      } else {
        loader.load_edge(p, stage, kb0, blocks, scales_needed(kb0, kb_end), lane);
      }
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < stages) load(s);
      ptx::cp_async_commit();
    }
    for (int s = 0; s < stages; ++s) {
      ptx::cp_async_wait<kStages - 2>();
      __syncwarp();  // every lane's copies of stage s landed; every lane is done with s − 1
      if (s + kStages - 1 < stages) load(s + kStages - 1);
      ptx::cp_async_commit();
      compute_stage(p, ring + (s % kStages) * Shape::kStageBytes, lanes,
                    kb_begin + s * kStageBlocks, kb_begin, kb_end, lane, off, acc, part, rowsum);
    }
    ptx::cp_async_wait<0>();
    __syncthreads();

    // Sum the warps' K ranges: into warp 0 (dense: its epilogue, or the split's atomics) or,
    // grouped, into warp q % kWarps for the columns of acc[q] (the epilogue's stores and GLU
    // spread over the warps rather than left to warp 0 while the others wait; a block's
    // epilogue is on its critical path, two blocks an SM). The same order of additions.
    constexpr int kValues = 4 * kBatchTiles * 4;
    float* flat = &acc[0][0][0];
    if constexpr (kWarps > 1 && kGrouped) {
      float* reduce = reinterpret_cast<float*>(shared);
#pragma unroll
      for (int v = 0; v < kValues; ++v) reduce[(warp * kValues + v) * 32 + lane] = flat[v];
      __syncthreads();
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q % kWarps != warp) continue;
#pragma unroll
        for (int v = q * kBatchTiles * 4; v < (q + 1) * kBatchTiles * 4; ++v) {
          flat[v] = reduce[v * 32 + lane];
          for (int other = 1; other < kWarps; ++other)
            flat[v] += reduce[(other * kValues + v) * 32 + lane];
        }
      }
    } else if constexpr (kWarps > 1) {
      float* reduce = reinterpret_cast<float*>(shared);
      if (warp > 0) {
#pragma unroll
        for (int v = 0; v < kValues; ++v) reduce[((warp - 1) * kValues + v) * 32 + lane] = flat[v];
      }
      __syncthreads();
      if (warp == 0) {
        for (int other = 1; other < kWarps; ++other)
#pragma unroll
          for (int v = 0; v < kValues; ++v)
            flat[v] += reduce[((other - 1) * kValues + v) * 32 + lane];
      }
    }

    if constexpr (kGrouped) {
      if (warp >= 4) return;  // owns no columns (kWarps > 4)
      // The token block's rows of C and its expert's bias: both read again (not held through
      // the main loop), the rows at their place in the capacity or the caller's rows.
      const GroupedRows rows = grouped_rows(p);
      DenseGemmParams out = p;
      out.row_factors = nullptr;  // row_blocks' storage (grouped rows are never factored)
      if (p.bias)
        out.bias =
            p.bias +
            static_cast<long long>(__ldg(p.block_experts + blockIdx.y / p.blocks_per_route)) * p.n;
      const int g = lane / 4, t = lane % 4;
      if constexpr (kGlu != 0) {
        // A gate_up weight interleaved for the GLU (kernels::glu_source_row): acc[q][bt][e] and
        // acc[q][bt][e + 2] are gate j and up j, j = 32 · slice + 8q + g, of token row
        // bt · 8 + 2t + e. Each is rounded to C's type, as the separate GLU pass reads them
        // (moe/glue.cuh), and h j goes to C's column j (C has I = N / 2 columns; the bias keeps
        // the gate-then-up order, [experts][N]).
        const int inter = p.n / 2;
        unsigned short* const c = static_cast<unsigned short*>(p.c);
        // The thread's 4 columns' biases, loaded once ahead of the stores (which the compiler
        // must assume could alias them).
        float gate_bias[4] = {}, up_bias[4] = {};
        if (out.bias) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int j = slice * 32 + 8 * q + g;
            if (q % kWarps == warp && j < inter)
              gate_bias[q] = __ldg(out.bias + j), up_bias[q] = __ldg(out.bias + inter + j);
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (q % kWarps != warp) continue;
#pragma unroll
          for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int row = bt * 8 + 2 * t + e, j = slice * 32 + 8 * q + g;
              if (row < rows.begin || row >= rows.end || j >= inter) continue;
              const float gate = acc[q][bt][e] * p.global_scale + gate_bias[q];
              const float up = acc[q][bt][e + 2] * p.global_scale + up_bias[q];
              const float h = apply_glu(kGlu - 1, rounded_to_half<kOutput>(gate),
                                        rounded_to_half<kOutput>(up), p.glu_alpha, p.glu_limit);
              c[static_cast<long long>(rows.row0 + row) * p.ldc + j] = to_output_half<kOutput>(h);
            }
        }
        return;
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q % kWarps != warp) continue;
#pragma unroll
        for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = bt * 8 + 2 * t + e % 2, col = slice * 64 + (2 * q + e / 2) * 8 + g;
            if (row < rows.begin || row >= rows.end || col >= p.n) continue;
            store_single<kOutput>(out, rows.row0 + row, col, acc[q][bt][e] * p.global_scale);
          }
      }
      return;
    }
    if (!kSplitK && warp != 0) return;
    if (warp == 0) {
      const int g = lane / 4, t = lane % 4;
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int bt = 0; bt < kBatchTiles; ++bt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = bt * 8 + 2 * t + e % 2, col = slice * 64 + (2 * q + e / 2) * 8 + g;
            if (row >= p.m || col >= p.n) continue;
            if constexpr (kSplitK) {
              atomicAdd(p.workspace + static_cast<long long>(row) * p.n + col, acc[q][bt][e]);
            } else {
              store_single<kOutput>(p, row, col, acc[q][bt][e] * p.global_scale);
            }
          }
    }
    if constexpr (kSplitK) finish_split_tile<kOutput>(p, blockIdx.x, 0, kRows, slice * 64, 64);
  }
};

// Template arguments in the order of the JIT family "dense_decode_sm80" (src/jit/kernel_spec.cpp):
// kActivation 0 bf16 / 1 fp16; kDequant = UnscaledDequant; kGrouped: the MoE mode (above);
// kOrder 0 the mma order, 1 the wgmma order (= layout::FragmentOrder, the spec's "order");
// kGlu 0 none, else 1 + MoeGluKind: the grouped gate_up GEMM with its GLU fused (an
// interleaved weight); kThreads and kDynamicSmemBytes come from the spec, which the dispatcher
// sizes with the same decode_shape, and must agree.
template <int kRows, int kWarps, int kStageBlocks, int kStages, unsigned long long kFormat,
          int kZeroMode, int kGroup, int kActivation, int kOutput, bool kSplitK, int kDequant,
          int kMinBlocks, bool kGrouped, int kOrder, int kGlu, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    dense_decode_sm80(const DenseGemmParams params) {
  using Gemm =
      DecodeGemm<kRows, kWarps, kStageBlocks, kStages, kFormat, kZeroMode, kGroup, kActivation == 0,
                 kOutput, kSplitK, kDequant, kGrouped, kOrder == 1, kGlu>;
  static_assert(kThreads == Gemm::Shape::kThreads, "spec threads differ from the kernel's shape");
  static_assert(kDynamicSmemBytes == Gemm::Shape::kSharedBytes,
                "spec shared memory differs from the kernel's shape");
  extern __shared__ __align__(128) char shared[];
  Gemm::run(params, shared);
}

}  // namespace qgemm::kernels
