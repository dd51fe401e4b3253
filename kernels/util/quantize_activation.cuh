// Activation quantization on the GPU: bf16/fp16 A [m, k] -> the codes and scales of an
// ActivationQuant, code for code what the host quantizer (src/quant) computes, and the 16-bit
// operand through which the dense GEMM kernels serve quantized activations.
//
//   scaling  cell (one scale)          scale (rounded to the scale format)     row factor
//   static   the tensor                the given one, or absmax(A)/max  fp32   the scale
//   token    one row                   absmax(row)/max                  fp32   the scale
//   group    G values of a row         absmax(cell)/max                 fp32   1
//   mx       32 values of a row        2^(⌊log2 absmax⌋ − ⌊log2 max⌋)   e8m0   1
//   nv       16 values of a row        absmax/max/t, t = absmax(A)/(max·448) ue4m3   t
//
// Group, mx and nv rows have ceil(k / G) cells; when G does not divide k the last one holds
// the k − (cells − 1)·G values that remain and takes its absmax over those alone.
//
//   code = round_nearest_even(clamp(x / (scale · t), −max, max))      (t = 1 except NV)
//
// Scales are computed in double from the fp32 absmax and rounded once into the scale format,
// and x / (scale · t) is the same double quotient the host divides, so the codes agree exactly
// (see encode_quotient). An all-zero cell gets scale 1 (codes 0), as on the host.
//
// Emit modes:
//   codes    the canonical packed form (include/qgemm/quant.hpp): codes[m][ceil(k·bits/8)],
//            the scale grid's codes row-major, NV's tensor scale in tensor_scale[0]; or, with
//            other scale strides in the arguments, the scales where cuBLASLt reads them
//            (src/runtime/cublaslt.hpp: 1x128 scales [cell][m], a per-row scale repeated):
//              scale(row, cell) -> scales[row · scale_row_stride + cell · scale_cell_stride]
//   operand  operand[m][ldo] in 16 bits and row_factors[m] such that
//              A_dequantized[r, c] = operand[r, c] · row_factors[r]
//            exactly for static / token / nv (the code's value, times the ue4m3 cell scale for
//            nv: at most 6 significant bits) and mx (times a power of two); for group the
//            product code · fp32 scale is rounded once to bf16.
//            With fold_row_factors (dequantize + cuBLAS into a bf16 output: cuBLAS cannot
//            scale rows), the row's factor is multiplied into every value before its one
//            rounding and 1 is written as the factor (2^-9 relative for bf16, as for group
//            scalings).
//   operand8 the 8-bit codes themselves (int8, e4m3; static and token scaling) in the 8-bit
//            mma's K order: operand8[r][operand8_position(c)], rows of ldo = round_up(k, 16)
//            bytes whose positions of c >= k hold 0; row_factors as for operand. Group scaling
//            (the SM90 FP8 tiles' 1x128 groups) writes the codes so too, and the cell scales as
//            codes mode does (no row factors).
//
// One block per row (grid-stride over rows); for short cells gridDim.y blocks share a row (the
// row's warps, numbered across them, take its cells in turn). A thread takes W consecutive
// values at a time:
// W = 8 (one 16-byte load; 8 or 4 bytes of codes, 16 bytes of operand stored at once) where
// args.vector8 says every row start is 16-byte aligned (k, lda, ldo and G multiples of 8; not
// operand8), else W = 1. A row-wide cell (static, token) is walked by all threads with a block
// reduction for its absmax; short cells (group, mx, nv) of G / W runs are walked by L lanes
// each (short_cell_walk: for W = 8, L = the largest power of two dividing G / W over 4, so
// that a lane holds 4 runs; for W = 1 that power itself; 1 ≤ L ≤ 32), lane l of a cell taking
// its runs l, l + L, l + 2L, ... so that a warp's loads are contiguous:
//
//   G = 128, W = 8: L = 4, a warp takes 8 cells; lane 4c + l holds runs l, l+4, l+8, l+12
//   of cell c (values 8l .. 8l+7, 32+8l .., 64+8l .., 96+8l ..).
//
// Either width computes every code the same way, element by element. Non-finite inputs are
// not diagnosed here (the host quantizer rejects them); in operand mode they become NaN, so the
// rows they touch come out NaN rather than finite and wrong.
#pragma once

