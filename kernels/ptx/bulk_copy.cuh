// Bulk copies (SM90+): one thread moves a contiguous run of global memory into shared memory
// through the copy engine (cp.async.bulk, the 1-D form of the tensor memory accelerator), and
// an mbarrier in shared memory counts the bytes as they land. A warp that streams a weight thus
// spends one instruction per stage on the copy instead of one cp.async per 16 bytes and lane.
//
//   barrier: 8 bytes of shared memory, 8-byte aligned; one per ring stage.
//   producer (one lane):  arrive_expect_tx(barrier, bytes); bulk_copy(dst, src, bytes, barrier)
//   consumers:            wait_parity(barrier, phase)  with phase = (uses of this stage) % 2
// Sizes and both addresses are multiples of 16 bytes.
#pragma once

namespace qgemm::ptx {

__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals));
}

// Makes initialized barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Orders this thread's earlier generic-proxy accesses of shared memory before later bulk copies
// into it (a stage is read with ld.shared, then refilled by the copy engine).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One arrival that also announces `bytes` more bytes to come on this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned barrier, unsigned bytes) {
  asm volatile(
      "{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::
          "r"(barrier),
      "r"(bytes)
      : "memory");
}

__device__ __forceinline__ void bulk_copy(unsigned shared_dst, const void* global_src,
                                          unsigned bytes, unsigned barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_dst),
      "l"(global_src), "r"(bytes), "r"(barrier)
      : "memory");
}

// The 2-D tensor form (TMA): the box at element coordinates {x (innermost), y} of the tensor
// map `map` (a __grid_constant__ parameter's address) into shared memory; elements outside the
// tensor are written as zero and still counted, so a box always delivers its full size.
__device__ __forceinline__ void tensor_copy_2d(unsigned shared_dst, const void* map, int x, int y,
                                               unsigned barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(shared_dst),
      "l"(map), "r"(x), "r"(y), "r"(barrier)
      : "memory");
}

// One plain arrival (a consumer releasing a stage).
__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile(
      "{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier)
      : "memory");
}

// Blocks until the barrier's phase of parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait_parity(unsigned barrier, unsigned phase) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT;\n"
      "}\n" ::"r"(barrier),
      "r"(phase)
      : "memory");
}

}  // namespace qgemm::ptx
