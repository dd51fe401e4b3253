// The GPU twin of repack_for_mma: gemm/mma_repack.cuh from the canonical packed weight on the
// device into zero-filled outputs.
#pragma once

#include <cuda.h>

#include <cstdint>

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

// The canonical arrays of a weight in device memory (zeros 0 when it stores none).
struct CanonicalOnDevice {
  CUdeviceptr codes = 0, scales = 0, zeros = 0;
};

// In the current context, on `stream`; returns after the repack has finished. `weight`
// describes the weight (its quantization, shape and global scale: its host arrays may be
// empty); `source` holds its arrays on the device. The metadata's scale flags are computed
// there, as the host's mma_metadata computes them. glu_inter = I > 0: a gate_up weight
// (N = 2·I) whose rows are interleaved for a fused GLU (kernels::glu_source_row).
MmaDeviceWeight repack_for_mma_on_device(const PackedWeight& weight,
                                         const CanonicalOnDevice& source, jit::Arch arch,
                                         CUstream stream, FragmentOrder order = FragmentOrder::Mma,
                                         std::int64_t glu_inter = 0);
// The same from a whole packed weight on the host, uploaded first (temporary device memory of
// its own size, freed on return).
MmaDeviceWeight repack_for_mma_on_device(const PackedWeight& weight, jit::Arch arch,
                                         CUstream stream, FragmentOrder order = FragmentOrder::Mma,
                                         std::int64_t glu_inter = 0);

}  // namespace qgemm::layout
