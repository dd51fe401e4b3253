// Dense quantized GEMM on mma.sync (SM80+): C[M, N] = A[M, K] · dequant(W)[N, K]ᵀ.
//
// One template serves every weight format of ≤ 8 bits (gemm/mma_weight_layout.cuh) against
// bf16/fp16 activations, and against 8-bit ones (int8, e4m3) where the weight's values fit the
// 8-bit mma; decode and prefill differ only in the tile constants.
//
//   block tile  BM × BN × BK,  BM = 16 · kMTiles · kWarpsM,  BN = 64 · kWarpsN
//   warps       (wk, wm, wn): wn picks a 64-column slice, wm a band of 16·kMTiles rows,
//               wk the k16 blocks kb ≡ wk (mod kWarpsK) of every stage (summed at the end)
//
//        k →  ┌──────── BK ────────┐
//   A  BM rows│ stage s (smem, 16B │   cp.async.cg, zero-filled past M and K,
//             │ chunks XOR-swizzled│   read with ldmatrix.x4 (conflict-free)
//             └────────────────────┘
//   W  BN/64 slices × BK/16 blocks × 32 lanes × bits words: copied verbatim (cp.async), each
//      lane then loads its own `bits` words and dequantizes them into 8 B operands
//   S  scale (and zero) rows of the stage's groups, BN floats each, lane-permuted
//
// Pipeline: kStages stages in flight; at step t the block waits for stage t, then issues the
// copies of stage t + kStages − 1 into the slot freed by step t − 1, then computes stage t.
//
// 16-bit activations: each k16 block's B fragments are dequantized with their scales (fp32 or
// packed16 math) and fed to mma.m16n8k16.
// 8-bit activations (int8, e4m3; one K warp): A rows are bytes in the permuted K order of
// MmaWeightLayout::operand8_position (the quantizer writes them so), two k16 blocks of codes make
// the B registers of one mma.m16n8k32 (dequant/mma_dequant.cuh, lane_bytes), unscaled; the
// sums of each group land in `part` (s32 for int8, f32 for e4m3) and at the group's end
// acc += (part − zero · Σ_k A) · scale in fp32, the integer zero taken off in s32 with Σ_k A from
// one more mma against ones (int8 codes with a zero point only: e4m3 codes already hold u − zero).
//
// Split-K (kSplitK): blockIdx.z takes a contiguous range of K stages; the partial sums meet in
// the workspace (gemm/epilogue.cuh).
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "gemm/sm80_dense_shape.cuh"
#include "ptx/async_copy.cuh"
#include "ptx/convert.cuh"
#include "ptx/mma_sync.cuh"

namespace qgemm::kernels {

// The instantiation's shape (gemm/sm80_dense_shape.cuh, which the dispatcher evaluates too),
// as compile-time constants.
template <int kMTiles, int kWarpsM, int kWarpsN, int kWarpsK, int kBlockK, int kStages, int kBits,
          int kGroup, bool kStoredZeros, int kElemBytes>
struct DenseGemmShape {
  static constexpr DenseTile kTile = {kMTiles, kWarpsM, kWarpsN, kWarpsK, kBlockK, kStages};
  static constexpr DenseShape kShape = dense_shape(kTile, kBits, kGroup, kStoredZeros, kElemBytes);
  static constexpr int kThreads = kShape.threads;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kKBlocks = kShape.k_blocks;
  static constexpr int kScaleRows = kShape.scale_rows;
  static constexpr int kABytes = kShape.a_bytes;
  static constexpr int kBBytes = kShape.b_bytes;
  static constexpr int kSBytes = kShape.s_bytes;
  static constexpr int kStageBytes = kShape.stage_bytes;
  static constexpr int kSharedBytes = kShape.shared_bytes;

