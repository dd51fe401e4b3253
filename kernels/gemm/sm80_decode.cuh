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
//     [zero chunk 16 B]  where ldmatrix lanes of rows ≥ M point
//     stage × kStages:
//       W  kStageBlocks × 32 lanes × bits words   the codes, verbatim (one contiguous run)
//       A  kRows rows × (kStageBlocks · 32 B + 16 B pad)   only rows < M are copied; the pad
//          puts the 8 rows of an ldmatrix on 8 different bank quads
//       S  kScaleRows rows of 64 scales (the stage's groups, lane-permuted), then as many zero
//          rows when the weight stores zeros
//
// Scales go on the accumulators: inside a group the mma sums exact unscaled codes (u − zero, or
// the float value; dequant/mma_dequant.cuh) into `part`, and at the group's end
// acc += part · scale in fp32. A lane's accumulator columns are j · 8 + 2t + h (t = lane % 4,
// h = 0, 1), whose scales are the 16 consecutive floats at 16t of the permuted row. Float zero
// points are applied there too: part − zero · Σ_k A, the row sums coming from one more mma with
// B = 1.
#pragma once

#include "dequant/mma_dequant.cuh"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "ptx/async_copy.cuh"
#include "ptx/convert.cuh"
#include "ptx/mma_sync.cuh"

namespace qgemm::kernels {

// Launch shape of one instantiation; the host mirrors it (src/dispatch/dense_config.cpp).
template <int kRows, int kWarps, int kStageBlocks, int kStages, int kBits, int kGroup,
          bool kStoredZeros>
struct DecodeGemmShape {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStageK = kStageBlocks * 16;
  static constexpr int kWBytes = kStageBlocks * 32 * kBits * 4;
  static constexpr int kARowBytes = kStageK * 2 + 16;
  static constexpr int kABytes = kRows * kARowBytes;
  static constexpr int kScaleRows = (kGroup == 0 || kGroup >= kStageK) ? 1 : kStageK / kGroup;
  static constexpr int kSBytes = kScaleRows * 64 * 4 * (kStoredZeros ? 2 : 1);
  static constexpr int kStageBytes = kWBytes + kABytes + kSBytes;
  static constexpr int kWarpBytes = 16 + kStages * kStageBytes;
  static constexpr int kPipelineBytes = kWarps * kWarpBytes;
  // The cross-warp sum reuses the pipeline's memory: [warp − 1][value][lane] floats.
  static constexpr int kReduceBytes = (kWarps - 1) * 32 * 32 * 4;
  static constexpr int kSharedBytes = kPipelineBytes > kReduceBytes ? kPipelineBytes : kReduceBytes;

  static_assert(kRows == 8 || kRows == 16 || (kRows >= 1 && kRows < 8),
                "decode serves at most 16 rows");
  static_assert(kStages >= 2, "a ring needs two stages");
  static_assert(kGroup == 0 ||
                    (kGroup % 16 == 0 && (kGroup % kStageK == 0 || kStageK % kGroup == 0)),
                "groups must be multiples of 16 that tile the stage");
};

template <int kRows, int kWarps, int kStageBlocks, int kStages, unsigned long long kFormat,
          int kZeroMode, int kGroup, bool kBf16, int kOutput, bool kSplitK, int kDequant>
struct DecodeGemm {
  static constexpr FormatCode kF = FormatCode::unpack(kFormat);
  static constexpr int kBits = kF.bits;
  static constexpr bool kStoredZeros = kZeroMode == kZeroInteger || kZeroMode == kZeroFloat;
  static constexpr bool kRowSums = kZeroMode == kZeroFloat;
  using Shape =
      DecodeGemmShape<kRows, kWarps, kStageBlocks, kStages, kBits, kGroup, kStoredZeros>;
  // k16 blocks per group; one group for all of K (per channel) never ends inside the range.
  static constexpr int kGroupBlocks = kGroup == 0 ? 1 << 30 : kGroup / 16;