#include "gemm/mma_weight_layout.cuh"
#include "ptx/convert.cuh"
#include "util/format_code.cuh"
#include "util/number_codec.cuh"
#include "util/utility_args.cuh"

namespace qgemm::kernels {

template <int kInput>
__device__ __forceinline__ float load_half(const unsigned short* base, long long index) {
  if constexpr (kInput == kBf16) {
    return ptx::bf16_bits_to_float(base[index]);
  } else {
    return ptx::fp16_bits_to_float(base[index]);
  }
}

template <int kInput>
__device__ __forceinline__ float half_bits_to_float(unsigned bits) {
  if constexpr (kInput == kBf16) {
    return ptx::bf16_bits_to_float(static_cast<unsigned short>(bits));
  } else {
    return ptx::fp16_bits_to_float(static_cast<unsigned short>(bits));
  }
}

// The 8 values of a 16-byte load.
template <int kInput>
__device__ __forceinline__ void unpack_half8(uint4 v, float (&x)[8]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = half_bits_to_float<kInput>(words[i] & 0xffffu);
    x[2 * i + 1] = half_bits_to_float<kInput>(words[i] >> 16);
  }
}

// Values index .. index + 7 (base + index 16-byte aligned).
template <int kInput>
__device__ __forceinline__ void load_half8(const unsigned short* base, long long index,
                                           float (&x)[8]) {
  unpack_half8<kInput>(*reinterpret_cast<const uint4*>(base + index), x);
}

template <int kType>
__device__ __forceinline__ unsigned short to_half_bits(float value) {
  return kType == kBf16 ? ptx::float_to_bf16_bits(value) : ptx::float_to_fp16_bits(value);
}

// The largest of the block's `absmax` values, in thread 0 (the others hold partial maxima);
// `warp_absmax` is shared scratch of one float per warp. Ends with the block synchronized.
template <int kThreads>
__device__ __forceinline__ float block_absmax(float absmax, float* warp_absmax) {
  for (int offset = 16; offset > 0; offset >>= 1)
    absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  if (threadIdx.x % 32 == 0) warp_absmax[threadIdx.x / 32] = absmax;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int warp = 1; warp < kThreads / 32; ++warp) absmax = fmaxf(absmax, warp_absmax[warp]);
  return absmax;
}

// A scale's value in its format (scales are fp32, or one byte: e8m0, ue4m3).
template <unsigned long long kScaleFormat>
__device__ __forceinline__ float load_scale(const unsigned char* scales, long long index) {
  constexpr FormatCode f = FormatCode::unpack(kScaleFormat);
  if constexpr (f.bits == 32) {
    return reinterpret_cast<const float*>(scales)[index];
  } else {
    static_assert(f.bits <= 8, "activation scales are fp32 or one byte");
    return decode_to_float<kScaleFormat>(scales[index]);
  }
}

template <unsigned long long kScaleFormat>
__device__ __forceinline__ void store_scale(unsigned char* scales, long long index, double scale) {
  constexpr FormatCode f = FormatCode::unpack(kScaleFormat);
  if constexpr (f.bits == 32) {
    reinterpret_cast<float*>(scales)[index] = static_cast<float>(scale);
  } else if constexpr (f.specials == kExponentOnly) {
    scales[index] = static_cast<unsigned char>(ilogb(scale) + f.bias);
  } else {
    scales[index] =
        static_cast<unsigned char>(encode_from_float<kScaleFormat>(static_cast<float>(scale)));
  }
}

// The scale of a cell whose absolute maximum is `absmax` (t: NV's tensor scale, else 1).
template <int kScaling, unsigned long long kScaleFormat>
__device__ __forceinline__ double cell_scale(float absmax, double element_max, double t) {
  if constexpr (kScaling == kScaleMx) {
    const double scaled = static_cast<double>(absmax) / t;
    if (!(scaled > 0)) return 1.0;
    return finalize_scale<kScaleFormat>(ldexp(1.0, ilogb(scaled) - ilogb(element_max)));
  } else {
    return finalize_scale<kScaleFormat>(static_cast<double>(absmax) / element_max / t);
  }
}