  static_assert(dense_tile_error(kTile, kGroup, kElemBytes) == nullptr,
                "tile config and operands disagree (dense_tile_error says why)");
  static_assert(kABytes % 16 == 0 && kBBytes % 16 == 0 && kSBytes % 16 == 0, "16-byte stages");
};

template <bool kInt>
struct PartialSum {
  using Type = float;
};
template <>
struct PartialSum<true> {
  using Type = int;
};

// kActivation: 0 bf16, 1 fp16, 2 int8, 3 e4m3 (the JIT family's "act"); kDequant: 0 fp32,
// 1 packed16 (16-bit activations), 2 + ByteDequant (8-bit ones; its "dequant").
template <int kMTiles, int kWarpsM, int kWarpsN, int kWarpsK, int kBlockK, int kStages,
          unsigned long long kFormat, int kZeroMode, int kGroup, int kActivation, int kOutput,
          bool kSplitK, int kDequant>
struct DenseGemm {
  static constexpr int kBits = FormatCode::unpack(kFormat).bits;
  static constexpr bool kStoredZeros = kZeroMode == kZeroInteger || kZeroMode == kZeroFloat;
  static constexpr bool kBf16 = kActivation == 0;
  static constexpr bool kPacked16 = kDequant == 1;
  static constexpr bool kBytes = kActivation >= 2;  // 8-bit activations, mma.m16n8k32
  static constexpr bool kInt8 = kActivation == 2;
  static constexpr int kByteDequant = kDequant - 2;
  static constexpr bool kRowSums = kInt8 && kZeroMode != kZeroNone;
  using Sum = typename PartialSum<kInt8>::Type;
  static_assert(kBytes == (kDequant >= 2), "8-bit activations take the byte dequantizations");
  static_assert(!kBytes || kWarpsK == 1, "8-bit activations: one K warp (groups flush in order)");
  static_assert(!kInt8 || (kByteDequant == kBytesRaw && !FormatCode::unpack(kFormat).is_float() &&
                           kZeroMode != kZeroFloat),
                "int8 activations take integer codes as they are, with integer zero points");
  using Shape = DenseGemmShape<kMTiles, kWarpsM, kWarpsN, kWarpsK, kBlockK, kStages, kBits, kGroup,
                               kStoredZeros, kBytes ? 1 : 2>;
  static constexpr int kThreads = Shape::kThreads;
  static constexpr int kBlockM = Shape::kBlockM, kBlockN = Shape::kBlockN;
  static constexpr int kKBlocks = Shape::kKBlocks;
  static constexpr int kRowBytes = kBlockK * (kBytes ? 1 : 2);  // of an A row in a stage
  static constexpr int kChunksPerRow = kRowBytes / 16;          // 16-byte chunks of an A row

  // Byte offset of A's 16-byte chunk `chunk` of row `row` inside a stage.
  __device__ static int a_offset(int row, int chunk) {
    return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
  }

