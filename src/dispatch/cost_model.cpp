#include "dispatch/cost_model.hpp"

namespace qgemm::dispatch {

GpuRates GpuRates::of(const GpuLimits& gpu) {
  GpuRates rates;  // the H200's (132 SMs)
  // Datasheet ratios for the other targets (leads until a machine of that kind is measured):
  // memory bandwidth, dense bf16 and fp8 tensor rates relative to the H200.
  double bandwidth = 1, bf16 = 1, fp8 = 1, sms = 132;
  switch (gpu.arch) {
    case jit::Arch::sm_75: bandwidth = 0.14, bf16 = 0.07, fp8 = 0, sms = 40; break;
    case jit::Arch::sm_80: bandwidth = 0.42, bf16 = 0.32, fp8 = 0, sms = 108; break;
    case jit::Arch::sm_86: bandwidth = 0.19, bf16 = 0.08, fp8 = 0, sms = 84; break;
    case jit::Arch::sm_89: bandwidth = 0.18, bf16 = 0.37, fp8 = 0.37, sms = 142; break;
    case jit::Arch::sm_90a: break;
    case jit::Arch::sm_100a: bandwidth = 1.67, bf16 = 2.3, fp8 = 2.3, sms = 148; break;
    case jit::Arch::sm_120a: bandwidth = 0.37, bf16 = 0.21, fp8 = 0.21, sms = 170; break;
  }
  // The rates scale with the SM count of this GPU against its target's usual one.
  const double sm_share = gpu.sm_count > 0 ? gpu.sm_count / sms : 1.0;
  rates.copy_gbps *= bandwidth;
  rates.bf16_tflops *= bf16 * sm_share;
  rates.fp8_tflops *= fp8 * sm_share;
  rates.decode_tflops_16 *= bf16 * sm_share;
  rates.tiled_tflops_base *= bf16 * sm_share;
  rates.tiled_tflops_per_m_tile *= bf16 * sm_share;
  return rates;
}

}  // namespace qgemm::dispatch