  __device__ static void load_stage(const DenseGemmParams& p, char* stage, int kb0, int kb_end,
                                    int slice, int lane) {
    // W: the stage's blocks are one contiguous run of the slice.
    const char* w = reinterpret_cast<const char*>(p.b) +
                    (static_cast<long long>(slice) * p.k_blocks + kb0) * 32 * kBits * 4;
    const int blocks = kb_end - kb0 < kStageBlocks ? kb_end - kb0 : kStageBlocks;
    const int w_chunks = blocks * 8 * kBits;
#pragma unroll
    for (int i = lane; i < Shape::kWBytes / 16; i += 32)
      if (i < w_chunks) ptx::cp_async_16(stage + i * 16, w + i * 16, 16);
    // A: rows < M in chunks of 8 values; bytes past K are zero-filled.
    char* a_stage = stage + Shape::kWBytes;
    const char* a = static_cast<const char*>(p.a);
    constexpr int kChunksPerRow = Shape::kStageK / 8;
    const int k0 = kb0 * 16;
    for (int i = lane; i < p.m * kChunksPerRow; i += 32) {
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int k = k0 + chunk * 8;
      int bytes = (p.k - k) * 2;
      bytes = bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes);
      const char* src = bytes ? a + (static_cast<long long>(row) * p.lda + k) * 2 : a;
      ptx::cp_async_16(a_stage + row * Shape::kARowBytes + chunk * 16, src, bytes);
    }
    // Scales (then zeros) of the stage's groups; rows past the last group read as zero.
    char* s_stage = a_stage + Shape::kABytes;
    const int g0 = kGroup == 0 ? 0 : k0 / kGroup;
    constexpr int kArrays = kStoredZeros ? 2 : 1;
    constexpr int kChunks = kArrays * Shape::kScaleRows * 16;
#pragma unroll
    for (int i = lane; i < kChunks; i += 32) {
      const int array = i / (Shape::kScaleRows * 16);
      const int row = i / 16 % Shape::kScaleRows, chunk = i % 16;
      const int g = g0 + row;
      const float* base = array == 0 ? p.scales : p.zeros;
      const bool valid = g < p.groups;
      const float* src = base + static_cast<long long>(g) * p.n_padded + slice * 64 + chunk * 4;
      ptx::cp_async_16(s_stage + i * 16, valid ? src : base, valid ? 16 : 0);
    }
  }

  // The B-side offsets of a group for this lane's columns j · 8 + lane / 4 (see
  // dequantize_lane_unscaled).
  __device__ static void group_offsets(const float* zero_row, int lane, unsigned (&off)[8]) {
    constexpr float kBase = kDequant == kDequantIntF32 ? 8388608.0f : (kBf16 ? 128.0f : 1024.0f);
    float zeros[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      zeros[j] = kZeroMode == kZeroConstant ? static_cast<float>(1 << (kBits - 1)) : 0.0f;
    if constexpr (kZeroMode == kZeroInteger) {
      const float4* row = reinterpret_cast<const float4*>(zero_row + (lane / 4) * 8);
      const float4 z0 = row[0], z1 = row[1];
      zeros[0] = z0.x, zeros[1] = z0.y, zeros[2] = z0.z, zeros[3] = z0.w;
      zeros[4] = z1.x, zeros[5] = z1.y, zeros[6] = z1.z, zeros[7] = z1.w;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kDequant == kDequantIntF32) {
        off[j] = __float_as_uint(kBase + zeros[j]);
      } else {
        off[j] = ptx::pack_pair<kBf16>(-(kBase + zeros[j]), -(kBase + zeros[j]));
      }
    }
  }

