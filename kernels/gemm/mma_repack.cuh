// mma_repack: canonical packed weight -> the prepared layout of the mma.sync family or of the
// SM90 wgmma family, on the GPU (the device twin of src/layout/mma_layout.cpp).
//
//   index space  [0, lanes)            one thread per (slice, unit of K, layout thread): gathers
//                                      the 32 codes that thread owns (mma: 8 rows × 4 k pairs of
//                                      a k16 block; wgmma: 2 rows × 16 k of a k64 chunk),
//                                      converts signed codes to offset binary (flip the sign
//                                      bit) and writes its `bits` words
//                [lanes, lanes + g·n)  one thread per (group, column): decodes the scale (and
//                                      zero) and stores it at its lane-permuted column; a
//                                      block's scales that are not exact for packed16 set
//                                      the metadata's flags (one atomic a block)
//
// Reads are gathered (a lane touches 8 rows), but the 4 lanes of a row read the same 2-4
// bytes, so a warp reads 8 short row segments per k16 block: L1 absorbs the reuse.
//
// A gate_up weight prepared for a fused GLU (a.glu_inter = I) reads each prepared row's codes
// and scales from its source row (glu_source_row), so block-scaled weights (a cell of 128 rows)
// keep their cells.
#pragma once

#include "gemm/mma_repack_args.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "gemm/wgmma_weight_layout.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"
#include "util/packed_codes.cuh"
#include "util/scale_exactness.cuh"

namespace qgemm::kernels {

// kZero: 0 none (or an implied constant), 1 stored integer zeros, 2 stored float zeros.
// kOrder: 0 the mma order, 1 the wgmma order (layout::FragmentOrder).
template <unsigned long long kWeight, unsigned long long kScale, int kZero, int kOrder,
          int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) mma_repack_kernel(MmaRepackArgs a) {
  static_assert(kDynamicSmemBytes == 0, "mma_repack uses no shared memory");
  constexpr FormatCode weight = FormatCode::unpack(kWeight);
  constexpr FormatCode scale_format = FormatCode::unpack(kScale);
  constexpr int kBits = weight.bits;
  constexpr int kScaleBytes = scale_format.bits <= 8 ? 1 : scale_format.bits <= 16 ? 2 : 4;
  constexpr unsigned kSignFlip = !weight.is_float() && weight.is_signed ? 1u << (kBits - 1) : 0u;
  using Layout = typename FragmentOrderLayout<kOrder>::Layout;
  const long long units = a.k_blocks * 16 / Layout::kUnitK;
  const long long lanes = a.n_padded / 64 * a.k_blocks * 32;
  const long long scale_rows = repack_scale_rows(a);
  const long long total = lanes + static_cast<long long>(a.groups) * scale_rows;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  const bool glu = a.glu_inter > 0;
  bool inexact_bf16 = false, inexact_fp16 = false;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    if (index < lanes) {
      // index = word_index / bits in both orders: ((slice · units + unit) · threads + thread)
      const int thread = static_cast<int>(index % Layout::kUnitThreads);
      const long long block = index / Layout::kUnitThreads;
      const long long unit = block % units, slice = block / units;
      unsigned words[kBits];
#pragma unroll
      for (int w = 0; w < kBits; ++w) words[w] = 0u;
#pragma unroll
      for (int c = 0; c < MmaWeightLayout::kCodesPerLane; ++c) {
        // Rows in 32 bits (N < 2^31): in 64 bits the GLU map made ptxas spill `words`.
        const int row = static_cast<int>(slice) * 64 + Layout::n_of(thread, c);
        const int n = glu ? static_cast<int>(glu_source_row(row, a.glu_inter)) : row;
        const long long k = unit * Layout::kUnitK + Layout::k_of(thread, c);
        unsigned code = 0;  // padding: code 0, a finite value of every format
        if (n >= 0 && n < a.n && k < a.k)
          code = read_packed_code<kBits>(a.codes + n * a.row_bytes, a.row_bytes, k) ^ kSignFlip;
        const int word = MmaWeightLayout::code_word(c, kBits);
        const int first = MmaWeightLayout::code_bits_in_first_word(c, kBits);
        words[word] |= (code & ((1u << first) - 1u)) << MmaWeightLayout::code_shift(c, kBits);
        if (first < kBits) words[word + 1] |= (code >> first) << (16 * (c % 2));
      }
#pragma unroll
      for (int w = 0; w < kBits; ++w) a.words[index * kBits + w] = words[w];
    } else {
      const long long s = index - lanes;
      const int group = static_cast<int>(s / scale_rows);
      const long long row = s % scale_rows;
      const long long n = glu ? glu_source_row(row, a.glu_inter) : row;
      if (n < 0) continue;  // GLU padding: its scale stays 0
      const long long k0 = static_cast<long long>(group) * a.group_size;
      const long long cell = (n / a.rows_per) * a.grid_cols + k0 / a.cols_per;
      const long long at = static_cast<long long>(group) * a.n_padded + Layout::scale_column(row);
      const float scale = decode_to_float<kScale>(read_stored_code<kScaleBytes>(a.scales, cell));
      a.scales_out[at] = scale;
      inexact_bf16 |= !packed16_scale_exact(scale, kPacked16Bf16, kBits);
      inexact_fp16 |= !packed16_scale_exact(scale, kPacked16Fp16, kBits);
      if constexpr (kZero == 1) {
        a.zeros_out[at] = static_cast<float>(
            read_packed_code<kBits>(a.zeros + (cell / a.grid_cols) * a.zero_row_bytes,
                                    a.zero_row_bytes, cell % a.grid_cols));
      } else if constexpr (kZero == 2) {
        a.zeros_out[at] =
            decode_to_float<kScale>(read_stored_code<kScaleBytes>(a.zeros, cell)) + a.zero_offset;
      }
    }
  }
  const bool block_bf16 = __syncthreads_or(inexact_bf16);
  const bool block_fp16 = __syncthreads_or(inexact_fp16);
  if (threadIdx.x == 0 && (block_bf16 || block_fp16))
    atomicOr(a.scale_inexact, (block_bf16 ? 1u : 0u) | (block_fp16 ? 2u : 0u));
}

}  // namespace qgemm::kernels
