// Warp-level tensor-core instructions: ldmatrix, stmatrix (SM90+) and mma.sync m16n8k16 (SM80+; on SM75, fp16
// only, as two m16n8k8 over the k halves: a0, a1 with b0, then a2, a3 with b1).
//
// mma.m16n8k16 fragments (lane = 0..31, g = lane / 4, t = lane % 4), 16-bit operands:
//   A (16x16, row)  a0 = (row g,   k 2t..2t+1)   a1 = (row g+8, k 2t..2t+1)
//                   a2 = (row g,   k 2t+8..+9)   a3 = (row g+8, k 2t+8..+9)
//   B (16x8, col)   b0 = (k 2t..2t+1, col g)     b1 = (k 2t+8..2t+9, col g)
//   C (16x8, f32)   c0,c1 = (row g, col 2t..2t+1)   c2,c3 = (row g+8, col 2t..2t+1)
// Each 32-bit register holds two 16-bit values, the lower k (or col) in the low half.
//
// mma.m16n8k32, 8-bit operands (s8 x u8 -> s32 from SM80, e4m3 x e4m3 -> f32 from SM89): the
// same registers, each holding 4 consecutive k (the lowest in the low byte):
//   A (16x32, row)  a0 = (row g, k 4t..4t+3)   a1 = (row g+8, k 4t..)
//                   a2 = (row g, k 16+4t..)    a3 = (row g+8, k 16+4t..)
//   B (32x8, col)   b0 = (k 4t..4t+3, col g)   b1 = (k 16+4t..16+4t+3, col g)
//   C               as above (s32 or f32)
// so ldmatrix.x4 over 16 rows x 32 bytes gives the A fragment exactly as it does for k16.
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

// The inverse of ldmatrix_x4 (SM90+): lane i gives the address of row (i % 8) of matrix i / 8,
// and r[j] of every lane is its (row g, k 2t..2t+1) pair of matrix j, so an A fragment
// {a0, a1, a2, a3} lands as rows 0-7 / 8-15 × k 0-7 / 8-15 (matrices 0, 1, 2, 3).
__device__ __forceinline__ void stmatrix_x4(unsigned shared_address, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(
                   shared_address),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// stmatrix with .trans: lane i gives the address of row (i % 8) of stored matrix i / 8, and
// r[j] of every lane is its (row g, cols 2t..2t+1) pair of matrix j, stored transposed: stored
// row c holds column c of the fragment's matrix (an accumulator tile written token-major).
__device__ __forceinline__ void stmatrix_x4_trans(unsigned shared_address,
                                                  const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(
                   shared_address),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void stmatrix_x2_trans(unsigned shared_address,
                                                  const unsigned (&r)[2]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1,%2};\n" ::"r"(
                   shared_address),
               "r"(r[0]), "r"(r[1])
               : "memory");
}
__device__ __forceinline__ void stmatrix_x1_trans(unsigned shared_address, unsigned r) {
  asm volatile("stmatrix.sync.aligned.m8n8.x1.trans.shared.b16 [%0], {%1};\n" ::"r"(shared_address),
               "r"(r)
               : "memory");
}

// 16 bytes of shared memory (a staged row piece read back).
__device__ __forceinline__ uint4 load_shared_16(unsigned shared_address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(shared_address)
               : "memory");
  return v;
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

// s8 activations (A) times u8 codes (B), exact s32 sums.
__device__ __forceinline__ void mma_m16n8k32_s8u8(int (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                  unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// e4m3 activations times e4m3 codes, f32 sums (SM89+; the host never asks for it below).
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&c)[4], const unsigned (&a)[4],
                                                  unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Two fp16 values (a register) -> two e4m3 codes in the low 16 bits, the low half's in the low
// byte (SM89+). The callers only convert values e4m3 holds exactly.
__device__ __forceinline__ unsigned e4m3x2_from_f16x2(unsigned pair) {
#if __CUDA_ARCH__ >= 890
  unsigned short codes;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(codes) : "r"(pair));
  return codes;
#else
  __trap();
  return 0u;
#endif
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