  __device__ static void load_stage(const DenseGemmParams& p, char* stage, int tile, int m0,
                                    int slice0) {
    const int tid = threadIdx.x;
    const int k0 = tile * kBlockK;
    // A: kBlockM rows × kChunksPerRow chunks; bytes past K (or rows past M) are zero-filled.
    // 8-bit rows are whole chunks of 16 (K permuted inside them, the tail written as zero).
    const char* a = static_cast<const char*>(p.a);
    constexpr int kElemBytes = kBytes ? 1 : 2;
    for (int i = tid; i < kBlockM * kChunksPerRow; i += kThreads) {
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int k = k0 + chunk * (16 / kElemBytes);
      int bytes = kBytes ? (k < p.k ? 16 : 0) : (p.k - k) * 2;
      bytes = bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes);
      if (m0 + row >= p.m) bytes = 0;
      const char* src = bytes ? a + (static_cast<long long>(m0 + row) * p.lda + k) * kElemBytes : a;
      ptx::cp_async_16(stage + a_offset(row, chunk), src, bytes);
    }
    // W: per slice one contiguous run of kKBlocks · 32 · bits words.
    char* b_stage = stage + Shape::kABytes;
    constexpr int kChunksPerSlice = kKBlocks * 32 * kBits * 4 / 16;
    const int first_block = tile * kKBlocks;
    for (int i = tid; i < kWarpsN * kChunksPerSlice; i += kThreads) {
      const int s = i / kChunksPerSlice, chunk = i % kChunksPerSlice;
      const int slice = slice0 + s;
      const int block = first_block + chunk / (8 * kBits);  // a k16 block is 8 · bits chunks
      const bool valid = slice * 64 < p.n_padded && block < p.k_blocks;
      const char* src =
          reinterpret_cast<const char*>(p.b) +
          ((static_cast<long long>(slice) * p.k_blocks + first_block) * 32 * kBits * 4 +
           chunk * 16);
      ptx::cp_async_16(b_stage + i * 16, valid ? src : reinterpret_cast<const char*>(p.b),
                       valid ? 16 : 0);
    }
    // Scales (then zeros): kScaleRows rows of kBlockN floats. Groups start at multiples of G
    // even when the last one is partial (K % G != 0), so a stage's groups are first_group + row;
    // rows past the last group (a tile that runs past K) are zero-filled instead of read past
    // [groups][n_padded], and only k16 blocks past K (zero codes, zero activations) use them.
    char* s_stage = b_stage + Shape::kBBytes;
    const int first_group = kGroup == 0 ? 0 : k0 / kGroup;
    constexpr int kChunksPerScaleRow = kBlockN * 4 / 16;
    constexpr int kArrays = kStoredZeros ? 2 : 1;
    for (int i = tid; i < kArrays * Shape::kScaleRows * kChunksPerScaleRow; i += kThreads) {
      const int array = i / (Shape::kScaleRows * kChunksPerScaleRow);
      const int rest = i % (Shape::kScaleRows * kChunksPerScaleRow);
      const int row = rest / kChunksPerScaleRow, chunk = rest % kChunksPerScaleRow;
      const int group = first_group + row;
      const int column = slice0 * 64 + chunk * 4;
      const bool valid = group < p.groups && column < p.n_padded;
      const float* base = array == 0 ? p.scales : p.zeros;
      const float* src = base + static_cast<long long>(group) * p.n_padded + column;
      ptx::cp_async_16(s_stage + i * 16, valid ? src : base, valid ? 16 : 0);
    }
  }

  // N consecutive words from shared memory in the widest loads their alignment allows (the
  // callers' addresses are multiples of N words when N is 4 or 8, of 2 words when N is even).
  template <int N>
  __device__ static void load_shared(unsigned (&out)[N], const unsigned* from) {
    if constexpr (N % 4 == 0) {
#pragma unroll
      for (int i = 0; i < N; i += 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(from + i);
        out[i] = v.x, out[i + 1] = v.y, out[i + 2] = v.z, out[i + 3] = v.w;
      }
    } else if constexpr (N % 2 == 0) {
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(from + i);
        out[i] = v.x, out[i + 1] = v.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = from[i];
    }
  }

