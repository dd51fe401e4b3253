// Dense GEMM on Hopper tensor cores (sm_90a): C[M, N] = A[M, K] · dequant(W)[N, K]ᵀ through
// wgmma.mma_async, with the dequantized weight as the register operand (or, with transform
// warps, as a shared-memory operand).
//
// Operands are swapped: each consumer warpgroup computes Cᵀ = W · Aᵀ for a 64-row weight tile
// (wgmma's M = 64) and a block of kTokens tokens (wgmma's N = 8 .. 256), so one instantiation
// serves decode (N = 8) and prefill (N = 256) alike.
//
//   grid    persistent: one block per SM walks the units u = blockIdx.x, + gridDim.x, ...
//           unit u: weight block u % n_blocks (block_n = 64 · kConsumers rows), token block
//           (u / n_blocks) % m_blocks, K split u / (n_blocks · m_blocks) (chunks_per_split
//           chunks of 64; the last split may be shorter)
//   grouped (MoE, kGrouped; params.block_experts): A holds the routed rows in expert order, each
//           expert's run padded to whole token blocks; the units cover the token blocks below
//           the routed total (read on the device), and a unit takes its weight, scales and
//           bias from the expert of its token block. Rows grouped in place (params.row_blocks):
//           a token block's rows start where the table says, and only the rows of its expert
//           are stored
//   block   warpgroup 0     producer: one thread waits for a free stage and issues its copies
//                           (TMA for A, bulk copies for W and the scales) on the stage's `full`
//                           barrier, which counts the bytes
//           warpgroup 1 + c consumer c: weight tile n_block · kConsumers + c; waits for `full`,
//                           dequantizes each chunk of 64 K from shared memory into its A
//                           fragments and issues 4 wgmma (k16 each), then releases the stage on
//                           its `empty` barrier once those wgmma have completed
//
//   pipeline of a consumer (two fragment buffers, wgmma groups committed per chunk):
//
//     chunk i:   [dequant i → buf i%2] fence [4 × wgmma(buf i%2)] commit  wait(≤ 1 pending)
//                                                                   └─ chunk i − 1 done: its
//                                                                      stage is released when
//                                                                      chunk i opens a new one
//     so the dequantization of chunk i + 1 runs while chunk i's wgmma are in flight. For token
//     widths ≤ 64 the group scales may be promoted: unscaled weights, fp32 group sums scaled
//     into the result (gemm/sm90_wgmma_shape.cuh, wgmma_promotes_scales).
//
//   transform (kTransform): warps 1-3 of warpgroup 0 dequantize each chunk's tiles into one of
//   two shared buffers (K-major, 128-byte swizzle: wgmma's A from shared memory); a consumer
//   waits for the buffer's `filled` barrier, issues 4 wgmma with both operands in shared memory,
//   and releases the previous chunk's buffer (`drained`) once its wgmma have completed:
//
//     transform:  [wait drained b] dequant tiles → stmatrix → buf b  fence.proxy.async  arrive filled b
//     consumer:   [wait filled b] 4 × wgmma(buf b, A box)  commit  wait(≤ 1)  arrive drained b'
//
//   8-bit (kEightBit, the tile's eight_bit: e4m3 activation codes on the FP8 tensor cores, or
//   int8 codes on the INT8 ones, kS8): the same ring and warps, but
//
//     A      the codes as the activation quantizer writes them for the 8-bit mma (rows of K
//            bytes, K permuted inside each run of 16: MmaWeightLayout::operand8_position), one
//            TMA box of kTokens rows × 128 codes per two chunks (128-byte swizzle)
//     weight the same prepared words as the 16-bit path, turned into exact e4m3 or s8 codes
//            with a few PRMT (dequant/wgmma_codes8.cuh, which draws how the permuted K lines up)
//     wgmma  2 × m64nNk32 per chunk (k32 step s of chunk ch at byte (ch % 2) · 64 + 32 s of
//            box ch / 2), into a group accumulator (fp32, or exact s32 sums converted when
//            promoted): every scale group is promoted (sums × the group's scale, once per group
//            of whole chunks); per-token and per-tensor
//            factors and the global scale are applied in the epilogue (row factors); 1x128
//            activation groups (kActGroupScales, fp8-block) are promoted with the weight's
//            scale: sums × weight row scale × the token's group scale (DeepGEMM's way)
//
//   shared memory: see gemm/sm90_wgmma_shape.cuh. A stage's A box of chunk ch is kTokens rows of
//   64 values (128 B) with TMA's 128-byte swizzle, which is the K-major layout the wgmma matrix
//   descriptor names (ptx/wgmma.cuh); k16 step kb starts 32 · kb bytes into the box.
//
//   accumulators (ptx/wgmma.cuh): acc[4j + e] = weight row tile · 64 + 16 · warp + g + 8 (e / 2),
//   token m_block · kTokens + 8j + 2t + e % 2 (g = lane / 4, t = lane % 4).
//
// Bounds: TMA fills A past M and K with zeros; W and the scales are padded to 64 rows and 64 K
// (code 0, scale 0); a stage past K copies only its chunks inside K and the consumers skip the
// rest; scale rows past the last group are never read (the row index is clamped to the rows the
// producer copied). Split-K: partial sums are reduced into an fp32 workspace that holds each
// (token block, weight tile) as its 128 threads' accumulators ([q][thread][4], 16-byte
// reductions), and the last split to arrive emits them and zeroes its slice (gemm/epilogue.cuh's
// counter protocol, per warpgroup). 16-bit outputs leave through a per-warpgroup staging slice
// (stmatrix.trans, then 16-byte row pieces; Consumer::emit draws it).
#pragma once

#include "dequant/wgmma_dequant.cuh"
#include "dequant/wgmma_codes8.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/sm90_wgmma_shape.cuh"
#include "gemm/wgmma_gemm_params.cuh"
#include "gemm/wgmma_weight_layout.cuh"
#include "moe/glu.cuh"
#include "moe/routing_args.cuh"  // the in-place row-block table
#include "ptx/bulk_copy.cuh"
#include "ptx/mma_sync.cuh"  // stmatrix
#include "ptx/reduce.cuh"
#include "ptx/warpgroup.cuh"
#include "ptx/wgmma.cuh"

