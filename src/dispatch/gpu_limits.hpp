// What the dispatcher needs to know about the GPU a call runs on: its target, SM count and
// shared-memory limits. A config whose shared memory exceeds the per-block limit cannot launch
// there, and resident blocks per SM follow the per-SM limit, so both come from the device
// (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN / _PER_MULTIPROCESSOR); of_arch gives
// the CUDA programming guide's values of an architecture for tests and offline planning.
#pragma once

#include "jit/kernel_spec.hpp"
#include "runtime/driver.hpp"

namespace qgemm::dispatch {

struct GpuLimits {
  jit::Arch arch = jit::Arch::sm_90a;
  int sm_count = 132;
  int shared_per_block = 227 * 1024;  // the opt-in maximum of one block
  int shared_per_sm = 228 * 1024;

  // sm_75: 64 KB per block and per SM; sm_80: 163 / 164 KB; sm_86, sm_89, sm_120a: 99 / 100 KB;
  // sm_90a, sm_100a: 227 / 228 KB.
  static GpuLimits of_arch(jit::Arch arch, int sm_count);
  static GpuLimits of_device(const runtime::DeviceInfo& device);
};

}  // namespace qgemm::dispatch
