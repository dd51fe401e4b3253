// Weight quantization on the GPU: a bf16 / fp16 / fp32 weight [n, k] in device memory -> its
// canonical packed form (include/qgemm/quant.hpp), code for code what the host quantizer
// (src/quant/block_quant.cpp) computes from the same values. The host's three passes, one
// launch each (the `step` parameter):
//
//   stats  per piece, the part of one row inside one grid cell (cols_per values): min, max
//          and (absmean) Σ|x| -> pieces[n][grid_cols]; the flat index of the first non-finite
//          element -> *first_bad (atomicMin); the tensor's absmax (second level). A warp a
//          piece, or with 16-byte loads several pieces a warp (quantize_weight_stats_vector8)
//   cells  a thread per unit of 8 cells of a grid row: merges the cells' pieces row by row,
//          derives scale and zero as the host does (in double) and stores their codes; the 8
//          integer zeros of a unit fill `bits` whole bytes of the packed zero row
//   codes  a thread per unit of 8 elements of a row: each x / (scale · global) + zero rounded
//          to its code; the 8 codes fill `bits` whole bytes of the packed row
//
//   unit u of a row:   elements 8u .. 8u+7   ->   bytes  u·bits .. u·bits + bits − 1
//                      (bit j·bits of the row is element j's lowest, LSB-first)
//
// Exactness. Everything the host computes in double is computed here in double with the same
// operations in the same order (IEEE division and rounding; no product meets a sum, so FMA
// contraction cannot change a result): scales, zeros, the global scale and each quotient.
// Min and max do not depend on the order; Σ|x| does, so both sides add a piece's |x| in runs of
// 32 consecutive values, each run by the same butterfly tree (a warp's xor shuffles; the host's
// quant_detail::run_sum_abs), and the runs, then the pieces of a cell, in order.
#pragma once

#include "ptx/convert.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"
#include "util/packed_codes.cuh"
#include "util/utility_args.cuh"

namespace qgemm::kernels {

template <int kInput>
__device__ __forceinline__ float weight_half_to_float(unsigned short bits) {
  return kInput == kWeightBf16 ? ptx::bf16_bits_to_float(bits) : ptx::fp16_bits_to_float(bits);
}

template <int kInput>
__device__ __forceinline__ float load_weight_value(const void* base, long long index) {
  if constexpr (kInput == kWeightFp32) {
    return static_cast<const float*>(base)[index];
  } else {
    return weight_half_to_float<kInput>(static_cast<const unsigned short*>(base)[index]);
  }
}

// Eight consecutive inputs of a row from column `first`, 16 bytes at a time (args.vector8: k
// and ld multiples of 8, the input 16-byte aligned).
template <int kInput>
__device__ __forceinline__ void load_weight_run8(const QuantizeWeightArgs& args, long long row,
                                                 long long first, float (&x)[8]) {
  if constexpr (kInput == kWeightFp32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(args.input) +
                                                      row * args.ld + first);
    const float4 a = p[0], b = p[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(args.input) +
                                                    row * args.ld + first);
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = weight_half_to_float<kInput>(static_cast<unsigned short>(words[i]));
      x[2 * i + 1] = weight_half_to_float<kInput>(static_cast<unsigned short>(words[i] >> 16));
    }
  }
}

// x, or 0 where x is not finite, which also lowers *first_bad to its flat index (row · k + col):
// what the stats step does with each input.
__device__ __forceinline__ float finite_or_flagged(const QuantizeWeightArgs& args, float x,
                                                   long long row, long long col) {
  if (isfinite(x)) return x;
  atomicMin(args.first_bad, static_cast<unsigned long long>(row * args.k + col));
  return 0.0f;
}

// The code of a finite double in float format kFormat (not exponent-only), rounded to nearest
// with ties to the even code: the host's encode_float (src/format) for |v| <= the format's
// largest finite value (callers clamp). An unsigned format takes negatives as 0.
template <unsigned long long kFormat>
__device__ __forceinline__ unsigned encode_double(double v) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  static_assert(f.is_float() && f.specials != kExponentOnly && f.mantissa_bits >= 1,
                "float formats with a mantissa");
  constexpr int m = f.mantissa_bits;
  const unsigned sign = f.is_signed && signbit(v) ? 1u << (f.bits - 1) : 0u;
  const double magnitude = f.is_signed ? fabs(v) : fmax(v, 0.0);
  if (magnitude == 0.0) return sign;
  // Quantum 2^(e − m) in the binade of e (the subnormals share the first normal binade's).
  // The code of significand r there is ((e + bias − 1) << m) + r: for e = 1 − bias that is r
  // itself (subnormals, and 2^m.. the first normals); above, r ∈ [2^m, 2^(m+1)] adds the
  // implicit one into the exponent field, and r = 2^(m+1) (rounding up into the next binade)
  // carries there too.
  const int e = max(ilogb(magnitude), 1 - f.bias);
  const double r = rint(ldexp(magnitude, m - e));  // ties to even: the even code
  return sign | ((static_cast<unsigned>(e + f.bias - 1) << m) + static_cast<unsigned>(r));
}