namespace qgemm::kernels {

// The wgmma step of a tile: m64nNk16 on bf16/fp16 (kCodes8 −1), or m64nNk32 on e4m3 or s8
// codes (kCodes8 = WgmmaCodes8).
template <int kCodes8, int kTokens, bool kBf16>
struct WgmmaStep {
  using Type = ptx::Wgmma<kTokens, kBf16>;
};
template <int kTokens, bool kBf16>
struct WgmmaStep<kCodes8E4m3, kTokens, kBf16> {
  using Type = ptx::WgmmaE4m3<kTokens>;
};
template <int kTokens, bool kBf16>
struct WgmmaStep<kCodes8S8, kTokens, kBf16> {
  using Type = ptx::WgmmaS8<kTokens>;
};

template <bool kS8>
struct WgmmaSumOf {
  using Type = float;
};
template <>
struct WgmmaSumOf<true> {
  using Type = int;
};

template <int kConsumers, int kTokens, int kStageChunks, int kStages, bool kTransform,
          unsigned long long kFormat, int kZeroMode, int kGroup, bool kBf16, int kOutput,
          bool kSplitK, int kDequant, bool kGrouped, int kCodes8 = -1, bool kActGroupScales = false,
          int kGlu = 0>
struct WgmmaGemm {
  static_assert(kGlu == 0 || (kGrouped && kOutput != kOutFp32),
                "a fused GLU is the grouped gate_up GEMM's, with 16-bit rows out");
  static constexpr FormatCode kF = FormatCode::unpack(kFormat);
  static constexpr int kBits = kF.bits;
  static constexpr bool kStoredZeros = kZeroMode == kZeroInteger || kZeroMode == kZeroFloat;
  // 8-bit tiles (kCodes8 = WgmmaCodes8): activation codes and the weight as exact codes of that
  // type (dequant/wgmma_codes8.cuh); kS8: the INT8 tensor cores, exact s32 sums.
  static constexpr bool kEightBit = kCodes8 >= 0;
  static constexpr bool kS8 = kCodes8 == kCodes8S8;
  static constexpr WgmmaTile kTile = {kConsumers, kTokens, kStageChunks, kStages, kTransform,
                                      kEightBit};
  static constexpr WgmmaShape kShape = wgmma_shape(kTile, kBits, kGroup, kStoredZeros);
  static_assert(wgmma_tile_error(kTile, kGroup) == nullptr,
                "wgmma config and weight disagree (wgmma_tile_error says why)");
  static_assert((kCodes8 == kCodes8E4m3) == (kDequant == kWgmmaE4m3) &&
                    (kCodes8 == kCodes8S8) == (kDequant == kWgmmaS8),
                "the e4m3 and s8 dequantizations serve the 8-bit tiles of their type, and only "
                "them");
  static_assert(!kEightBit ||
                    (!kStoredZeros && wgmma_codes8_exact(kFormat, kZeroMode == kZeroConstant,
                                                         kCodes8)),
                "the 8-bit wgmma takes 2-, 4- and 8-bit codes with at most a constant zero, "
                "every value exact in its type");
  // 1x128 activation groups (fp8-block's): each promoted group's sums are scaled by the weight
  // row's scale times the token's group scale, so the promotion groups must be the activation's.
  static constexpr int kActGroup = 128;
  static_assert(!kActGroupScales || (kEightBit && (kGroup == 0 || kGroup == kActGroup)),
                "activation group scales: 8-bit tiles whose weight groups are the activation's "
                "(or one per row)");
  using Mma = typename WgmmaStep<kCodes8, kTokens, kBf16>::Type;
  // What the wgmma add into: fp32, or the INT8 tensor cores' s32 (promoted groups only).
  using Sum = typename WgmmaSumOf<kS8>::Type;
  static constexpr int kAccumulators = Mma::kAccumulators;
  // k16 steps of a chunk that share a scale group, and the groups a chunk spans (1, 2 or 4).
  static constexpr int kStepsPerGroup = kGroup == 0 || kGroup >= 64 ? 4 : kGroup / 16;
  static constexpr int kChunkGroups = 4 / kStepsPerGroup;
  // The producer gives registers to the consumers when there are several of them. setmaxnreg
  // only moves registers inside the block's launch allocation: every thread starts with the
  // most that __launch_bounds__(threads, 1) leaves (65536 / threads, rounded down to 8; ptxas
  // gives a setmaxnreg kernel exactly that), and a consumer's increase waits until the
  // producer's decrease has freed enough. Asking for more than the allocation holds never
  // returns (measured: four consumers at 112 and the transform split at 112 + 2 × 200 hung on
  // an H100). So the consumers share what the producer leaves, a multiple of 8 and at most
  // 232 (2 consumers: 232, 3: 152, 4: 104). With transform warps in its warpgroup the producer
  // keeps 112 (their words, 16 fragment registers, the scales and stmatrix addresses) and two
  // consumers take 192 each.
  static constexpr bool kRebalance = kConsumers >= 2;
  static constexpr int kLaunchRegisters = 65536 / (128 * (1 + kConsumers)) / 8 * 8;
  static constexpr int kProducerRegisters = kTransform ? 112 : 40;
  static constexpr int kConsumerShare =
      (kLaunchRegisters * (1 + kConsumers) - kProducerRegisters) / kConsumers / 8 * 8;
  static constexpr int kConsumerRegisters = kConsumerShare < 232 ? kConsumerShare : 232;
  static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <=
                    kLaunchRegisters * (1 + kConsumers),
                "the rebalanced registers exceed the block's launch allocation (setmaxnreg.inc "
                "would wait forever)");

  struct Unit {
    int n_block, m_block, split, chunk0, chunks;
  };

  // The token blocks the units cover: grouped, those below the routed total the routing left
  // on the device (every one of them belongs to an expert; the launch's m_blocks covers the
  // capacity), so that every role (producer, transform warps, consumers) walks the same units
  // with no per-unit test.
  __device__ static int token_blocks(const WgmmaGemmParams& p) {
    if constexpr (kGrouped) return __ldg(p.routed_total) / kTokens;
    return p.m_blocks;
  }
  __device__ static Unit unit_of(const WgmmaGemmParams& p, int m_blocks, int u) {
    Unit out;
    out.n_block = u % p.n_blocks;
    out.m_block = (u / p.n_blocks) % m_blocks;
    out.split = u / (p.n_blocks * m_blocks);
    out.chunk0 = out.split * p.chunks_per_split;
    out.chunks = min(p.chunks_per_split, p.k_chunks - out.chunk0);
    return out;
  }
  // Grouped: the expert of token block m_block.
  __device__ static int expert_of(const WgmmaGemmParams& p, int m_block) {
    return __ldg(p.block_experts + m_block / p.blocks_per_route);
  }
  // Token block m_block's first row of A and C (its token l is row first + l), and the rows it
  // stores, begin .. end − 1: m_block · kTokens up to M, or the in-place table's (which may
  // start after `first`: the `begin` bound is checked in the grouped kernels only).
  struct TokenRows {
    int first, begin, end;
    __device__ bool stores(int m) const { return m < end && (!kGrouped || m >= begin); }
  };
  __device__ static TokenRows token_rows(const WgmmaGemmParams& p, int m_block) {
    if constexpr (kGrouped) {
      if (p.row_blocks != nullptr) {
        const int* entry = p.row_blocks + kMoeRowBlockFields * m_block;
        const int first = __ldg(entry + kRowBlockLoad0);
        const int begin = first + __ldg(entry + kRowBlockSkip);
        return {first, begin, begin + __ldg(entry + kRowBlockCount)};
      }
    }
    return {m_block * kTokens, m_block * kTokens, p.m};
  }

