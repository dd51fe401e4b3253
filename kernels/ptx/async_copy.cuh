// cp.async (SM80+): global -> shared copies that bypass registers, grouped into commit groups
// so that a multistage pipeline can wait for "all but the newest N" stages. SM75 has no cp.async:
// there the copy goes through registers at once (same zero fill) and commit / wait do nothing,
// so the pipelines keep their shape and lose only the overlap of copies with compute.
//
//   cp_async_16(dst, src, bytes)   copies `bytes` (0..16) and zero-fills the rest of 16 bytes:
//                                  bytes = 0 is how out-of-bounds rows and columns are
//                                  predicated without a branch around the copy.
#pragma once

namespace qgemm::ptx {

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// A value the compiler cannot trace back to its inputs, so it keeps it in a register instead
// of recomputing it (from the thread index, say) at every use inside a loop.
__device__ __forceinline__ unsigned opaque(unsigned value) {
  unsigned held;
  asm volatile("mov.b32 %0, %1;" : "=r"(held) : "r"(value));
  return held;
}
template <typename T>
__device__ __forceinline__ const T* opaque(const T* pointer) {
  unsigned long long held;
  asm volatile("mov.b64 %0, %1;" : "=l"(held) : "l"(reinterpret_cast<unsigned long long>(pointer)));
  return reinterpret_cast<const T*>(held);
}

// Where the copied line is cached. kL2: .cg, L2 only; streamed weights are read once per call,
// so L1 would only evict the activation tiles that are reused. kL1: .ca, L1 as well, for small
// data that many warps of an SM read at about the same time (the decode kernel's activations):
// only the first of them then goes to L2.
enum class CacheIn { kL2, kL1 };

// `shared_dst` as a shared-window address (shared_address): callers that copy into the same
// stage every iteration keep it in a register instead of converting a pointer per copy.
template <CacheIn kCache = CacheIn::kL2>
__device__ __forceinline__ void cp_async_16(unsigned shared_dst, const void* global_src,
                                            int bytes) {
#if __CUDA_ARCH__ >= 800
  if constexpr (kCache == CacheIn::kL1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst),
                 "l"(global_src), "r"(bytes));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst),
                 "l"(global_src), "r"(bytes));
  }
#else
  union {
    uint4 vector;
    unsigned char byte[16];
  } chunk = {make_uint4(0u, 0u, 0u, 0u)};
  if (bytes == 16) {
    chunk.vector = *static_cast<const uint4*>(global_src);
  } else {
    for (int i = 0; i < bytes; ++i)
      chunk.byte[i] = static_cast<const unsigned char*>(global_src)[i];
  }
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(shared_dst), "r"(chunk.vector.x),
               "r"(chunk.vector.y), "r"(chunk.vector.z), "r"(chunk.vector.w));
#endif
}

__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src, int bytes) {
  cp_async_16(shared_address(shared_dst), global_src, bytes);
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace qgemm::ptx