// The code of a value already on the scale format's grid (a finalized scale, a rounded zero).
template <unsigned long long kFormat>
__device__ __forceinline__ unsigned exact_code(double v) {
  constexpr FormatCode f = FormatCode::unpack(kFormat);
  if constexpr (f.specials == kExponentOnly) {
    return static_cast<unsigned>(ilogb(v) + f.bias);
  } else {
    return encode_double<kFormat>(v);
  }
}

// Unit `unit` of a packed row (8 codes of kBits, code e at bit e · kBits of `packed`): its kBits
// bytes, fewer where the row ends (row_bytes), whose pad bits are the 0s `packed` holds there.
template <int kBits>
__device__ __forceinline__ void store_unit(unsigned char* row, long long row_bytes, long long unit,
                                           unsigned long long packed) {
  const long long first_byte = unit * kBits;
  const int bytes = static_cast<int>(min(static_cast<long long>(kBits), row_bytes - first_byte));
  for (int b = 0; b < bytes; ++b)
    row[first_byte + b] = static_cast<unsigned char>(packed >> (8 * b));
}

template <unsigned long long kWeight, unsigned long long kScale, int kZero>
struct WeightQuantizer {
  static constexpr FormatCode element = FormatCode::unpack(kWeight);
  static constexpr FormatCode scale_format = FormatCode::unpack(kScale);
  static constexpr int bits = element.bits;
  static constexpr int scale_bytes = scale_format.bits <= 8 ? 1 : scale_format.bits <= 16 ? 2 : 4;
  // The host's BlockRule: ternary without a zero point takes BitNet's absmean; e8m0 scales the
  // OCP MX shared exponent; every other cell its absmax (or range, with zero points).
  static constexpr bool absmean = !element.is_float() && element.min_int == -1 &&
                                  element.max_int == 1 && kZero == kNoZero;
  static constexpr bool shared_exponent =
      scale_format.specials == kExponentOnly && kZero == kNoZero && !absmean;
  static_assert(bits >= 1 && bits <= 8, "packed weights are 1..8 bits");
  static_assert(element.is_float() ? element.specials != kExponentOnly && element.mantissa_bits >= 1
                                   : true,
                "float elements with a mantissa");
  static_assert(scale_format.is_float() && scale_format.bits <= 32, "float scales");
  static_assert(kZero == kNoZero || !element.is_float(), "zero points need integer elements");
  static_assert(kZero != kFloatZero || scale_format.specials != kExponentOnly,
                "float zero points need a scale format with a sign and a mantissa");

  // The element range as numbers (the host's element_low / element_high).
  __host__ __device__ static constexpr double high() {
    return element.is_float() ? static_cast<double>(format_max_finite<kWeight>())
                              : static_cast<double>(element.max_int);
  }
  __host__ __device__ static constexpr double low() {
    return element.is_float() ? (element.is_signed ? -high() : 0.0)
                              : static_cast<double>(element.min_int);
  }
  // What absmax divides by: the element's largest value, or for zero points half the integer
  // levels (the host's absmax_denominator).
  __host__ __device__ static constexpr double absmax_denominator() {
    return kZero == kNoZero ? high() : (element.max_int - element.min_int) / 2.0;
  }

  __device__ static unsigned encode_element(double q) {
    q = fmin(fmax(q, low()), high());  // saturate, as the host's ElementEncoder
    if constexpr (element.is_float()) {
      return encode_double<kWeight>(q);
    } else {
      return static_cast<unsigned>(static_cast<long long>(rint(q))) & element.code_mask();
    }
  }
};

// The global (second-level) scale from the tensor's absmax, as the host derives it: the fp32
// rounding of absmax / denominator, or 1 where that is not a normal fp32 number.
__device__ __forceinline__ double weight_second_level(const QuantizeWeightArgs& args) {
  if (!args.second_level) return 1.0;
  const float factor =
      static_cast<float>(static_cast<double>(*args.tensor_absmax) / args.second_level_denominator);
  return factor >= 1.17549435e-38f && factor <= 3.40282347e38f ? static_cast<double>(factor)
                                                                : 1.0;
}