  // Scale rows a stage at chunk c (of `chunks` inside K) carries: one when the group spans the
  // stage, else the stage's groups that start inside K.
  __device__ static int stage_scale_rows(const WgmmaGemmParams& p, int c, int chunks) {
    if constexpr (kShape.scale_rows == 1) {
      return 1;
    } else {
      const int first = c * 64 / kGroup;
      return min(min(kShape.scale_rows, (chunks * 64 + kGroup - 1) / kGroup), p.groups - first);
    }
  }
  __device__ static int stage_first_group(int c) { return kGroup == 0 ? 0 : c * 64 / kGroup; }

  __device__ static unsigned full_barrier(unsigned base, int slot) {
    return base + kShape.barriers_offset + slot * 8;
  }
  __device__ static unsigned empty_barrier(unsigned base, int slot) {
    return base + kShape.barriers_offset + (kStages + slot) * 8;
  }
  __device__ static unsigned stage_address(unsigned base, int slot) {
    return base + 1024 + slot * kShape.stage_bytes;
  }
  // Where chunk i of a unit whose first stage is the it-th stage used lies in the ring: its
  // stage's slot, its place in the stage, and that stage's `full` phase parity.
  struct ChunkPlace {
    int slot, ch, full_parity;
  };
  __device__ static ChunkPlace place_of(int it, int i) {
    const int stage_index = it + i / kStageChunks;
    return {stage_index % kStages, i % kStageChunks, (stage_index / kStages) & 1};
  }
  // Waits for the chunk's stage to land (once per stage: at its first chunk).
  __device__ static void wait_stage(unsigned base, const ChunkPlace& at) {
    if (at.ch == 0) ptx::mbarrier_wait_parity(full_barrier(base, at.slot), at.full_parity);
  }

  // Transform: buffer b holds one chunk's dequantized tiles (tile t at t · 8 KB); `filled` counts
  // the transform warps' arrivals, `drained` the consumers' once their wgmma have read it.
  __device__ static unsigned filled_barrier(unsigned base, int b) {
    return base + kShape.barriers_offset + (2 * kStages + b) * 8;
  }
  __device__ static unsigned drained_barrier(unsigned base, int b) {
    return base + kShape.barriers_offset + (2 * kStages + kWgmmaTransformBuffers + b) * 8;
  }
  __device__ static unsigned dequantized_address(unsigned base, int b, int tile) {
    return base + kShape.dequantized_offset + b * kShape.dequantized_buffer_bytes +
           tile * kShape.dequantized_tile_bytes;
  }