  __device__ static void compute_stage(const char* stage, int wk, int wm, int wn, int lane,
                                       float (&acc)[kMTiles][8][4]) {
    const char* b_stage = stage + Shape::kABytes;
    const float* s_stage = reinterpret_cast<const float*>(b_stage + Shape::kBBytes);
    const unsigned a_base = ptx::shared_address(stage);
    // The lane's 8 scales (and zeros) of scale row r, 32-byte aligned runs, and their packed16
    // factors: once per stage when the stage lies in one group, else per k16 block.
    float scales[8], zeros[8];
    unsigned scale_pairs[8], offset_pairs[8];
    auto prepare_group = [&](int r) {
      const float* scale_line = s_stage + r * kBlockN + wn * 64 + (lane / 4) * 8;
      load_shared<8>(reinterpret_cast<unsigned(&)[8]>(scales),
                     reinterpret_cast<const unsigned*>(scale_line));
      if constexpr (kStoredZeros) {
        load_shared<8>(reinterpret_cast<unsigned(&)[8]>(zeros),
                       reinterpret_cast<const unsigned*>(scale_line + Shape::kScaleRows * kBlockN));
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) zeros[j] = 0.0f;
      }
      if constexpr (kPacked16)
        packed16_factors<kFormat, kZeroMode, kBf16>(scales, zeros, scale_pairs, offset_pairs);
    };
    if constexpr (Shape::kScaleRows == 1) prepare_group(0);
#pragma unroll
    for (int step = 0; step < kKBlocks / kWarpsK; ++step) {
      const int kb = step * kWarpsK + wk;
      // This lane's codes.
      unsigned words[kBits];
      const unsigned* lane_words =
          reinterpret_cast<const unsigned*>(b_stage) + ((wn * kKBlocks + kb) * 32 + lane) * kBits;
      load_shared<kBits>(words, lane_words);
      if constexpr (Shape::kScaleRows > 1) prepare_group((kb * 16) / kGroup);
      unsigned b[8][2];
      if constexpr (kPacked16) {
        dequantize_lane_packed16<kFormat, kBf16>(words, scale_pairs, offset_pairs, b);
      } else {
        dequantize_lane<kFormat, kZeroMode, kBf16>(words, scales, zeros, b);
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        // ldmatrix.x4: lanes 0-15 address rows 0-15 at chunk 2kb, lanes 16-31 at chunk 2kb + 1.
        const int row = (wm * kMTiles + mt) * 16 + (lane % 16);
        const int chunk = kb * 2 + lane / 16;
        unsigned a[4];
        ptx::ldmatrix_x4(a, a_base + a_offset(row, chunk));
#pragma unroll
        for (int j = 0; j < 8; ++j) ptx::mma_m16n8k16<kBf16>(acc[mt][j], a, b[j][0], b[j][1]);
      }
    }
  }

  using Parts = Sum[kMTiles][8][4];
  using RowSums = int[kMTiles][4];

  // acc += (part − offset · rowsum) · scale for the group of scale row `r` (8-bit activations).
  // A lane's accumulator columns are j · 8 + 2t + h (t = lane % 4, h = e % 2), stored at
  // 16t + 8h + j of the slice's permuted row: 16 consecutive floats, read 4 at a time (held all
  // at once with the zeros, they cost the registers of a spill).
  __device__ __forceinline__ static void flush_group(const float* s_stage, int r, int wn, int lane,
                                                     float (&acc)[kMTiles][8][4], Parts& part,
                                                     RowSums& rowsum) {
    const float* scale_line = s_stage + r * kBlockN + wn * 64 + (lane % 4) * 16;
    const float* zero_line = scale_line + Shape::kScaleRows * kBlockN;
#pragma unroll
    for (int quad = 0; quad < 4; ++quad) {  // columns c = 4 · quad .. + 3: h = quad / 2
      const int h = quad / 2;
      const float4 s4 = *reinterpret_cast<const float4*>(scale_line + 4 * quad);
      float4 z4 = {};
      if constexpr (kRowSums && kStoredZeros)
        z4 = *reinterpret_cast<const float4*>(zero_line + 4 * quad);
      const float scales[4] = {s4.x, s4.y, s4.z, s4.w}, zeros[4] = {z4.x, z4.y, z4.z, z4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = (quad % 2) * 4 + i;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int e = h; e < 4; e += 2) {
            Sum sum = part[mt][j][e];
            if constexpr (kRowSums) {  // integer offsets: exact in s32
              const int zero =
                  kZeroMode == kZeroConstant ? 1 << (kBits - 1) : static_cast<int>(zeros[i]);
              sum -= zero * rowsum[mt][e & 2];
            }
            acc[mt][j][e] += static_cast<float>(sum) * scales[i];
            part[mt][j][e] = 0;
          }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) rowsum[mt][e] = 0;
  }

  // One stage against 8-bit activations: K steps of 32 (two k16 blocks), groups flushed as they
  // end, and at `range_end` (the split's last tile) whatever is pending.
  __device__ __forceinline__ static void compute_stage8(const char* stage, int tile, bool range_end,
                                                        int wm, int wn, int lane,
                                                        float (&acc)[kMTiles][8][4], Parts& part,
                                                        RowSums& rowsum) {
    const char* b_stage = stage + Shape::kABytes;
    const float* s_stage = reinterpret_cast<const float*>(b_stage + Shape::kBBytes);
    const unsigned a_base = ptx::shared_address(stage);
    // int16 via fp16: −(1024 + zero) of the lane's B columns j · 8 + lane / 4 (stored at
    // (lane / 4) · 8 + j), in both halves.
    unsigned offsets[8] = {};
    auto prepare_offsets = [&](int r) {
      if constexpr (kByteDequant == kBytesInt16) {
        float zeros[8];
        if constexpr (kZeroMode == kZeroInteger) {
          load_shared<8>(
              reinterpret_cast<unsigned(&)[8]>(zeros),
              reinterpret_cast<const unsigned*>(s_stage + (Shape::kScaleRows + r) * kBlockN +
                                                wn * 64 + (lane / 4) * 8));
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float zero = 0.0f;
          if constexpr (kZeroMode == kZeroConstant) zero = static_cast<float>(1 << (kBits - 1));
          if constexpr (kZeroMode == kZeroInteger) zero = zeros[j];
          offsets[j] = ptx::pack_pair<false>(-(1024.0f + zero), -(1024.0f + zero));
        }
      }
    };
    if constexpr (Shape::kScaleRows == 1) prepare_offsets(0);
    constexpr unsigned kOnes = 0x01010101u;
    // Not unrolled: unrolled, ptxas for SM80 hoists the next steps' loads above the flushes of
    // short groups (g32) and spills.
#pragma unroll 1
    for (int step = 0; step < kKBlocks / 2; ++step) {
      const int r = Shape::kScaleRows == 1 ? 0 : step * 32 / kGroup;
      if constexpr (Shape::kScaleRows > 1)
        if (step * 32 % kGroup == 0) prepare_offsets(r);
      unsigned b[2][8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned words[kBits];
        load_shared<kBits>(words, reinterpret_cast<const unsigned*>(b_stage) +
                                      ((wn * kKBlocks + step * 2 + h) * 32 + lane) * kBits);
        lane_bytes<kFormat, kByteDequant>(words, offsets, b[h]);
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        // ldmatrix.x4: lanes 0-15 address rows 0-15 at chunk 2 · step, lanes 16-31 at the next
        // (32 bytes = 32 of K).
        const int row = (wm * kMTiles + mt) * 16 + (lane % 16);
        unsigned a[4];
        ptx::ldmatrix_x4(a, a_base + a_offset(row, step * 2 + lane / 16));
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if constexpr (kInt8) {
            ptx::mma_m16n8k32_s8u8(part[mt][j], a, b[0][j], b[1][j]);
          } else {
            ptx::mma_m16n8k32_e4m3(part[mt][j], a, b[0][j], b[1][j]);
          }
        }
        if constexpr (kRowSums) ptx::mma_m16n8k32_s8u8(rowsum[mt], a, kOnes, kOnes);
      }
      if constexpr (kGroup != 0 && kGroup < kBlockK) {  // groups end inside the stage
        if ((step + 1) * 32 % kGroup == 0) flush_group(s_stage, r, wn, lane, acc, part, rowsum);
      }
    }
    // A partial last group ends at K, inside the last tile: for G < BK the tile ends on a
    // multiple of G past K (the padding adds zero sums), for G >= BK it is the range's end.
    if constexpr (kGroup == 0 || kGroup >= kBlockK) {
      const bool group_ends = kGroup != 0 && (tile + 1) * kBlockK % kGroup == 0;
      if (group_ends || range_end) flush_group(s_stage, 0, wn, lane, acc, part, rowsum);
    }
  }

  __device__ static void run(const DenseGemmParams& p, char* shared) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wn = warp % kWarpsN, wm = (warp / kWarpsN) % kWarpsM, wk = warp / (kWarpsN * kWarpsM);
    const int m0 = blockIdx.y * kBlockM;
    const int slice0 = blockIdx.x * kWarpsN;
    const int tile_begin = kSplitK ? blockIdx.z * p.tiles_per_split : 0;
    int tile_end = kSplitK ? tile_begin + p.tiles_per_split : p.k_tiles;
    tile_end = tile_end < p.k_tiles ? tile_end : p.k_tiles;
    const int tiles = tile_end > tile_begin ? tile_end - tile_begin : 0;

    float acc[kMTiles][8][4];
    Parts part;  // 8-bit activations only (else unused, and dropped by the compiler)
    RowSums rowsum;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f, part[mt][j][e] = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) rowsum[mt][e] = 0;
    }

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < tiles) load_stage(p, shared + s * Shape::kStageBytes, tile_begin + s, m0, slice0);
      ptx::cp_async_commit();
    }
    for (int t = 0; t < tiles; ++t) {
      ptx::cp_async_wait<kStages - 2>();
      __syncthreads();
      const int next = t + kStages - 1;
      if (next < tiles)
        load_stage(p, shared + (next % kStages) * Shape::kStageBytes, tile_begin + next, m0,
                   slice0);
      ptx::cp_async_commit();
      const char* stage = shared + (t % kStages) * Shape::kStageBytes;
      if constexpr (kBytes) {
        compute_stage8(stage, tile_begin + t, t == tiles - 1, wm, wn, lane, acc, part, rowsum);
      } else {
        compute_stage(stage, wk, wm, wn, lane, acc);
      }
    }
    ptx::cp_async_wait<0>();
    __syncthreads();

    // Sum the K warps' partial tiles into the wk == 0 warps.
    if constexpr (kWarpsK > 1) {
      float* reduce = reinterpret_cast<float*>(shared);
      const int band = wm * kWarpsN + wn;
      constexpr int kValues = kMTiles * 8 * 4;
      if (wk > 0) {
        float* mine = reduce + (((wk - 1) * kWarpsM * kWarpsN + band) * 32 + lane) * kValues;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) mine[(mt * 8 + j) * 4 + e] = acc[mt][j][e];
      }
      __syncthreads();
      if (wk == 0) {
        for (int other = 1; other < kWarpsK; ++other) {
          const float* theirs =
              reduce + (((other - 1) * kWarpsM * kWarpsN + band) * 32 + lane) * kValues;
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[mt][j][e] += theirs[(mt * 8 + j) * 4 + e];
        }
      }
    }

    const int row_base = m0 + wm * kMTiles * 16 + lane / 4;
    const int col_base = (slice0 + wn) * 64 + (lane % 4) * 2;
    if (!kSplitK && wk != 0) return;
    if (wk == 0) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = row_base + mt * 16 + half * 8, col = col_base + j * 8;
            const float v0 = acc[mt][j][half * 2], v1 = acc[mt][j][half * 2 + 1];
            if constexpr (kSplitK) {
              add_split_pair(p, row, col, v0, v1);
            } else {
              store_pair<kOutput>(p, row, col, v0 * p.global_scale, v1 * p.global_scale);
            }
          }
    }
    if constexpr (kSplitK)
      finish_split_tile<kOutput>(p, blockIdx.y * gridDim.x + blockIdx.x, m0, kBlockM, slice0 * 64,
                                 kBlockN);
  }
};

