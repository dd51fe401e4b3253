// The MoE glue around a grouped GEMM over the indexed layout (moe/routing_args.cuh): gather the
// routed tokens' rows into expert order before it, combine the experts' rows per token after it
// (the router-weighted top-k sum), and the GLU between an expert's two GEMMs. Each is one
// grid-stride pass of a block per row and its threads along the row (16-byte pieces where the
// rows allow), and reads every size it needs from the device (graph-capturable).
#pragma once

#include "moe/glu.cuh"
#include "moe/glue_args.cuh"
#include "ptx/convert.cuh"

namespace qgemm::kernels {

template <int kType>
__device__ __forceinline__ float moe_load(const void* base, long long index) {
  if constexpr (kType == kMoeFp32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == kMoeBf16) {
    return ptx::bf16_bits_to_float(static_cast<const unsigned short*>(base)[index]);
  } else {
    return ptx::fp16_bits_to_float(static_cast<const unsigned short*>(base)[index]);
  }
}

template <int kType>
__device__ __forceinline__ void moe_store(void* base, long long index, float value) {
  if constexpr (kType == kMoeFp32) {
    static_cast<float*>(base)[index] = value;
  } else if constexpr (kType == kMoeBf16) {
    static_cast<unsigned short*>(base)[index] = ptx::float_to_bf16_bits(value);
  } else {
    static_cast<unsigned short*>(base)[index] = ptx::float_to_fp16_bits(value);
  }
}

// Block per position (grid-stride over rows: no index division per element), its threads
// along the row: 16-bit rows copied as they are, 16 bytes at a time where every row is 16-byte
// aligned (columns and both strides multiples of 8, 16-byte aligned bases).
template <int kThreads>
__device__ void moe_gather(const MoeGlueArgs& args) {
  const long long total = args.offsets[args.local_experts];
  const long long slots = args.tokens * args.top_k;
  auto* out = static_cast<unsigned short*>(args.rows_out);
  const bool vectors = ((args.columns | args.ld_input | args.ld_rows) % 8 == 0) &&
                       ((reinterpret_cast<unsigned long long>(args.input) |
                         reinterpret_cast<unsigned long long>(out)) % 16 == 0);
  for (long long p = blockIdx.x; p < total; p += gridDim.x) {
    const long long slot = args.sorted_slots[p];
    unsigned short* to = out + p * args.ld_rows;
    if (slot >= slots) {  // padding: a zero row
      for (long long c = threadIdx.x; c < args.columns; c += kThreads) to[c] = 0;
      continue;
    }
    const unsigned short* from = args.input + slot / args.top_k * args.ld_input;
    if (vectors) {
      for (long long c = threadIdx.x * 8; c < args.columns; c += kThreads * 8)
        *reinterpret_cast<uint4*>(to + c) = *reinterpret_cast<const uint4*>(from + c);
    } else {
      for (long long c = threadIdx.x; c < args.columns; c += kThreads) to[c] = from[c];
    }
  }
}

// Block per token (grid-stride), threads along the row: the top_k rows summed in fp32 in
// choice order.
template <int kRows, int kOut, int kThreads>
__device__ void moe_combine(const MoeGlueArgs& args) {
  for (long long t = blockIdx.x; t < args.tokens; t += gridDim.x) {
    for (long long c = threadIdx.x; c < args.columns; c += kThreads) {
      float sum = 0.0f;
      for (int j = 0; j < args.top_k; ++j) {
        const long long slot = t * args.top_k + j;
        const int p = args.slot_positions[slot];
        if (p >= 0)
          sum = fmaf(args.weights != nullptr ? args.weights[slot] : 1.0f,
                     moe_load<kRows>(args.rows, p * args.ld_rows + c), sum);
      }
      moe_store<kOut>(args.output, t * args.ld_output + c, sum);
    }
  }
}

// Block per position below the padded total (grid-stride; padding rows are computed too: their
// gate_up rows are the GEMM's, of zero inputs plus bias), threads along the row.
template <int kRows, int kOut, int kThreads>
__device__ void moe_glu(const MoeGlueArgs& args) {
  const long long total = args.offsets[args.local_experts];
  for (long long p = blockIdx.x; p < total; p += gridDim.x)
    for (long long c = threadIdx.x; c < args.columns; c += kThreads) {
      const float gate = moe_load<kRows>(args.rows, p * args.ld_rows + c);
      const float up = moe_load<kRows>(args.rows, p * args.ld_rows + args.columns + c);
      const float h = apply_glu(args.glu_kind, gate, up, args.glu_alpha, args.glu_limit);
      moe_store<kOut>(args.rows_out, p * args.ld_output + c, h);
    }
}

template <int kStep, int kRows, int kOut, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) moe_glue_kernel(MoeGlueArgs args) {
  static_assert(kDynamicSmemBytes == 0, "moe_glue uses no shared memory");
  if constexpr (kStep == kMoeGather) {
    moe_gather<kThreads>(args);
  } else if constexpr (kStep == kMoeGlu) {
    moe_glu<kRows, kOut, kThreads>(args);
  } else {
    moe_combine<kRows, kOut, kThreads>(args);
  }
}

}  // namespace qgemm::kernels
