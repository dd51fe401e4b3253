// dequantize_weight: canonical packed weight -> bf16/fp16 [n, k], for any weight/scale format.
//
//   w[r, c] = scale(r, c) · (decode(q[r, c]) − zero(r, c)) · global_scale      (fp32, rounded
//                                                                               once to out)
//   codes   [n][row_bytes]            LSB-first bit stream per row (util/packed_codes.cuh)
//   scales  [scale_rows][scale_cols]  scale(r, c) = scales[r / rows_per][c / cols_per]
//                                     scale_cols = ceil(k / cols_per): when a group does not
//                                     divide k the last column covers the values that remain,
//                                     and c < k keeps c / cols_per < scale_cols
//   zeros   same grid: packed like codes (integer zero) or stored like scales (float zero)
//   out     [n][k] row-major
//
// Thread mapping: one thread per output element, grid-stride over n·k; consecutive threads take
// consecutive c of one row, so code bytes and outputs are read/written coalesced.
#pragma once

#include "ptx/convert.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"
#include "util/packed_codes.cuh"
#include "util/utility_args.cuh"

namespace qgemm::kernels {

template <unsigned long long kWeightFormat, unsigned long long kScaleFormat, int kZeroPoint,
          int kOutput, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) dequantize_weight_kernel(DequantizeWeightArgs args) {
  constexpr FormatCode weight_format = FormatCode::unpack(kWeightFormat);
  constexpr FormatCode scale_format = FormatCode::unpack(kScaleFormat);
  constexpr int scale_bytes = scale_format.bits <= 8 ? 1 : scale_format.bits <= 16 ? 2 : 4;
  static_assert(weight_format.bits <= 8, "packed weights are 1..8 bits");
  static_assert(kDynamicSmemBytes == 0, "dequantize_weight uses no shared memory");

  const long long total = args.n * args.k;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const long long row = index / args.k;
    const long long col = index - row * args.k;
    const unsigned int code = read_packed_code<weight_format.bits>(
        args.codes + row * args.row_bytes, args.row_bytes, col);
    const long long scale_row = row / args.scale_rows_per;
    const long long scale_col = col / args.scale_cols_per;
    const long long scale_index = scale_row * args.scale_cols + scale_col;
    const float scale =
        decode_to_float<kScaleFormat>(read_stored_code<scale_bytes>(args.scales, scale_index));
    float value = decode_to_float<kWeightFormat>(code);
    if constexpr (kZeroPoint == kMidpointZero) {
      // The middle of the code range, floor((min + max + 1) / 2): 2^(b-1) for uint b, 0 for int b.
      constexpr int twice_midpoint = weight_format.min_int + weight_format.max_int + 1;
      constexpr int midpoint =
          twice_midpoint >= 0 ? twice_midpoint / 2 : -((1 - twice_midpoint) / 2);
      value -= static_cast<float>(midpoint);
    } else if constexpr (kZeroPoint == kIntegerZero) {
      const unsigned int zero_code = read_packed_code<weight_format.bits>(
          args.zeros + scale_row * args.zero_row_bytes, args.zero_row_bytes, scale_col);
      value -= decode_to_float<kWeightFormat>(zero_code);
    } else if constexpr (kZeroPoint == kFloatZero) {
      value -=
          decode_to_float<kScaleFormat>(read_stored_code<scale_bytes>(args.zeros, scale_index));
    }
    const float result = scale * value * args.global_scale;
    if constexpr (kOutput == kBf16) {
      args.out[index] = ptx::float_to_bf16_bits(result);
    } else {
      args.out[index] = ptx::float_to_fp16_bits(result);
    }
  }
}

}  // namespace qgemm::kernels