// stats where the inputs load 16 bytes at a time and the cells are whole runs of 8 wide (not
// absmean: its sums keep the host's order, runs of 32 by a warp's butterfly). `lanes` lanes
// share a piece (a power of two, at most 32 and at most the piece's runs of 8), so a warp takes
// 32 / lanes neighbouring pieces at once and reads a contiguous stretch of the row:
//
//   lane l  ->  piece  step · (32 / lanes) + l / lanes,  runs  l % lanes,  + lanes, ...
//
// (NVFP4's 16-wide cells: 2 lanes a piece, 16 pieces a warp, where a warp a piece left half the
// lanes idle and loaded 2 bytes a lane.) Returns the warp's part of the tensor's absmax.
template <int kInput, int kThreads>
__device__ float quantize_weight_stats_vector8(const QuantizeWeightArgs& args) {
  const int lane = threadIdx.x % 32;
  const long long runs = args.cols_per / 8;
  int lanes = 32;
  while (lanes > runs) lanes /= 2;
  const int per_warp = 32 / lanes;
  const long long pieces = args.n * args.grid_cols;
  const long long steps = (pieces + per_warp - 1) / per_warp;
  const long long warps = static_cast<long long>(gridDim.x) * (kThreads / 32);
  float tensor_absmax = 0.0f;
  for (long long step = blockIdx.x * (kThreads / 32ll) + threadIdx.x / 32; step < steps;
       step += warps) {
    const long long piece = step * per_warp + lane / lanes;
    float low = __int_as_float(0x7f800000), high = __int_as_float(0xff800000);  // +Inf, -Inf
    if (piece < pieces) {
      const long long row = piece / args.grid_cols, cell_col = piece - row * args.grid_cols;
      const long long begin = cell_col * args.cols_per;
      const long long end = min(args.k, begin + args.cols_per);
#pragma unroll 4
      for (long long first = begin + 8 * (lane % lanes); first < end; first += 8ll * lanes) {
        float x[8];
        load_weight_run8<kInput>(args, row, first, x);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          x[e] = finite_or_flagged(args, x[e], row, first + e);
          low = fminf(low, x[e]);
          high = fmaxf(high, x[e]);
        }
      }
    }
    for (int offset = lanes / 2; offset > 0; offset >>= 1) {
      low = fminf(low, __shfl_xor_sync(~0u, low, offset));
      high = fmaxf(high, __shfl_xor_sync(~0u, high, offset));
    }
    if (piece < pieces) {  // every lane of the piece holds its extremes (from >= 1 value)
      if (lane % lanes == 0) {
        args.piece_min[piece] = low;
        args.piece_max[piece] = high;
      }
      tensor_absmax = fmaxf(tensor_absmax, fmaxf(fabsf(low), fabsf(high)));
    }
  }
  // The warp's lanes saw different pieces: every lane returns the warp's absmax (the caller
  // keeps lane 0's).
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    tensor_absmax = fmaxf(tensor_absmax, __shfl_xor_sync(~0u, tensor_absmax, offset));
  return tensor_absmax;
}

template <unsigned long long kWeight, unsigned long long kScale, int kZero, int kInput,
          int kThreads>
