// Warp-level tensor-core instructions: ldmatrix and mma.sync m16n8k16 (SM80+; on SM75, fp16
// only, as two m16n8k8 over the k halves: a0, a1 with b0, then a2, a3 with b1).
//
// mma.m16n8k16 fragments (lane = 0..31, g = lane / 4, t = lane % 4), 16-bit operands:
//   A (16x16, row)  a0 = (row g,   k 2t..2t+1)   a1 = (row g+8, k 2t..2t+1)
//                   a2 = (row g,   k 2t+8..+9)   a3 = (row g+8, k 2t+8..+9)
//   B (16x8, col)   b0 = (k 2t..2t+1, col g)     b1 = (k 2t+8..2t+9, col g)
//   C (16x8, f32)   c0,c1 = (row g, col 2t..2t+1)   c2,c3 = (row g+8, col 2t..2t+1)
// Each 32-bit register holds two 16-bit values, the lower k (or col) in the low half.
#pragma once

namespace qgemm::ptx {

// Four 8x8 matrices of 16-bit values; lane i gives the address of row (i % 8) of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}

// Two 8x8 b16 matrices: lanes 0-7 address the rows of the first, lanes 8-15 those of the second.
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address));
}

template <bool kBf16>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
#endif
  }
}

// Two fp32 values -> one register of two 16-bit values (lo = first), rounding to nearest even.
template <bool kBf16>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
  unsigned packed;
  if constexpr (kBf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  } else {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
#else
    unsigned short low, high;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(low) : "f"(lo));
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(high) : "f"(hi));
    packed = static_cast<unsigned>(low) | static_cast<unsigned>(high) << 16;
#endif
  }
  return packed;
}

}  // namespace qgemm::ptx
