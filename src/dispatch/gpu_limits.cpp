#include "dispatch/gpu_limits.hpp"

namespace qgemm::dispatch {

GpuLimits GpuLimits::of_arch(jit::Arch arch, int sm_count) {
  GpuLimits limits;
  limits.arch = arch;
  limits.sm_count = sm_count;
  constexpr int kKiB = 1024;
  switch (arch) {
    case jit::Arch::sm_75:
      limits.shared_per_block = 64 * kKiB, limits.shared_per_sm = 64 * kKiB;
      break;
    case jit::Arch::sm_80:
      limits.shared_per_block = 163 * kKiB, limits.shared_per_sm = 164 * kKiB;
      break;
    case jit::Arch::sm_86:
    case jit::Arch::sm_89:
    case jit::Arch::sm_120a:
      limits.shared_per_block = 99 * kKiB, limits.shared_per_sm = 100 * kKiB;
      break;
    case jit::Arch::sm_90a:
    case jit::Arch::sm_100a:
      limits.shared_per_block = 227 * kKiB, limits.shared_per_sm = 228 * kKiB;
      break;
  }
  return limits;
}

GpuLimits GpuLimits::of_device(const runtime::DeviceInfo& device) {
  GpuLimits limits = of_arch(jit::arch_for_device(device.major, device.minor), device.sm_count);
  if (device.shared_per_block_optin > 0) limits.shared_per_block = device.shared_per_block_optin;
  if (device.shared_per_sm > 0) limits.shared_per_sm = device.shared_per_sm;
  return limits;
}

}  // namespace qgemm::dispatch
