// The MoE glue around a grouped GEMM over the indexed layout (moe/routing_args.cuh): gather the
// routed tokens' rows into expert order before it, combine the experts' rows per token after it
// (the router-weighted top-k sum), and the GLU between an expert's two GEMMs. Each is one
// grid-stride pass, a thread per element (16-byte
// pieces are the next step once they are measured), and read every size they need from the
// device (graph-capturable).
#pragma once

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

// Thread per (position, column): 16-bit rows copied as they are (no conversion).
template <int kThreads>
__device__ void moe_gather(const MoeGlueArgs& args) {
  const long long total = args.offsets[args.local_experts];
  const long long slots = args.tokens * args.top_k;
  const long long items = total * args.columns;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  auto* out = static_cast<unsigned short*>(args.rows_out);
  for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < items;
       i += stride) {
    const long long p = i / args.columns, c = i - p * args.columns;
    const long long slot = args.sorted_slots[p];
    out[p * args.ld_rows + c] = slot < slots ? args.input[slot / args.top_k * args.ld_input + c]
                                             : static_cast<unsigned short>(0);
  }
}

// Thread per (token, column): the top_k rows summed in fp32 in choice order.
template <int kRows, int kOut, int kThreads>
__device__ void moe_combine(const MoeGlueArgs& args) {
  const long long items = args.tokens * args.columns;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < items;
       i += stride) {
    const long long t = i / args.columns, c = i - t * args.columns;
    float sum = 0.0f;
    for (int j = 0; j < args.top_k; ++j) {
      const long long slot = t * args.top_k + j;
      const int p = args.slot_positions[slot];
      if (p >= 0)
        sum = fmaf(args.weights[slot], moe_load<kRows>(args.rows, p * args.ld_rows + c), sum);
    }
    moe_store<kOut>(args.output, t * args.ld_output + c, sum);
  }
}

// Thread per (position, column) of the activation's output, below the padded total (padding
// rows are computed too: their gate_up rows are the GEMM's, of zero inputs plus bias).
template <int kRows, int kOut, int kThreads>
__device__ void moe_glu(const MoeGlueArgs& args) {
  const long long total = args.offsets[args.local_experts];
  const long long items = total * args.columns;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < items;
       i += stride) {
    const long long p = i / args.columns, c = i - p * args.columns;
    float gate = moe_load<kRows>(args.rows, p * args.ld_rows + c);
    float up = moe_load<kRows>(args.rows, p * args.ld_rows + args.columns + c);
    float h;
    if (args.glu_kind == kGluSilu) {
      h = gate / (1.0f + __expf(-gate)) * up;
    } else if (args.glu_kind == kGluGelu) {
      h = 0.5f * gate * (1.0f + erff(gate * 0.70710678118654752f)) * up;
    } else {
      gate = fminf(gate, args.glu_limit);
      up = fminf(fmaxf(up, -args.glu_limit), args.glu_limit);
      h = gate / (1.0f + __expf(-args.glu_alpha * gate)) * (up + 1.0f);
    }
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
