// The GLU between an expert's gate_up and down GEMMs (include/qgemm/moe.hpp, GluKind), defined
// once for the glue kernel's own pass (moe/glue.cuh) and for the grouped GEMMs that apply it in
// their epilogue (gemm/sm80_decode.cuh, gemm/sm90_wgmma.cuh): both paths give the same bits from
// the same gate and up values.
#pragma once

#include "moe/glue_args.cuh"

namespace qgemm::kernels {

// kind: MoeGluKind; alpha and limit: ClampedSwiglu's.
__device__ __forceinline__ float apply_glu(int kind, float gate, float up, float alpha,
                                           float limit) {
  if (kind == kGluSilu) return gate / (1.0f + __expf(-gate)) * up;
  if (kind == kGluGelu) return 0.5f * gate * (1.0f + erff(gate * 0.70710678118654752f)) * up;
  gate = fminf(gate, limit);
  up = fminf(fmaxf(up, -limit), limit);
  return gate / (1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

}  // namespace qgemm::kernels