// NV's tensor scale from the tensor's absmax (1 where that is not a normal fp32 number).
__device__ __forceinline__ double nv_tensor_scale(float tensor_absmax, double denominator) {
  const float t = static_cast<float>(static_cast<double>(tensor_absmax) / denominator);
  return t >= 1.17549435e-38f && t <= 3.40282347e38f ? static_cast<double>(t) : 1.0;
}

// What one element becomes: its code, and (operand mode) its operand value; `folded`: the row's
// factor times it (1 when the factor stays apart).
template <unsigned long long kCode, int kScaling, int kOperand>
__device__ __forceinline__ unsigned short operand_bits(unsigned code, float scale,
                                                       float folded = 1.0f) {
  float value = decode_to_float<kCode>(code);
  if constexpr (kScaling == kScaleGroup || kScaling == kScaleMx || kScaling == kScaleNv)
    value *= scale;
  return to_half_bits<kOperand>(value * folded);
}

template <int kScaling>
__device__ __forceinline__ float row_factor(float scale, float tensor_scale) {
  if constexpr (kScaling == kScaleStatic || kScaling == kScaleToken) return scale;
  if constexpr (kScaling == kScaleNv) return tensor_scale;
  return 1.0f;
}

template <unsigned long long kCode, int kScaling, unsigned long long kScaleFormat, int kInput,
          int kEmit, int kOperand>
struct ActivationQuantizer {
  static constexpr FormatCode code_format = FormatCode::unpack(kCode);
  static_assert(code_format.bits == 8 || code_format.bits == 4, "activation codes of 4 or 8 bits");
  static_assert(kEmit != kEmitOperand8 ||
                    (code_format.bits == 8 && (kScaling == kScaleStatic ||
                                               kScaling == kScaleToken || kScaling == kScaleGroup)),
                "the 8-bit operand holds 8-bit codes of one scale per row, or per group (whose "
                "scales go where codes mode writes them)");

  // Emits element `col` of `row` (code and value), all lanes of the warp together: 4-bit codes
  // are paired with the next lane's (`col` + 1 must sit there when `col` is even).
  // `factor`: the row's factor (static, token: the scale; nv: the tensor scale; else 1).
  __device__ static void emit(const QuantizeActivationArgs& args, long long row, long long col,
                              bool valid, float x, double divisor, QuotientInverse inverse, float scale,
                              float factor) {
    unsigned code = valid ? encode_quotient<kCode>(x, divisor, inverse) : 0u;
    if constexpr (kEmit == kEmitCodes) {
      if constexpr (code_format.bits == 8) {
        if (valid) args.codes[row * args.k + col] = static_cast<unsigned char>(code);
      } else {
        const unsigned next = __shfl_down_sync(0xffffffffu, code, 1);
        const long long row_bytes = (args.k + 1) / 2;
        if (valid && col % 2 == 0)
          args.codes[row * row_bytes + col / 2] =
              static_cast<unsigned char>(code | (col + 1 < args.k ? next << 4 : 0u));
      }
    } else if constexpr (kEmit == kEmitOperand8) {
      // Every column of the padded row is written (zero past k).
      if (col < (args.k + 15) / 16 * 16)
        args.operand8[row * args.ldo + MmaWeightLayout::operand8_position(static_cast<int>(col))] =
            static_cast<unsigned char>(code);
    } else if (valid) {
      args.operand[row * args.ldo + col] =
          isfinite(x) ? operand_bits<kCode, kScaling, kOperand>(
                            code, scale, args.fold_row_factors ? factor : 1.0f)
                      : static_cast<unsigned short>(kOperand == kBf16 ? 0x7fc0 : 0x7e00);
    }
  }

