// Warpgroup-level control (SM90): register reallocation between warpgroups and named barriers
// among a subset of the block's threads.
#pragma once

namespace qgemm::ptx {

// setmaxnreg: every thread of the warpgroup moves to kRegisters per thread (a multiple of 8 in
// 24 .. 256). A producer gives registers back (dec) so that the consumers can take them (inc).
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Barrier `id` (1 .. 15; 0 is __syncthreads) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace qgemm::ptx