// kActivation: 0 bf16, 1 fp16, 2 int8, 3 e4m3 (the order of the JIT family's "act" choice);
// kDequant: 0 fp32, 1 packed16, 2-4 the ByteDequant of 8-bit activations (its "dequant" choice,
// dequant/mma_dequant.cuh); kMinBlocks: the blocks per SM the register allocation must allow
// (the config's residency target). kThreads and kDynamicSmemBytes come from the spec, which the
// dispatcher sizes with the same dense_shape, and must agree.
template <int kMTiles, int kWarpsM, int kWarpsN, int kWarpsK, int kBlockK, int kStages,
          unsigned long long kFormat, int kZeroMode, int kGroup, int kActivation, int kOutput,
          bool kSplitK, int kDequant, int kMinBlocks, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    dense_gemm_sm80(const DenseGemmParams params) {
  using Gemm = DenseGemm<kMTiles, kWarpsM, kWarpsN, kWarpsK, kBlockK, kStages, kFormat, kZeroMode,
                         kGroup, kActivation, kOutput, kSplitK, kDequant>;
  static_assert(kThreads == Gemm::kThreads, "spec threads differ from the kernel's shape");
  static_assert(kDynamicSmemBytes == Gemm::Shape::kSharedBytes,
                "spec shared memory differs from the kernel's shape");
  extern __shared__ __align__(128) char shared[];
  Gemm::run(params, shared);
}

}  // namespace qgemm::kernels