  // Emits elements col .. col + 7 of `row` (all of them below k; the outputs 8-, 4- or 16-byte
  // aligned: args.vector8), as emit() does each.
  __device__ __forceinline__ static void emit8(const QuantizeActivationArgs& args, long long row, long long col,
                               const float (&x)[8], double divisor, QuotientInverse inverse, float scale,
                               float factor) {
    static_assert(kEmit != kEmitOperand8, "operand8 permutes K: one element at a time");
    float q[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = decided_quotient<kCode>(x[e], divisor, inverse);
    unsigned code[8];
    encode_from_float8<kCode>(q, code);
    if constexpr (kEmit == kEmitCodes) {
      if constexpr (code_format.bits == 8) {
        uint2 bytes = make_uint2(0u, 0u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          bytes.x |= (code[e] & 0xffu) << (8 * e);
          bytes.y |= (code[e + 4] & 0xffu) << (8 * e);
        }
        *reinterpret_cast<uint2*>(args.codes + row * args.k + col) = bytes;
      } else {
        unsigned nibbles = 0;
#pragma unroll
        for (int e = 0; e < 8; ++e) nibbles |= (code[e] & 15u) << (4 * e);
        *reinterpret_cast<unsigned*>(args.codes + row * (args.k / 2) + col / 2) = nibbles;
      }
    } else {
      const float folded = args.fold_row_factors ? factor : 1.0f;
      unsigned halves[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        halves[e] = isfinite(x[e]) ? operand_bits<kCode, kScaling, kOperand>(code[e], scale, folded)
                                   : (kOperand == kBf16 ? 0x7fc0u : 0x7e00u);
      *reinterpret_cast<uint4*>(args.operand + row * args.ldo + col) =
          make_uint4(halves[0] | halves[1] << 16, halves[2] | halves[3] << 16,
                     halves[4] | halves[5] << 16, halves[6] | halves[7] << 16);
    }
  }

  template <int kThreads, int kWidth>
  __device__ static void row_wide(const QuantizeActivationArgs& args, long long row,
                                  const unsigned short* input, float* warp_absmax,
                                  double* shared_scale) {
    if constexpr (kScaling == kScaleStatic) {
      if (threadIdx.x == 0)
        *shared_scale = args.static_scale > 0 ? args.static_scale
                                              : cell_scale<kScaling, kScaleFormat>(
                                                    *args.tensor_absmax, args.element_max, 1.0);
    } else {
      float absmax = 0.0f;
      if constexpr (kWidth == 8) {
        for (long long col = threadIdx.x * 8ll; col < args.k; col += kThreads * 8ll) {
          float x[8];
          load_half8<kInput>(input, col, x);
#pragma unroll
          for (int e = 0; e < 8; ++e) absmax = fmaxf(absmax, fabsf(x[e]));
        }
      } else {
#pragma unroll 8
        for (long long col = threadIdx.x; col < args.k; col += kThreads)
          absmax = fmaxf(absmax, fabsf(load_half<kInput>(input, col)));
      }
      absmax = block_absmax<kThreads>(absmax, warp_absmax);
      if (threadIdx.x == 0)
        *shared_scale = cell_scale<kScaling, kScaleFormat>(absmax, args.element_max, 1.0);
    }
    __syncthreads();
    const double scale = *shared_scale;
    if constexpr (kEmit == kEmitCodes) {
      // The row's scale into its scale_copies cells; a row stride of 0 (static, canonical:
      // the 1 x 1 grid) is written by row 0 alone.
      if (args.scale_row_stride != 0 || row == 0)
        for (long long copy = threadIdx.x; copy < args.scale_copies; copy += kThreads)
          store_scale<kScaleFormat>(
              args.scales, row * args.scale_row_stride + copy * args.scale_cell_stride, scale);
    } else {
      if (threadIdx.x == 0)
        args.row_factors[row] = args.fold_row_factors ? 1.0f : static_cast<float>(scale);
    }
    // Whole warps walk the row together (emit pairs 4-bit codes across lanes); operand8 walks
    // its padding too.
    const QuotientInverse inverse = quotient_inverse(scale);
    if constexpr (kWidth == 8) {
      // Not unrolled: 8 quotients in flight already fill the 128 registers of 512 threads.
#pragma unroll 1
      for (long long col = threadIdx.x * 8ll; col < args.k; col += kThreads * 8ll) {
        float x[8];
        load_half8<kInput>(input, col, x);
        emit8(args, row, col, x, scale, inverse, static_cast<float>(scale),
              static_cast<float>(scale));
      }
    } else {
      const long long columns = kEmit == kEmitOperand8 ? (args.k + 15) / 16 * 16 : args.k;
      for (long long base = 0; base < columns; base += kThreads) {
        const long long col = base + threadIdx.x;
        const bool valid = col < args.k;
        const float x = valid ? load_half<kInput>(input, col) : 0.0f;
        emit(args, row, col, valid, x, scale, inverse, static_cast<float>(scale),
             static_cast<float>(scale));
      }
    }
    __syncthreads();  // shared_scale and warp_absmax are reused by the next row
  }

  // Cells of G values: ceil(k / G) per row, the last one partial when G does not divide k
  // (its scale from the values it has, as on the host). A lane walks its elements of the cell
  // whether or not they exist, so that the warp stays together for the shuffles; elements at
  // col >= k are neither read nor written (emit pairs a 4-bit code with col + 1 only below k).
  // How lanes share a cell: short_cell_walk (util/utility_args.cuh). Width 8 reads its first
  // kShortCellHeldRuns runs once, all loads issued before the first use, and keeps them for the
  // emission; runs past them (cells of more than 4 · 32 runs) are read again there.
  template <int kThreads, int kWidth>
  __device__ static void short_cells(const QuantizeActivationArgs& args, long long row,
                                     const unsigned short* input, double tensor_scale) {
    const long long group = args.group;
    const ShortCellWalk walk = short_cell_walk(group, kWidth);
    // Runs a lane holds (width 8): NV's cells of 16 values have 2.
    constexpr int kHeld = kScaling == kScaleNv ? 2 : kShortCellHeldRuns;
    const int lanes = walk.lanes;
    const long long per_lane = walk.per_lane;
    const long long step = static_cast<long long>(lanes) * kWidth;  // between a lane's runs
    const int lane = threadIdx.x % 32, sub = lane % lanes;
    // Cell indices in 32 bits: k < 2^31 (quantize_activation_args).
    const int cells = static_cast<int>((args.k + group - 1) / group);
    // The warp's number among the row's warps (those of the gridDim.y blocks sharing it).
    const int warp = static_cast<int>(blockIdx.y * (kThreads / 32) + threadIdx.x / 32);
    const int cell_stride = static_cast<int>(gridDim.y * (kThreads / 32)) * walk.cells_per_warp;
    for (int first = warp * walk.cells_per_warp; first < cells; first += cell_stride) {
      const long long cell = first + lane / lanes;
      const long long begin = cell * group + sub * kWidth;
      // The lane's runs begin + i · step exist (col < k; a run wholly, k being a multiple of
      // kWidth) for i < present: all per_lane of them but in the last cell, none past it (it
      // starts at or past k). Counted once per cell (a 64-bit compare per element made ptxas
      // spill 8-12 bytes for sm_90a).
      const long long ahead = args.k - begin;
      const int present = ahead >= group ? static_cast<int>(per_lane)
                          : ahead <= 0   ? 0
                                         : static_cast<int>((ahead + step - 1) / step);
      float absmax = 0.0f;
      [[maybe_unused]] uint4 held[kHeld];
      if constexpr (kWidth == 8) {
#pragma unroll
        for (int i = 0; i < kHeld; ++i)
          held[i] = i < present ? *reinterpret_cast<const uint4*>(input + begin + i * step)
                                : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int i = 0; i < kHeld; ++i) {
          float x[8];
          unpack_half8<kInput>(held[i], x);
#pragma unroll
          for (int e = 0; e < 8; ++e) absmax = fmaxf(absmax, fabsf(x[e]));
        }
#pragma unroll 1
        for (int i = kHeld; i < present; ++i) {
          float x[8];
          load_half8<kInput>(input, begin + i * step, x);
#pragma unroll
          for (int e = 0; e < 8; ++e) absmax = fmaxf(absmax, fabsf(x[e]));
        }
      } else {
#pragma unroll 4
        for (long long i = 0; i < per_lane; ++i)
          if (i < present)
            absmax = fmaxf(absmax, fabsf(load_half<kInput>(input, begin + i * step)));
      }
      for (int offset = lanes / 2; offset > 0; offset >>= 1)
        absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
      const double scale =
          cell_scale<kScaling, kScaleFormat>(absmax, args.element_max, tensor_scale);
      if constexpr (kEmit == kEmitCodes || kEmit == kEmitOperand8) {
        if (cell < cells && sub == 0)
          store_scale<kScaleFormat>(
              args.scales, row * args.scale_row_stride + cell * args.scale_cell_stride, scale);
      }
      const double divisor = scale * tensor_scale;
      const QuotientInverse inverse = quotient_inverse(divisor);
      const float factor = row_factor<kScaling>(1.0f, static_cast<float>(tensor_scale));
      if constexpr (kWidth == 8) {
#pragma unroll
        for (int i = 0; i < kHeld; ++i) {
          if (i < present) {
            float x[8];
            unpack_half8<kInput>(held[i], x);
            emit8(args, row, begin + i * step, x, divisor, inverse, static_cast<float>(scale),
                  factor);
          }
        }
#pragma unroll 1
        for (int i = kHeld; i < present; ++i) {
          float x[8];
          load_half8<kInput>(input, begin + i * step, x);
          emit8(args, row, begin + i * step, x, divisor, inverse, static_cast<float>(scale),
                factor);
        }
      } else {
        for (long long i = 0; i < per_lane; ++i) {
          const long long col = begin + i * step;
          const bool valid = i < present;
          const float x = valid ? load_half<kInput>(input, col) : 0.0f;
          emit(args, row, col, valid, x, divisor, inverse, static_cast<float>(scale), factor);
        }
      }
    }
    if (threadIdx.x == 0 && blockIdx.y == 0) {
      if constexpr (kEmit == kEmitOperand) {
        args.row_factors[row] =
            args.fold_row_factors ? 1.0f
                                  : row_factor<kScaling>(1.0f, static_cast<float>(tensor_scale));
      } else if constexpr (kScaling == kScaleNv) {
        if (row == 0) *args.tensor_scale = static_cast<float>(tensor_scale);
      }
    }
  }
};

template <int kWidth>
struct Width {
  static constexpr int value = kWidth;
};

template <unsigned long long kCode, int kScaling, unsigned long long kScaleFormat, int kInput,
          int kEmit, int kOperand, int kThreads, int kDynamicSmemBytes>
// A minimum of 1024 threads' worth of blocks an SM, i.e. 64 registers a thread: with the
// thread count alone ptxas picked 48 registers for some instantiations and spilled.
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    quantize_activation_kernel(QuantizeActivationArgs args) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  static_assert(kDynamicSmemBytes == 0, "quantize_activation uses static shared memory only");
  using Quantizer = ActivationQuantizer<kCode, kScaling, kScaleFormat, kInput, kEmit, kOperand>;
  __shared__ float warp_absmax[kThreads / 32];
  __shared__ double shared_scale;
  const double tensor_scale =
      kScaling == kScaleNv ? nv_tensor_scale(*args.tensor_absmax, args.nv_denominator) : 1.0;
  auto rows = [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    for (long long row = blockIdx.x; row < args.m; row += gridDim.x) {
      const unsigned short* input = args.input + row * args.lda;
      if constexpr (kScaling == kScaleStatic || kScaling == kScaleToken) {
        Quantizer::template row_wide<kThreads, kWidth>(args, row, input, warp_absmax,
                                                      &shared_scale);
      } else {
        Quantizer::template short_cells<kThreads, kWidth>(args, row, input, tensor_scale);
      }
    }
  };
  if constexpr (kEmit != kEmitOperand8) {
    if (args.vector8) {
      rows(Width<8>{});
      return;
    }
  }
  rows(Width<1>{});
}