  // acc += (part − zero · rowsum) · scale for the group whose scale row is `scale_row`.
  __device__ static void flush_group(const float* scale_row, const float* zero_row, int lane,
                                     float (&acc)[8][4], float (&part)[8][4], float (&rowsum)[4]) {
    const float4* s4 = reinterpret_cast<const float4*>(scale_row + (lane % 4) * 16);
    float s[16], z[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = s4[q];
      s[q * 4] = v.x, s[q * 4 + 1] = v.y, s[q * 4 + 2] = v.z, s[q * 4 + 3] = v.w;
    }
    if constexpr (kRowSums) {
      const float4* z4 = reinterpret_cast<const float4*>(zero_row + (lane % 4) * 16);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = z4[q];
        z[q * 4] = v.x, z[q * 4 + 1] = v.y, z[q * 4 + 2] = v.z, z[q * 4 + 3] = v.w;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (kRows <= 8 && e >= 2) continue;  // rows g + 8 are padding
        const int h = e % 2;
        float v = part[j][e];
        if constexpr (kRowSums) v -= z[h * 8 + j] * rowsum[e < 2 ? 0 : 2];
        acc[j][e] += v * s[h * 8 + j];
        part[j][e] = 0.0f;
      }
#pragma unroll
    for (int e = 0; e < 4; ++e) rowsum[e] = 0.0f;
  }