__device__ void quantize_weight_stats(const QuantizeWeightArgs& args, float* warp_absmax) {
  using Q = WeightQuantizer<kWeight, kScale, kZero>;
  const int lane = threadIdx.x % 32;
  const long long pieces = args.n * args.grid_cols;
  const long long warps = static_cast<long long>(gridDim.x) * (kThreads / 32);
  float tensor_absmax = 0.0f;
  const bool vector8 = !Q::absmean && args.vector8 && args.cols_per % 8 == 0;
  if (vector8) tensor_absmax = quantize_weight_stats_vector8<kInput, kThreads>(args);
  for (long long piece = blockIdx.x * (kThreads / 32ll) + threadIdx.x / 32;
       !vector8 && piece < pieces; piece += warps) {
    const long long row = piece / args.grid_cols, cell_col = piece - row * args.grid_cols;
    const long long begin = cell_col * args.cols_per;
    const long long end = min(args.k, begin + args.cols_per);
    float low = __int_as_float(0x7f800000), high = __int_as_float(0xff800000);  // +Inf, -Inf
    double sum_abs = 0.0;
    for (long long run = begin; run < end; run += 32) {
      const long long col = run + lane;
      float x = 0.0f;
      if (col < end) {
        x = finite_or_flagged(args, load_weight_value<kInput>(args.input, row * args.ld + col),
                              row, col);
        low = fminf(low, x);
        high = fmaxf(high, x);
      }
      if constexpr (Q::absmean) {
        // The run's Σ|x| by the butterfly every lane ends with the same value of (host twin:
        // quant_detail::run_sum_abs); absent lanes add +0.
        double a = fabs(static_cast<double>(x));
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) a = a + __shfl_xor_sync(~0u, a, offset);
        sum_abs += a;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      low = fminf(low, __shfl_xor_sync(~0u, low, offset));
      high = fmaxf(high, __shfl_xor_sync(~0u, high, offset));
    }
    if (lane == 0) {
      args.piece_min[piece] = low;
      args.piece_max[piece] = high;
      if constexpr (Q::absmean) args.piece_sum_abs[piece] = sum_abs;
    }
    tensor_absmax = fmaxf(tensor_absmax, fmaxf(fabsf(low), fabsf(high)));
  }
  if (args.second_level) {
    // One atomic per block (non-negative floats order as their bits).
    if (lane == 0) warp_absmax[threadIdx.x / 32] = tensor_absmax;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int warp = 1; warp < kThreads / 32; ++warp)
        tensor_absmax = fmaxf(tensor_absmax, warp_absmax[warp]);
      atomicMax(reinterpret_cast<unsigned*>(args.tensor_absmax), __float_as_uint(tensor_absmax));
    }
  }
}

template <unsigned long long kWeight, unsigned long long kScale, int kZero, int kThreads>
__device__ void quantize_weight_cells(const QuantizeWeightArgs& args) {
  using Q = WeightQuantizer<kWeight, kScale, kZero>;
  const double second_level = weight_second_level(args);
  if (blockIdx.x == 0 && threadIdx.x == 0) *args.global_scale = static_cast<float>(second_level);
  const long long units_per_row = (args.grid_cols + 7) / 8;
  const long long units = args.grid_rows * units_per_row;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long unit = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; unit < units;
       unit += stride) {
    const long long grid_row = unit / units_per_row;
    const long long first_col = (unit - grid_row * units_per_row) * 8;
    const long long row_begin = grid_row * args.rows_per;
    const long long row_end = min(args.n, row_begin + args.rows_per);
    unsigned long long zero_bits = 0;  // integer zeros, packed
    const int cells = static_cast<int>(min(8ll, args.grid_cols - first_col));
    for (int e = 0; e < cells; ++e) {
      const long long cell_col = first_col + e;
      float low = __int_as_float(0x7f800000), high = __int_as_float(0xff800000);  // +Inf, -Inf
      double sum_abs = 0.0;
      for (long long row = row_begin; row < row_end; ++row) {
        const long long piece = row * args.grid_cols + cell_col;
        low = fminf(low, args.piece_min[piece]);
        high = fmaxf(high, args.piece_max[piece]);
        if constexpr (Q::absmean) sum_abs += args.piece_sum_abs[piece];
      }
      const double amax = fmax(fabs(static_cast<double>(low)), fabs(static_cast<double>(high)));
      double scale = 1.0;
      if constexpr (kZero == kNoZero) {
        if constexpr (Q::absmean) {
          const long long count =
              (row_end - row_begin) * (min(args.k, (cell_col + 1) * args.cols_per) -
                                       cell_col * args.cols_per);
          scale = finalize_scale<kScale>(sum_abs / static_cast<double>(count) / second_level);
        } else if constexpr (Q::shared_exponent) {
          const double scaled = amax / second_level;
          scale = scaled > 0 ? finalize_scale<kScale>(ldexp(1.0, ilogb(scaled) -
                                                                     ilogb(Q::high())))
                             : 1.0;
        } else {
          scale = finalize_scale<kScale>(amax / Q::high() / second_level);
        }
      } else if constexpr (kZero == kMidpointZero) {
        scale = finalize_scale<kScale>(amax / Q::absmax_denominator() / second_level);
      } else {
        constexpr double levels = Q::element.max_int - Q::element.min_int;
        double lo = low, hi = high;
        if constexpr (kZero == kIntegerZero) {
          // The range holds 0, so that 0 is a code.
          lo = fmin(lo, 0.0);
          hi = fmax(hi, 0.0);
        } else if (!(hi > lo)) {  // a constant cell: widened to 0, as the host does
          lo = fmin(lo, 0.0);
          hi = fmax(hi, 0.0);
        }
        scale = finalize_scale<kScale>((hi - lo) / levels / second_level);
        const double raw_zero = Q::element.min_int - lo / (scale * second_level);
        if constexpr (kZero == kIntegerZero) {
          const double zero = fmin(fmax(rint(raw_zero), static_cast<double>(Q::element.min_int)),
                                   static_cast<double>(Q::element.max_int));
          zero_bits |= static_cast<unsigned long long>(Q::encode_element(zero))
                       << (e * Q::bits);
        } else {
          // Rounded to the scale format (an unsigned one keeps negatives at 0, as the host).
          constexpr double scale_max = format_max_finite<kScale>();
          write_stored_code<Q::scale_bytes>(
              args.zeros, grid_row * args.grid_cols + cell_col,
              encode_double<kScale>(fmin(fmax(raw_zero, -scale_max), scale_max)));
        }
      }
      write_stored_code<Q::scale_bytes>(args.scales, grid_row * args.grid_cols + cell_col,
                                       exact_code<kScale>(scale));
    }
    if constexpr (kZero == kIntegerZero)
      store_unit<Q::bits>(args.zeros + grid_row * args.zero_row_bytes, args.zero_row_bytes,
                          first_col / 8, zero_bits);
  }
}