// Quantized activations given in the canonical packed form -> the 16-bit operand and row
// factors (operand mode above), or (kOperand = kOperandBytes) the 8-bit codes in the 8-bit mma's
// K order (operand8 mode above), one thread per element, grid-stride.
constexpr int kOperandBytes = 2;  // after HalfTypeCode's bf16, fp16

template <unsigned long long kCode, int kScaling, unsigned long long kScaleFormat, int kOperand,
          int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) expand_activation_kernel(ExpandActivationArgs args) {
  constexpr FormatCode code_format = FormatCode::unpack(kCode);
  constexpr bool kBytes = kOperand == kOperandBytes;
  static_assert(code_format.bits == 8 || code_format.bits == 4, "activation codes of 4 or 8 bits");
  static_assert(!kBytes || (code_format.bits == 8 && (kScaling == kScaleStatic ||
                                                      kScaling == kScaleToken ||
                                                      kScaling == kScaleGroup)),
                "the 8-bit operand holds 8-bit codes of one scale per row, or per group (whose "
                "canonical scales the GEMM reads as they are)");
  static_assert(kDynamicSmemBytes == 0, "expand_activation uses no shared memory");
  // operand8 rows run to a whole 16, positions past k written as 0.
  const long long columns = kBytes ? (args.k + 15) / 16 * 16 : args.k;
  const long long total = args.m * columns;
  const long long row_bytes = (args.k * code_format.bits + 7) / 8;
  // Scale cells per row: ceil(k / group), the last one partial when the group does not divide k.
  const long long cells = kScaling == kScaleStatic || kScaling == kScaleToken
                              ? 1
                              : (args.k + args.group - 1) / args.group;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const long long row = index / columns, col = index - row * columns;
    if constexpr (kBytes) {
      args.operand8[row * args.ldo + MmaWeightLayout::operand8_position(static_cast<int>(col))] =
          col < args.k ? args.codes[row * row_bytes + col] : 0u;
      if constexpr (kScaling != kScaleGroup) {
        if (col == 0)
          args.row_factors[row] = row_factor<kScaling>(
              load_scale<kScaleFormat>(args.scales, kScaling == kScaleToken ? row : 0), 1.0f);
      }
      continue;
    }
    unsigned code = args.codes[row * row_bytes + col * code_format.bits / 8];
    if constexpr (code_format.bits == 4) code = (code >> (col % 2 * 4)) & 15u;
    long long cell = 0;
    if constexpr (kScaling == kScaleToken) cell = row;
    if constexpr (kScaling == kScaleGroup || kScaling == kScaleMx || kScaling == kScaleNv)
      cell = row * cells + col / args.group;
    const float scale = load_scale<kScaleFormat>(args.scales, cell);
    const float factor = row_factor<kScaling>(scale, args.tensor_scale);
    args.operand[row * args.ldo + col] = operand_bits<kCode, kScaling, kOperand>(
        code, scale, args.fold_row_factors ? factor : 1.0f);
    if (col == 0) args.row_factors[row] = args.fold_row_factors ? 1.0f : factor;
  }
}

// absmax over a [m, k] bf16/fp16 tensor into *absmax (zeroed by the caller): a block reduction,
// then one atomicMax on the bits (non-negative floats order as their bit patterns).
template <int kInput, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) tensor_absmax_kernel(TensorAbsmaxArgs args) {
  static_assert(kDynamicSmemBytes == 0, "tensor_absmax uses static shared memory only");
  __shared__ float warp_absmax[kThreads / 32];
  float absmax = 0.0f;
  const long long total = args.m * args.k;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const long long row = index / args.k, col = index - row * args.k;
    absmax = fmaxf(absmax, fabsf(load_half<kInput>(args.input, row * args.lda + col)));
  }
  absmax = block_absmax<kThreads>(absmax, warp_absmax);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned*>(args.absmax), __float_as_uint(absmax));
}

}  // namespace qgemm::kernels
