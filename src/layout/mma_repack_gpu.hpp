// The GPU twin of repack_for_mma: uploads the canonical packed weight (temporary device memory
// of its own size, freed on return) and runs gemm/mma_repack.cuh into zero-filled outputs.
#pragma once

#include <cuda.h>

#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::layout {

struct MmaDeviceWeight {
  MmaWeight meta;  // sizes and flags; its host arrays are empty
  runtime::DeviceBuffer words, scales, zeros;
};

// The kernel spec of the repack of `weight` for `arch`.
jit::KernelSpec mma_repack_spec(const PackedWeight& weight, jit::Arch arch,
                                FragmentOrder order = FragmentOrder::Mma);

// In the current context, on `stream`; returns after the repack has finished.
MmaDeviceWeight repack_for_mma_on_device(const PackedWeight& weight, jit::Arch arch,
                                         CUstream stream,
                                         FragmentOrder order = FragmentOrder::Mma);

}  // namespace qgemm::layout