  // ---- producer ------------------------------------------------------------------------------
  __device__ static void produce(const WgmmaGemmParams& p, unsigned base) {
    const int m_blocks = token_blocks(p);
    const int units = p.n_blocks * m_blocks * p.splits;
    int it = 0;  // stages used so far (the consumers count the same)
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit unit = unit_of(p, m_blocks, u);
      const int tile0 = unit.n_block * kConsumers;
      const int tiles = min(kConsumers, p.n_tiles - tile0);
      // Grouped: the experts' weights are back to back in the prepared order, so expert e's
      // tile t is tile e · n_tiles + t of the whole and its scale rows start at row e · groups
      // (int offsets: 64-bit pointers per expert cost the 40-register producer a spill).
      int w_tile0 = tile0, scale_row0 = 0;
      const int a_row0 = token_rows(p, unit.m_block).first;
      if constexpr (kGrouped) {
        const int expert = expert_of(p, unit.m_block);
        w_tile0 += expert * p.n_tiles;
        scale_row0 = expert * p.groups;
      }
      for (int i = 0; i < unit.chunks; i += kStageChunks, ++it) {
        const int slot = it % kStages;
        ptx::mbarrier_wait_parity(empty_barrier(base, slot), ((it / kStages) & 1) ^ 1);
        const int c = unit.chunk0 + i;
        const int chunks = min(kStageChunks, unit.chunks - i);
        const int rows = stage_scale_rows(p, c, chunks);
        // A box per chunk of 16-bit activations, per two chunks of 8-bit codes (a box's
        // bytes all arrive, zero-filled past K).
        const int boxes = kEightBit ? (chunks + 1) / 2 : chunks;
        const unsigned bytes = boxes * kShape.a_box_bytes + chunks * tiles * kShape.w_chunk_bytes +
                               rows * tiles * 256 * (kStoredZeros ? 2 : 1);
        const unsigned full = full_barrier(base, slot);
        ptx::mbarrier_arrive_expect_tx(full, bytes);
        const unsigned stage = stage_address(base, slot);
        for (int b = 0; b < boxes; ++b)
          ptx::tensor_copy_2d(stage + b * kShape.a_box_bytes, &p.activations,
                              (c + (kEightBit ? 2 : 1) * b) * 64, a_row0, full);
        for (int t = 0; t < tiles; ++t)
          ptx::bulk_copy(stage + kShape.a_bytes + t * kShape.w_tile_bytes,
                         p.w + (static_cast<long long>(w_tile0 + t) * p.k_chunks + c) * 128 * kBits,
                         chunks * kShape.w_chunk_bytes, full);
        const int group0 = stage_first_group(c);
        const unsigned s_stage = stage + kShape.a_bytes + kShape.w_bytes;
        for (int r = 0; r < rows; ++r) {
          const long long at =
              static_cast<long long>(scale_row0 + group0 + r) * p.n_padded + tile0 * 64;
          ptx::bulk_copy(s_stage + r * kShape.s_row_bytes, p.scales + at, tiles * 256, full);
          if constexpr (kStoredZeros)
            ptx::bulk_copy(s_stage + (kShape.scale_rows + r) * kShape.s_row_bytes, p.zeros + at,
                           tiles * 256, full);
        }
      }
    }
  }

  // ---- dequantization (into the consumers' registers, or by the transform warps) ------------
  __device__ static void load_words(unsigned at, unsigned (&words)[kBits]) {
    if constexpr (kBits % 4 == 0) {
#pragma unroll
      for (int w = 0; w < kBits; w += 4)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(words[w]), "=r"(words[w + 1]), "=r"(words[w + 2]), "=r"(words[w + 3])
                     : "r"(at + w * 4));
    } else if constexpr (kBits % 2 == 0) {
#pragma unroll
      for (int w = 0; w < kBits; w += 2)
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                     : "=r"(words[w]), "=r"(words[w + 1])
                     : "r"(at + w * 4));
    } else {
#pragma unroll
      for (int w = 0; w < kBits; ++w)
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(words[w]) : "r"(at + w * 4));
    }
  }
  __device__ static float2 load_float2(unsigned at) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(at));
    return v;
  }

  // The 16 wgmma A-fragment registers of thread `thread` for weight tile `tile` of the block
  // (0 .. kConsumers − 1) in chunk i of the unit, from the stage at `stage`: its words and the
  // scales of the chunk's groups (rows g and g + 8 of its warp are adjacent: scale_column),
  // dequantized scaled or unscaled (promoted scales). Returns the scales of the chunk's first
  // group.
  template <bool kScaled>
  __device__ static float2 dequantize_tile_chunk(const WgmmaGemmParams& p, const Unit& unit,
                                                 unsigned stage, int i, int tile, int thread,
                                                 unsigned (&frag)[4][4]) {
    const int ch = i % kStageChunks;
    // The thread's words: kBits consecutive 32-bit words (one 16-byte load for 4 bits).
    unsigned words[kBits];
    load_words(stage + kShape.a_bytes + tile * kShape.w_tile_bytes + ch * kShape.w_chunk_bytes +
                   thread * kBits * 4,
               words);
    const int c = unit.chunk0 + i - ch;  // the stage's first chunk
    const int rows = stage_scale_rows(p, c, min(kStageChunks, unit.chunks - (i - ch)));
    const int lane = thread % 32, warp = thread / 32;
    const unsigned s_at =
        stage + kShape.a_bytes + kShape.w_bytes + (tile * 64 + warp * 16 + (lane / 4) * 2) * 4;
    float2 first = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int gi = 0; gi < kChunkGroups; ++gi) {
      int row = 0;
      if constexpr (kShape.scale_rows > 1)
        row = min((ch * 64 + gi * kStepsPerGroup * 16) / kGroup, rows - 1);
      const float2 s = load_float2(s_at + row * kShape.s_row_bytes);
      float2 z = make_float2(0.0f, 0.0f);
      if constexpr (kStoredZeros)
        z = load_float2(s_at + (kShape.scale_rows + row) * kShape.s_row_bytes);
      if (gi == 0) first = s;
      const WgmmaGroupFactors factors =
          wgmma_group_factors<kFormat, kZeroMode, kDequant, kBf16>(s, z);
#pragma unroll
      for (int kb = gi * kStepsPerGroup; kb < (gi + 1) * kStepsPerGroup; ++kb)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          frag[kb][r] = wgmma_dequant_pair<kFormat, kZeroMode, kDequant, kBf16, kScaled>(
              words, kb * 4 + r, factors);
    }
    return first;
  }

  // 8-bit: the 8 A registers of thread `thread` for weight tile `tile` in chunk i (frag[0..1]:
  // the chunk's two k32 steps; dequant/wgmma_codes8.cuh draws their bytes), unscaled. Returns
  // the scales of the chunk's group (rows g and g + 8; groups cover whole chunks).
  __device__ static float2 codes8_tile_chunk(const WgmmaGemmParams& p, const Unit& unit,
                                           unsigned stage, int i, int tile, int thread,
                                           unsigned (&frag)[4][4]) {
    const int ch = i % kStageChunks;
    unsigned words[kBits];
    load_words(stage + kShape.a_bytes + tile * kShape.w_tile_bytes + ch * kShape.w_chunk_bytes +
                   thread * kBits * 4,
               words);
    // The 4-bit format's table, a compile-time constant (four immediates in registers).
    constexpr WgmmaCodes8Table table =
        wgmma_codes8_table(kFormat, kZeroMode == kZeroConstant, kCodes8);
    unsigned steps[2][4];
    wgmma_codes8_fragments<kBits>(words, table, steps);
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int r = 0; r < 4; ++r) frag[s][r] = steps[s][r];
    const int lane = thread % 32, warp = thread / 32;
    const unsigned s_at =
        stage + kShape.a_bytes + kShape.w_bytes + (tile * 64 + warp * 16 + (lane / 4) * 2) * 4;
    int row = 0;
    if constexpr (kShape.scale_rows > 1) {
      const int c = unit.chunk0 + i - ch;  // the stage's first chunk
      const int rows = stage_scale_rows(p, c, min(kStageChunks, unit.chunks - (i - ch)));
      row = min(ch * 64 / kGroup, rows - 1);
    }
    return load_float2(s_at + row * kShape.s_row_bytes);
  }

  // ---- transform warps ---------------------------------------------------------------------------
  // Warps 1-3 of the producer's warpgroup dequantize every weight tile of each chunk into buffer
  // tc % kWgmmaTransformBuffers (tc: the chunks so far), in the layout the consumers' wgmma read
  // as their A operand: 64 rows of 64 k (128 bytes) with the 128-byte swizzle, the 16-byte piece
  // j of row r at piece j ^ (r % 8) (ptx/wgmma.cuh's descriptor). A chunk's work is one task per
  // (tile, 16-row slice w), done as consumer warp w would do it in registers (its thread
  // w · 32 + lane's words and scales), the tasks dealt round-robin over the transform warps. A
  // task's fragment of k16 step kb (rows g, g + 8; k 2t.. and 2t + 8..) is four 8×8 matrices,
  // stored by one stmatrix.x4: lane L addresses row 16 w + 8 ((L / 8) & 1) + L % 8 of matrix
  // L / 8, piece 2 kb + L / 16.
  struct Transformer {
    int warp;  // 0 .. kWgmmaTransformWarps − 1
    int lane;
    unsigned base;

    __device__ void run(const WgmmaGemmParams& p) {
      const int m_blocks = token_blocks(p);
      const int units = p.n_blocks * m_blocks * p.splits;
      const int half = lane / 16;  // matrices 2, 3: k 8 .. 15 of the step
      int it = 0, tc = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const Unit unit = unit_of(p, m_blocks, u);
        const int tiles = min(kConsumers, p.n_tiles - unit.n_block * kConsumers);
        for (int i = 0; i < unit.chunks; ++i, ++tc) {
          const ChunkPlace at = place_of(it, i);
          const int ch = at.ch, slot = at.slot;
          wait_stage(base, at);
          const int b = tc % kWgmmaTransformBuffers;
          ptx::mbarrier_wait_parity(drained_barrier(base, b),
                                    ((tc / kWgmmaTransformBuffers) & 1) ^ 1);
          const unsigned stage = stage_address(base, slot);
          for (int task = warp; task < tiles * 4; task += kWgmmaTransformWarps) {
            const int t = task / 4, w = task % 4;
            unsigned frag[4][4];
            dequantize_tile_chunk<true>(p, unit, stage, i, t, w * 32 + lane, frag);
            const int row = w * 16 + 8 * ((lane / 8) & 1) + lane % 8;
            const unsigned row_at = dequantized_address(base, b, t) + row * 128;
#pragma unroll
            for (int kb = 0; kb < 4; ++kb)
              ptx::stmatrix_x4(row_at + (((2 * kb + half) ^ (row % 8)) << 4), frag[kb]);
          }
          // Our stores, then the consumers' wgmma (the async proxy) read them.
          ptx::fence_proxy_async_shared();
          ptx::mbarrier_arrive(filled_barrier(base, b));
          // The stage's weight and scales are read: release it (the consumers release it too,
          // once their wgmma have read its activations).
          if (ch == kStageChunks - 1 || i == unit.chunks - 1)
            ptx::mbarrier_arrive(empty_barrier(base, slot));
        }
        it += (unit.chunks + kStageChunks - 1) / kStageChunks;
      }
    }
  };

  // ---- consumers -----------------------------------------------------------------------------
  // Scales promoted into fp32 sums (gemm/sm90_wgmma_shape.cuh): the groups' chunks and the
  // kDequant codes of dequant/wgmma_dequant.cuh agree (kWgmmaFp32 = 0).
  static constexpr bool kPromote = wgmma_promotes_scales(kTile, kGroup, kDequant);
  // Chunks per promoted group (0: one group per row). The 8-bit tiles promote channel and
  // tensor scales every two chunks too: Hopper's FP8 tensor cores keep fewer bits than fp32 in
  // their sums (about 14, DeepSeek-V3), so no wgmma sum runs over more than 128 K (DeepGEMM's
  // interval) before it is added into the fp32 result; the scale is the same for every group.
  // (The INT8 sums are exact; 128 K of them, at most 2^21, convert to fp32 exactly.)
  static constexpr int kGroupChunks = kEightBit && kGroup == 0 ? 2 : kGroup / 64;
  static_assert(!kActGroupScales || kGroupChunks * 64 == kActGroup,
                "the promotion groups are the activation groups");
  // Group accumulator sets (wgmma_promote_sets): group j adds into set j % kPromoteSets.
  static constexpr int kPromoteSets = wgmma_promote_sets(kTile);
  // One set (128 tokens) drains each consumer's wgmma at every group boundary. Where the groups
  // are only the 8-bit tiles' 128-K precision interval (channel or tensor scales: the scale is
  // the same for every group, and no activation groups), the two consumers promote a chunk
  // apart (mainloop), so that the tensor cores always have one consumer's wgmma.
  static constexpr bool kStaggered =
      kEightBit && kPromoteSets == 1 && kGroup == 0 && !kActGroupScales && kConsumers >= 2;

  template <int kValue>
  struct Constant {
    static constexpr int value = kValue;
  };
  // f(Constant<kFirst>{}), ..., f(Constant<kLast − 1>{}): loop indices usable as template
  // arguments (register arrays indexed by them stay in registers).
  template <int kFirst, int kLast, class F>
  __device__ static void static_for(F&& f) {
    if constexpr (kFirst < kLast) {
      f(Constant<kFirst>{});
      static_for<kFirst + 1, kLast>(f);
    }
  }

  struct Consumer {
    int warpgroup;  // 0 .. kConsumers − 1
    int thread;     // 0 .. 127 in the warpgroup
    unsigned base;
    volatile unsigned* flags;  // one split-K flag per consumer warpgroup (shared memory)
    // The unit's result. Scales in the weights: the wgmma add into it directly. Promoted: group
    // j's wgmma add into group_acc[j % 2] (s32 on the INT8 tensor cores), which is scaled into
    // acc (by group_scale[j % 2]: rows g and g + 8) once the next group's first chunk has been
    // dequantized.
    float acc[kAccumulators];
    Sum group_acc[kPromote ? kPromoteSets : 1][kPromote ? kAccumulators : 1];
    float2 group_scale[kPromoteSets];
    // Activation group scales (kActGroupScales): group G of this consumer (groups counts them
    // across units) has its token block's kTokens scales in shared slot G % 2, written by thread
    // m of the warpgroup for token m at the group's start and read when the group is promoted,
    // after a warpgroup barrier (act_scales_barrier) that also keeps a slot from being rewritten
    // while a slower warp still reads it two groups earlier.
    int groups;
    unsigned frag[kTransform ? 1 : 2][4][4];
    int pending;  // the stage slot to release once the wgmma issued so far have completed
    // Transform: the chunks consumed so far (tc, as the transform warps count them), and
    // the dequantized buffer to release once the wgmma issued so far have completed.
    int chunks_done;
    int pending_buffer;

    __device__ void release(int slot) {
      ptx::fence_proxy_async_shared();  // our ld.shared of the stage before TMA refills it
      ptx::mbarrier_arrive(empty_barrier(base, slot));
    }

    __device__ unsigned act_scales_slot(int group) const {
      return base + kShape.act_scales_offset + warpgroup * kShape.act_scales_bytes +
             (group % 2) * kTokens * 4;
    }
    // Before a group's promotion: every thread's scale of it is stored (see `groups`).
    __device__ void act_scales_barrier() const {
      if constexpr (kActGroupScales) ptx::named_barrier_sync(1 + warpgroup, 128);
    }

    // acc += group_scale[kSet] · group_acc[kSet] (× the tokens' group scales with
    // kActGroupScales: of group `groups` − 1, the last one opened), once that set's wgmma have
    // completed.
    template <int kSet>
    __device__ void promote() {
      if constexpr (kPromote) {
        float2 token_scales = make_float2(1.0f, 1.0f);
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) {
          ptx::fence_operand(group_acc[kSet][i]);
          // acc[4j + e] is row g + 8 (e / 2), token 8j + 2t + e % 2 (ptx/wgmma.cuh)
          float scale = (i % 4) / 2 == 0 ? group_scale[kSet].x : group_scale[kSet].y;
          if constexpr (kActGroupScales) {
            // Tokens 8j + 2t and + 1 of the promoted group's slot, one 8-byte load per j.
            if (i % 4 == 0)
              token_scales = load_float2(act_scales_slot(groups - 1) +
                                         (8 * (i / 4) + 2 * (thread % 4)) * 4);
            scale *= i % 2 == 0 ? token_scales.x : token_scales.y;
          }
          acc[i] = fmaf(scale, static_cast<float>(group_acc[kSet][i]), acc[i]);
        }
      }
    }

    // Chunk i of the unit (stage i / kStageChunks from `it`), into fragment buffer kBuffer, its
    // wgmma adding into acc (kSet −1) or group_acc[kSet]; group_start: the chunk opens a scale
    // group (promoted scales).
    template <int kBuffer, int kSet>
    __device__ void chunk(const WgmmaGemmParams& p, const Unit& unit, int it, int i, bool active,
                          bool group_start) {
      const ChunkPlace at = place_of(it, i);
      const int ch = at.ch, slot = at.slot;
      wait_stage(base, at);
      if (active) {
        const unsigned stage = stage_address(base, slot);
        float2 first_scale;
        if constexpr (kEightBit) {
          first_scale = codes8_tile_chunk(p, unit, stage, i, warpgroup, thread, frag[kBuffer]);
        } else {
          first_scale = dequantize_tile_chunk<!kPromote>(p, unit, stage, i, warpgroup, thread,
                                                         frag[kBuffer]);
        }
        // A new group: the previous one's wgmma (the last chunk's, still in flight while this
        // chunk dequantized) complete, then its sums are scaled into the result. Waiting for
        // all of them (not all but this chunk's, after it is issued) keeps every accumulator
        // read outside an open wgmma stage, which ptxas would otherwise serialize (C7514).
        // With one set (kPromoteSets 1) the previous group is that same set: it is scaled in
        // here, before this chunk's first wgmma overwrites it, and before its scale is replaced.
        if constexpr (kPromote && kSet >= 0) {
          if (group_start && i > 0) {
            ptx::warpgroup_wait_group<0>();
            act_scales_barrier();
            promote<(kSet + kPromoteSets - 1) % kPromoteSets>();
          }
        }
        if constexpr (kPromote) {
          if (group_start) group_scale[kSet < 0 ? 0 : kSet] = first_scale;
        }
        if constexpr (kActGroupScales) {
          // The new group's activation scales into its slot, token `thread` by thread `thread`
          // (tokens past M take 0: their sums are 0 too, never emitted); read when the group is
          // promoted, after its last chunk.
          if (group_start) {
            const int group = (unit.chunk0 + i) * 64 / kActGroup;
            const TokenRows rows = token_rows(p, unit.m_block);
            if (thread < kTokens) {
              const float scale =
                  rows.stores(rows.first + thread)
                      ? __ldg(p.act_scales + (rows.first + thread) * p.act_scale_stride + group)
                      : 0.0f;
              asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(act_scales_slot(groups) + thread * 4),
                           "f"(scale)
                           : "memory");
            }
            ++groups;
          }
        }
        if constexpr (kEightBit) {
          // Both steps' A registers are computed here, before the fence: otherwise the compiler
          // sinks the second step's PRMTs past the first wgmma into the same registers, and
          // ptxas then waits for that wgmma before each next one (C7520, seen in the SASS).
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(frag[kBuffer][s][r])::"memory");
        }
        ptx::warpgroup_fence();
        auto& target = accumulators<kSet>();
        if constexpr (kEightBit) {
          // Chunk ch is the (ch % 2)-th half of box ch / 2 (128 codes a token row); its k32
          // step s starts (ch % 2) · 64 + 32 s bytes into the swizzled rows.
          const unsigned a_box = stage + (ch / 2) * kShape.a_box_bytes;
          const unsigned long long descriptor = ptx::make_smem_descriptor(a_box);
#pragma unroll
          for (int s = 0; s < 2; ++s)
            Mma::mma(target, frag[kBuffer][s],
                     descriptor + ((((ch % 2) * 64) + s * 32) >> 4),
                     !(group_start && s == 0));
        } else {
          const unsigned a_box = stage + ch * kShape.a_box_bytes;
          const unsigned long long descriptor = ptx::make_smem_descriptor(a_box);
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            const bool accumulate = kPromote ? !(group_start && kb == 0) : (i | kb) != 0;
            Mma::mma(target, frag[kBuffer][kb], descriptor + ((kb * 32) >> 4), accumulate);
          }
        }
        ptx::warpgroup_commit_group();
        ptx::warpgroup_wait_group<1>();
      }
      // Every wgmma before chunk i has completed: when chunk i opens a stage, the previous
      // one is free.
      if (ch == 0) {
        if (pending >= 0) release(pending);
        pending = slot;
      }
    }

    // Transform: chunk i of the unit from the dequantized buffer of chunk count tc: both wgmma
    // operands from shared memory. The previous chunk's buffer (and stage, when this chunk
    // opens one) is released once its wgmma have completed.
    __device__ void chunk_shared(const Unit& unit, int it, int i, bool active) {
      const ChunkPlace at = place_of(it, i);
      const int ch = at.ch, slot = at.slot;
      const int tc = chunks_done + i;
      const int b = tc % kWgmmaTransformBuffers;
      wait_stage(base, at);
      ptx::mbarrier_wait_parity(filled_barrier(base, b), (tc / kWgmmaTransformBuffers) & 1);
      if (active) {
        ptx::warpgroup_fence();
        const unsigned long long weight =
            ptx::make_smem_descriptor(dequantized_address(base, b, warpgroup));
        const unsigned long long activations =
            ptx::make_smem_descriptor(stage_address(base, slot) + ch * kShape.a_box_bytes);
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
          Mma::mma_shared(acc, weight + ((kb * 32) >> 4), activations + ((kb * 32) >> 4),
                          (i | kb) != 0);
        ptx::warpgroup_commit_group();
        ptx::warpgroup_wait_group<1>();
      }
      if (pending_buffer >= 0) ptx::mbarrier_arrive(drained_barrier(base, pending_buffer));
      pending_buffer = b;
      if (ch == 0) {
        if (pending >= 0) release(pending);
        pending = slot;
      }
    }

    template <int kSet>
    __device__ auto accumulators() -> auto& {
      if constexpr (kPromote && kSet >= 0) {
        return group_acc[kSet];
      } else {
        return acc;
      }
    }

    // The unit's chunks, two fragment buffers alternating. Promoted scales: channel scales
    // (kGroupChunks 0) make the unit one group in set 0; groups of kGroupChunks chunks alternate
    // between the sets, the unit starting at a group's first chunk (wgmma_split_step).
    __device__ void mainloop(const WgmmaGemmParams& p, const Unit& unit, int it, bool active) {
      if constexpr (kTransform) {
        for (int i = 0; i < unit.chunks; ++i) chunk_shared(unit, it, i, active);
      } else if constexpr (!kPromote) {
        for (int i = 0; i < unit.chunks; i += 2) {
          chunk<0, -1>(p, unit, it, i, active, false);
          if (i + 1 < unit.chunks) chunk<1, -1>(p, unit, it, i + 1, active, false);
        }
      } else if constexpr (kGroupChunks == 0) {
        for (int i = 0; i < unit.chunks; i += 2) {
          chunk<0, 0>(p, unit, it, i, active, i == 0);
          if (i + 1 < unit.chunks) chunk<1, 0>(p, unit, it, i + 1, active, false);
        }
      } else {
        // Staggered (kStaggered): the odd consumers' groups start one chunk later (their first
        // group is one chunk), so that one consumer's drain-and-promote overlaps the other's
        // wgmma instead of both idling the tensor cores at the same chunk.
        const int offset = kStaggered ? warpgroup % 2 : 0;
        for (int i = 0; i < unit.chunks; i += 2 * kGroupChunks)
          static_for<0, 2 * kGroupChunks>([&](auto k) {
            constexpr int kK = decltype(k)::value;
            if (i + kK < unit.chunks)
              chunk<kK % 2, (kK / kGroupChunks) % kPromoteSets>(
                  p, unit, it, i + kK, active,
                  kStaggered ? (i + kK == 0 || (kK + offset) % kGroupChunks == 0)
                             : kK % kGroupChunks == 0);
          });
      }
    }

    __device__ void run(const WgmmaGemmParams& p) {
      const int m_blocks = token_blocks(p);
      const int units = p.n_blocks * m_blocks * p.splits;
      int it = 0;
      pending = -1;
      chunks_done = 0;
      pending_buffer = -1;
      groups = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const Unit unit = unit_of(p, m_blocks, u);
        const int tile = unit.n_block * kConsumers + warpgroup;
        const bool active = tile < p.n_tiles;
        if constexpr (kPromote) {
#pragma unroll
          for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
        }
        mainloop(p, unit, it, active);
        ptx::warpgroup_wait_group<0>();
        if constexpr (kPromote) {
          // The unit's last group (set 0 for channel scales).
          const int last_set =
              kGroupChunks == 0 ? 0 : ((unit.chunks - 1) / kGroupChunks) % kPromoteSets;
          if (active) {
            act_scales_barrier();
            if (last_set == 0) promote<0>();
            else promote<kPromoteSets - 1>();
          }
        }
        release(pending);
        pending = -1;
        if constexpr (kTransform) {
          ptx::mbarrier_arrive(drained_barrier(base, pending_buffer));
          pending_buffer = -1;
          chunks_done += unit.chunks;
        }
        it += (unit.chunks + kStageChunks - 1) / kStageChunks;
        if (active) epilogue(p, unit, tile);
      }
    }

    // Float offset of the thread's sums q (acc[4q .. 4q + 3]) in a tile's split-K slice:
    // [q][thread][4], so that one reduction instruction of the warpgroup covers 2 KB.
    __device__ int sums_at(int q) const { return (q * 128 + thread) * 4; }

    __device__ void epilogue(const WgmmaGemmParams& p, const Unit& unit, int tile) {
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) ptx::fence_operand(acc[i]);
      if constexpr (kSplitK) {
        // Each split adds its sums into the (token block, tile)'s slice of the workspace in
        // the accumulators' own order, 16 bytes a reduction and coalesced across the
        // warpgroup (sums_at); rows past M and columns past N are summed too, never emitted.
        float* sums = p.workspace +
                      (static_cast<long long>(unit.m_block) * p.n_tiles + tile) * 128 * kAccumulators;
#pragma unroll
        for (int q = 0; q < kAccumulators / 4; ++q)
          ptx::reduce_add_v4(sums + sums_at(q), acc[4 * q], acc[4 * q + 1], acc[4 * q + 2],
                             acc[4 * q + 3]);
        // The last split of (token block, tile) to arrive emits the sums (per warpgroup: the
        // other warpgroups own other tiles).
        volatile unsigned* flag = flags + warpgroup;
        __threadfence();
        ptx::named_barrier_sync(1 + warpgroup, 128);
        unsigned* counter = p.counters + static_cast<long long>(unit.m_block) * p.n_tiles + tile;
        if (thread == 0) *flag = atomicAdd(counter, 1u) == static_cast<unsigned>(p.splits - 1);
        ptx::named_barrier_sync(1 + warpgroup, 128);
        const bool last = *flag != 0u;
        ptx::named_barrier_sync(1 + warpgroup, 128);  // the flag is read before it is rewritten
        if (!last) return;
        __threadfence();
        if (thread == 0) *counter = 0u;
#pragma unroll
        for (int q = 0; q < kAccumulators / 4; ++q) {
          // L2, not a stale L1 line; then zeroed for the next call.
          const float4 sum = __ldcg(reinterpret_cast<const float4*>(sums + sums_at(q)));
          __stcg(reinterpret_cast<float4*>(sums + sums_at(q)), make_float4(0.f, 0.f, 0.f, 0.f));
          acc[4 * q] = sum.x, acc[4 * q + 1] = sum.y, acc[4 * q + 2] = sum.z;
          acc[4 * q + 3] = sum.w;
        }
      }
      emit(p, unit.m_block, tile);
    }

    // C[m][n] = acc · global_scale · row_factor[m] + bias[n] for the tile's 64 rows × kTokens
    // tokens (acc[4j + e]: weight row n0 + 8 (e / 2), token m0 + 8j + e % 2; ptx/wgmma.cuh).
    // 16-bit outputs pass through the warpgroup's staging slice, epilogue_tokens at a time, so
    // that C is written in 16-byte pieces along its rows rather than 2-byte ones down columns:
    //
    //   fragment  warp w holds n 16w .. 16w + 15; per 8 tokens j, two 8×8 matrices (n half h):
    //             lane (g, t) has (n 16w + 8h + g, tokens 8j + 2t, + 1) = acc[4j + 2h], + 1
    //   staging   stmatrix.trans writes each matrix as 8 token rows × 8 n: token row r of the
    //             slice, chunk c = 2w + h (8 n = 16 bytes), at r · 128 + 16 · (c ^ (r % 8)) (the
    //             XOR spreads a matrix's 8 rows over 8 bank groups)
    //   copy      8 threads a token row: chunk c to C[m][64 · tile + 8c ..], 16-byte stores where
    //             the row piece lies inside N and is 16-byte aligned, element stores elsewhere
    //
    // With a fused GLU (kGlu: a gate_up weight interleaved by kernels::glu_source_row), rows n0
    // and n0 + 8 are gate and up of C's column 32 · tile + 8w + g (C has I = N / 2 columns; the
    // bias keeps the gate-then-up order): each is rounded to C's type, as the separate GLU pass
    // reads them (moe/glue.cuh), and h takes the gate's place, acc[4j], + 1. One matrix per 8
    // tokens then, chunk c = w of the staging rows, and 4 threads a token row copy it.
    __device__ void emit(const WgmmaGemmParams& p, int m_block, int tile) {
      const int lane = thread % 32, warp = thread / 32;
      const int n0 = tile * 64 + warp * 16 + lane / 4;
      // The block's token l is C's row rows.first + l, stored where rows.stores says.
      const TokenRows rows = token_rows(p, m_block);
      const int m0 = rows.first + 2 * (lane % 4);
      constexpr int kTileColumns = kGlu ? 32 : 64, kChunks = kTileColumns / 8;
      const int columns = kGlu ? p.n / 2 : p.n;  // C's
      float bias[2] = {0.0f, 0.0f};
      if (p.bias) {
        // Grouped: the block's expert's bias (looked up again here rather than kept in a
        // register through the mainloop, where the consumers have none to spare).
        const float* expert_bias = p.bias;
        if constexpr (kGrouped)
          expert_bias += static_cast<long long>(expert_of(p, m_block)) * p.n;
        if constexpr (kGlu != 0) {
          const int j = tile * 32 + warp * 8 + lane / 4;
          if (j < columns) bias[0] = expert_bias[j], bias[1] = expert_bias[columns + j];
        } else {
          if (n0 < p.n) bias[0] = expert_bias[n0];
          if (n0 + 8 < p.n) bias[1] = expert_bias[n0 + 8];
        }
      }
#pragma unroll
      for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int m = m0 + 8 * j + e % 2;
          float v = acc[4 * j + e] * p.global_scale;
          if (p.row_factors && rows.stores(m)) v *= p.row_factors[m];
          acc[4 * j + e] = v + bias[e / 2];
        }
      if constexpr (kGlu != 0) {
#pragma unroll
        for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            acc[4 * j + e] =
                apply_glu(kGlu - 1, rounded_to_half<kOutput>(acc[4 * j + e]),
                          rounded_to_half<kOutput>(acc[4 * j + 2 + e]), p.glu_alpha, p.glu_limit);
      }
      if constexpr (kOutput == kOutFp32) {
#pragma unroll
        for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int n = n0 + 8 * (e / 2), m = m0 + 8 * j + e % 2;
            if (rows.stores(m) && n < p.n)
              static_cast<float*>(p.c)[static_cast<long long>(m) * p.ldc + n] = acc[4 * j + e];
          }
      } else {
        constexpr int kSlice = kShape.epilogue_tokens;
        const unsigned staging =
            base + kShape.epilogue_offset + warpgroup * kShape.epilogue_bytes;
        const auto pack = [](float low, float high) {
          return static_cast<unsigned>(to_output_half<kOutput>(low)) |
                 static_cast<unsigned>(to_output_half<kOutput>(high)) << 16;
        };
#pragma unroll
        for (int s = 0; s < kTokens / kSlice; ++s) {
          if (rows.first + s * kSlice >= rows.end) break;  // the same for the warpgroup
          // Lane L addresses row L % 8 of matrix L / 8: (8 tokens j + (L / 8) / 2, n half
          // (L / 8) % 2) for x4, (j, L / 8) for x2; with a GLU, 8 tokens j + L / 8 for x2.
          const int r = lane % 8, i = lane / 8;
          if constexpr (kGlu != 0 && kSlice == 8) {
            ptx::stmatrix_x1_trans(staging + r * 128 + ((warp ^ r) << 4), pack(acc[0], acc[1]));
          } else if constexpr (kGlu != 0) {
#pragma unroll
            for (int jj = 0; jj < kSlice / 8; jj += 2) {
              const int j = s * kSlice / 8 + jj;
              const unsigned frag[2] = {pack(acc[4 * j], acc[4 * j + 1]),
                                        pack(acc[4 * j + 4], acc[4 * j + 5])};
              const int row = 8 * (jj + i % 2) + r;
              ptx::stmatrix_x2_trans(staging + row * 128 + ((warp ^ r) << 4), frag);
            }
          } else if constexpr (kSlice == 8) {
            const unsigned frag[2] = {pack(acc[0], acc[1]), pack(acc[2], acc[3])};
            ptx::stmatrix_x2_trans(staging + r * 128 + (((2 * warp + i % 2) ^ r) << 4), frag);
          } else {
#pragma unroll
            for (int jj = 0; jj < kSlice / 8; jj += 2) {
              const int j = s * kSlice / 8 + jj;
              const unsigned frag[4] = {pack(acc[4 * j], acc[4 * j + 1]),
                                        pack(acc[4 * j + 2], acc[4 * j + 3]),
                                        pack(acc[4 * j + 4], acc[4 * j + 5]),
                                        pack(acc[4 * j + 6], acc[4 * j + 7])};
              const int row = 8 * (jj + i / 2) + r;
              ptx::stmatrix_x4_trans(staging + row * 128 + (((2 * warp + i % 2) ^ r) << 4), frag);
            }
          }
          ptx::named_barrier_sync(1 + warpgroup, 128);
#pragma unroll
          for (int at = thread; at < kSlice * kChunks; at += 128) {
            const int row = at / kChunks, c = at % kChunks;
            const int m = rows.first + s * kSlice + row, n = tile * kTileColumns + 8 * c;
            if (rows.stores(m) && n < columns) {
              const uint4 piece = ptx::load_shared_16(staging + row * 128 + ((c ^ (row % 8)) << 4));
              unsigned short* out =
                  static_cast<unsigned short*>(p.c) + static_cast<long long>(m) * p.ldc + n;
              if (n + 8 <= columns && reinterpret_cast<unsigned long long>(out) % 16 == 0) {
                *reinterpret_cast<uint4*>(out) = piece;
              } else {
                // Unrolled: constant indices keep `words` in registers (no stack frame).
                const unsigned words[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
                for (int e = 0; e < 8; ++e)
                  if (n + e < columns)
                    out[e] = static_cast<unsigned short>(words[e / 2] >> (16 * (e % 2)));
              }
            }
          }
          ptx::named_barrier_sync(1 + warpgroup, 128);  // read before the next slice is stored
        }
      }
    }
  };

  __device__ static void run(const WgmmaGemmParams& p, char* shared) {
    const unsigned raw = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    const unsigned base = (raw + 1023u) & ~1023u;  // A boxes need 1024-byte alignment
    if (threadIdx.x == 0) {
      // A stage is free once the consumers (and the transform warps) are done with it.
      constexpr int kTransformThreads = kTransform ? 32 * kWgmmaTransformWarps : 0;
      for (int s = 0; s < kStages; ++s) {
        ptx::mbarrier_init(full_barrier(base, s), 1);
        ptx::mbarrier_init(empty_barrier(base, s), kConsumers * 128 + kTransformThreads);
      }
      if constexpr (kTransform)
        for (int b = 0; b < kWgmmaTransformBuffers; ++b) {
          ptx::mbarrier_init(filled_barrier(base, b), kTransformThreads);
          ptx::mbarrier_init(drained_barrier(base, b), kConsumers * 128);
        }
      ptx::fence_barrier_init();
    }
    __syncthreads();
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
      if constexpr (kRebalance) ptx::warpgroup_registers_decrease<kProducerRegisters>();
      const int warp = threadIdx.x / 32;
      if (threadIdx.x == 0) produce(p, base);
      if constexpr (kTransform) {
        if (warp >= 1) {
          Transformer transformer;
          transformer.warp = warp - 1;
          transformer.lane = threadIdx.x % 32;
          transformer.base = base;
          transformer.run(p);
        }
      }
      return;
    }
    if constexpr (kRebalance) ptx::warpgroup_registers_increase<kConsumerRegisters>();
    Consumer consumer;
    consumer.warpgroup = warpgroup - 1;
    consumer.thread = threadIdx.x % 128;
    consumer.base = base;
    consumer.flags = reinterpret_cast<volatile unsigned*>(shared + (base - raw) +
                                                          kShape.flags_offset);
    consumer.run(p);
  }
};