  __device__ static void compute_stage(const DenseGemmParams& p, const char* stage,
                                       unsigned zero_chunk, int kb0, int kb_begin, int kb_end,
                                       int lane, unsigned (&off)[8], float (&acc)[8][4],
                                       float (&part)[8][4], float (&rowsum)[4]) {
    const unsigned* w_stage = reinterpret_cast<const unsigned*>(stage);
    const unsigned a_stage = ptx::shared_address(stage + Shape::kWBytes);
    const float* s_stage = reinterpret_cast<const float*>(stage + Shape::kWBytes + Shape::kABytes);
    const float* z_stage = s_stage + Shape::kScaleRows * 64;
    constexpr unsigned kOnes = kBf16 ? 0x3f803f80u : 0x3c003c00u;
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      const int kb = kb0 + i;
      if (kb >= kb_end) break;  // uniform: the last stage of the warp's range may be partial
      const int scale_row = Shape::kScaleRows == 1 ? 0 : i / kGroupBlocks;
      if constexpr (kZeroMode == kZeroInteger) {
        if (kb == kb_begin || kb % kGroupBlocks == 0)
          group_offsets(z_stage + scale_row * 64, lane, off);
      }
      unsigned words[kBits];
      const unsigned* lane_words = w_stage + (i * 32 + lane) * kBits;
#pragma unroll
      for (int w = 0; w < kBits; ++w) words[w] = lane_words[w];
      unsigned b[8][2];
      dequantize_lane_unscaled<kFormat, kDequant, kBf16>(words, off, b);

      // A: ldmatrix.x4 rows r < M from the stage, rows ≥ M from the zero chunk (also for
      // kRows ≤ 8: the four registers land as the quad the mma reads, with no moves).
      unsigned a[4];
      const int row = lane % 8 + 8 * ((lane / 8) % 2), chunk = i * 2 + lane / 16;
      ptx::ldmatrix_x4(a, row < p.m ? a_stage + row * Shape::kARowBytes + chunk * 16 : zero_chunk);
#pragma unroll
      for (int j = 0; j < 8; ++j) ptx::mma_m16n8k16<kBf16>(part[j], a, b[j][0], b[j][1]);
      if constexpr (kRowSums) ptx::mma_m16n8k16<kBf16>(rowsum, a, kOnes, kOnes);

      const bool group_end = (kb + 1) % kGroupBlocks == 0 || kb + 1 == kb_end;
      if (group_end)
        flush_group(s_stage + scale_row * 64, z_stage + scale_row * 64, lane, acc, part, rowsum);
    }
  }

  __device__ static void run(const DenseGemmParams& p, char* shared) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slice = blockIdx.x;
    const int kb_begin = (blockIdx.z * kWarps + warp) * p.blocks_per_warp;
    const int kb_limit = kb_begin + p.blocks_per_warp;
    const int kb_end = kb_limit < p.k_blocks ? kb_limit : p.k_blocks;
    const int stages = kb_end > kb_begin ? (kb_end - kb_begin + kStageBlocks - 1) / kStageBlocks : 0;

    char* mine = shared + warp * Shape::kWarpBytes;
    if (lane < 4) reinterpret_cast<unsigned*>(mine)[lane] = 0u;  // the zero chunk
    const unsigned zero_chunk = ptx::shared_address(mine);
    char* ring = mine + 16;

    float acc[8][4], part[8][4], rowsum[4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f, part[j][e] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) rowsum[e] = 0.0f;
    unsigned off[8] = {};
    // Constant and absent zeros now; stored ones at each group's first block (compute_stage).
    if constexpr (kZeroMode != kZeroInteger) group_offsets(nullptr, lane, off);

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < stages)
        load_stage(p, ring + s * Shape::kStageBytes, kb_begin + s * kStageBlocks, kb_end, slice,
                   lane);
      ptx::cp_async_commit();
    }
    for (int s = 0; s < stages; ++s) {
      ptx::cp_async_wait<kStages - 2>();
      __syncwarp();  // every lane's copies of stage s landed; every lane is done with s − 1
      const int next = s + kStages - 1;
      if (next < stages)
        load_stage(p, ring + (next % kStages) * Shape::kStageBytes,
                   kb_begin + next * kStageBlocks, kb_end, slice, lane);
      ptx::cp_async_commit();
      compute_stage(p, ring + (s % kStages) * Shape::kStageBytes, zero_chunk,
                    kb_begin + s * kStageBlocks, kb_begin, kb_end, lane, off, acc, part, rowsum);
    }
    ptx::cp_async_wait<0>();
    __syncthreads();

    // Sum the warps' K ranges into warp 0.
    if constexpr (kWarps > 1) {
      float* reduce = reinterpret_cast<float*>(shared);
      if (warp > 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) reduce[((warp - 1) * 32 + j * 4 + e) * 32 + lane] = acc[j][e];
      }
      __syncthreads();
      if (warp == 0) {
        for (int other = 1; other < kWarps; ++other)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              acc[j][e] += reduce[((other - 1) * 32 + j * 4 + e) * 32 + lane];
      }
    }

    if (!kSplitK && warp != 0) return;
    if (warp == 0) {
      const int row = lane / 4, col_base = slice * 64 + (lane % 4) * 2;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int half = 0; half < (kRows > 8 ? 2 : 1); ++half) {
          const float v0 = acc[j][half * 2], v1 = acc[j][half * 2 + 1];
          if constexpr (kSplitK) {
            add_split_pair(p, row + half * 8, col_base + j * 8, v0, v1);
          } else {
            store_pair<kOutput>(p, row + half * 8, col_base + j * 8, v0 * p.global_scale,
                                v1 * p.global_scale);
          }
        }
    }
    if constexpr (kSplitK) finish_split_tile<kOutput>(p, blockIdx.x, 0, kRows, slice * 64, 64);
  }
};

// Template arguments in the order of the JIT family "dense_decode_sm80" (src/jit/kernel_spec.cpp):
// kActivation 0 bf16 / 1 fp16; kDequant = UnscaledDequant; kThreads and kDynamicSmemBytes come
// from the spec (the host's mirror of DecodeGemmShape) and must agree.
template <int kRows, int kWarps, int kStageBlocks, int kStages, unsigned long long kFormat,
          int kZeroMode, int kGroup, int kActivation, int kOutput, bool kSplitK, int kDequant,
          int kMinBlocks, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    dense_decode_sm80(const DenseGemmParams params) {
  using Gemm = DecodeGemm<kRows, kWarps, kStageBlocks, kStages, kFormat, kZeroMode, kGroup,
                          kActivation == 0, kOutput, kSplitK, kDequant>;
  static_assert(kThreads == Gemm::Shape::kThreads, "spec threads differ from the kernel's shape");
  static_assert(kDynamicSmemBytes == Gemm::Shape::kSharedBytes,
                "spec shared memory differs from the kernel's shape");
  extern __shared__ __align__(128) char shared[];
  Gemm::run(params, shared);
}

}  // namespace qgemm::kernels
