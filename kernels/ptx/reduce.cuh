// Reductions into global memory (no return value): the split-K partial sums.
#pragma once

namespace qgemm::ptx {

// at[0..3] += {a, b, c, d} as one 16-byte reduction (sm_90+; `at` 16-byte aligned). Each
// element is added atomically; the four are not one atomic unit.
__device__ __forceinline__ void reduce_add_v4(float* at, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

}  // namespace qgemm::ptx