// Template arguments in the order of the JIT family "wgmma_gemm_sm90" (src/jit/kernel_spec.cpp):
// kActivation 0 bf16 / 1 fp16 / 2 e4m3 codes (the FP8 tiles, kDequant kWgmmaE4m3) / 3 e4m3 codes
// with 1x128 group scales (params.act_scales, promoted with the weight's) / 4 int8 codes (the
// INT8 tiles, kDequant kWgmmaS8); kDequant = WgmmaDequant; kGlu 0 none, else 1 + MoeGluKind:
// the grouped gate_up GEMM with its GLU fused (an interleaved weight); kThreads and
// kDynamicSmemBytes come from the spec, which the dispatcher sizes with the same wgmma_shape,
// and must agree.
template <int kConsumers, int kTokens, int kStageChunks, int kStages, bool kTransform,
          unsigned long long kFormat, int kZeroMode, int kGroup, int kActivation, int kOutput,
          bool kSplitK, int kDequant, bool kGrouped, int kGlu, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_gemm_sm90(const __grid_constant__ WgmmaGemmParams params) {
  using Gemm = WgmmaGemm<kConsumers, kTokens, kStageChunks, kStages, kTransform, kFormat, kZeroMode,
                         kGroup, kActivation == 0, kOutput, kSplitK, kDequant, kGrouped,
                         kActivation == 4   ? kCodes8S8
                         : kActivation >= 2 ? kCodes8E4m3
                                            : -1,
                         kActivation == 3, kGlu>;
  static_assert(kThreads == Gemm::kShape.threads, "spec threads differ from the kernel's shape");
  static_assert(kDynamicSmemBytes == Gemm::kShape.shared_bytes,
                "spec shared memory differs from the kernel's shape");
  extern __shared__ __align__(1024) char wgmma_shared[];
  Gemm::run(params, wgmma_shared);
}

}  // namespace qgemm::kernels