template <unsigned long long kWeight, unsigned long long kScale, int kZero, int kInput,
          int kThreads>
__device__ void quantize_weight_codes(const QuantizeWeightArgs& args) {
  using Q = WeightQuantizer<kWeight, kScale, kZero>;
  const double second_level = static_cast<double>(*args.global_scale);
  const long long units_per_row = (args.k + 7) / 8;
  const long long units = args.n * units_per_row;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long unit = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; unit < units;
       unit += stride) {
    const long long row = unit / units_per_row;
    const long long first = (unit - row * units_per_row) * 8;
    const int count = static_cast<int>(min(8ll, args.k - first));
    float x[8];
    if (args.vector8 && count == 8) {
      load_weight_run8<kInput>(args, row, first, x);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        x[e] = e < count ? load_weight_value<kInput>(args.input, row * args.ld + first + e) : 0.0f;
    }
    const long long grid_row = row / args.rows_per;
    // The cell of the current element and where the next one begins (cells of any width).
    long long cell_col = first / args.cols_per;
    long long next_cell = (cell_col + 1) * args.cols_per;
    double divisor = 0.0, zero = 0.0;
    auto load_cell = [&] {
      const long long index = grid_row * args.grid_cols + cell_col;
      const double scale =
          decode_to_float<kScale>(read_stored_code<Q::scale_bytes>(args.scales, index));
      divisor = scale * second_level;
      if constexpr (kZero == kMidpointZero) {
        zero = floor((Q::element.min_int + Q::element.max_int + 1) / 2.0);
      } else if constexpr (kZero == kIntegerZero) {
        zero = decode_to_float<kWeight>(read_packed_code<Q::bits>(
            args.zeros + grid_row * args.zero_row_bytes, args.zero_row_bytes, cell_col));
      } else if constexpr (kZero == kFloatZero) {
        zero = decode_to_float<kScale>(read_stored_code<Q::scale_bytes>(args.zeros, index));
      }
    };
    load_cell();
    unsigned long long packed = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < count) {
        if (first + e >= next_cell) {
          cell_col = (first + e) / args.cols_per;
          next_cell = (cell_col + 1) * args.cols_per;
          load_cell();
        }
        const double q = static_cast<double>(x[e]) / divisor + zero;
        packed |= static_cast<unsigned long long>(Q::encode_element(q)) << (e * Q::bits);
      }
    }
    store_unit<Q::bits>(args.codes + row * args.row_bytes, args.row_bytes, first / 8, packed);
  }
}

template <unsigned long long kWeight, unsigned long long kScale, int kZero, int kInput, int kStep,
          int kThreads, int kDynamicSmemBytes>
// (A minimum of 1 block per SM: without it ptxas held the stats step to 32 registers and
// spilled 32 bytes, sm_90a.)
__global__ void __launch_bounds__(kThreads, 1) quantize_weight_kernel(QuantizeWeightArgs args) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  static_assert(kDynamicSmemBytes == 0, "quantize_weight uses static shared memory only");
  if constexpr (kStep == kWeightStats) {
    __shared__ float warp_absmax[kThreads / 32];
    quantize_weight_stats<kWeight, kScale, kZero, kInput, kThreads>(args, warp_absmax);
  } else if constexpr (kStep == kWeightCells) {
    quantize_weight_cells<kWeight, kScale, kZero, kThreads>(args);
  } else {
    quantize_weight_codes<kWeight, kScale, kZero, kInput, kThreads>(args);
  }
}

}  // namespace qgemm::kernels
