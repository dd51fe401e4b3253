#include "check/backend.hpp"

#include <fmt/format.h>

#include "common/log.hpp"
#include "jit/catalog.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"

namespace qgemm::check {
namespace {

class CpuReferenceBackend final : public GemmBackend {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "CPU reference: exact dequantization, double multiply, one rounding";
  }
  bool is_reference() const override { return true; }
  std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a,
                           const PackedWeight& w) override {
    return reference::gemm(scheme, a, w);
  }
};

// qgemm::Engine on device 0: upload A, run, download C.
class GpuEngineBackend final : public GemmBackend {
 public:
  GpuEngineBackend() : engine_(0) {}
  std::string name() const override { return "gpu"; }
  std::string description() const override {
    return fmt::format("GPU: qgemm::Engine on device {} ({} SMs)", engine_.device(),
                       engine_.sm_count());
  }
  bool is_reference() const override { return false; }
  BackendPrecision precision() const override { return {operand_format_, formats::fp32}; }
  std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a,
                           const PackedWeight& w) override {
    const QuantWeight weight = engine_.prepare_weight(w);
    runtime::DeviceBuffer a_device = runtime::DeviceBuffer::from(a.codes), scales;
    const Format out = scheme.output;
    runtime::DeviceBuffer c_device(static_cast<std::size_t>(a.m * w.n) * out.storage_bytes());
    c_device.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails the check
    const DeviceMatrix c_matrix{c_device.as<void>(), a.m, w.n, w.n, out};
    if (a.quant.is_quantized()) {
      // The quantized codes and scales as they are: the GEMM sees exactly what the reference
      // dequantizes, through the 16-bit operand of jit::activation_operand_format; for a bf16
      // output, dequantize + cuBLAS rounds the row factors into a bf16 operand
      // (dispatch::qdq_folds_row_factors).
      operand_format_ = out == formats::bf16 && jit::activation_row_factor(a.quant)
                            ? formats::bf16
                            : jit::activation_operand_format(a.quant);
      scales = runtime::DeviceBuffer::from(a.scales);
      engine_.gemm(DeviceActivation{a.quant, a_device.as<void>(), scales.as<void>(), a.m, a.k,
                                    a.tensor_scale},
                   weight, c_matrix, nullptr);
    } else {
      operand_format_ = a.quant.format;
      engine_.gemm({a_device.as<void>(), a.m, a.k, a.k, a.quant.format}, weight, c_matrix, nullptr);
    }
    std::vector<double> c(static_cast<std::size_t>(a.m * w.n));
    if (out == formats::fp32) {
      const auto host = c_device.to_vector<float>(c.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = host[i];
    } else {
      const auto host = c_device.to_vector<std::uint16_t>(c.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = decode(out, host[i]);
    }
    return c;
  }

 private:
  Engine engine_;
  Format operand_format_ = formats::bf16;
};

}  // namespace

std::unique_ptr<GemmBackend> make_cpu_backend() { return std::make_unique<CpuReferenceBackend>(); }

GpuProbe probe_gpu() {
  std::string why;
  if (!runtime::Driver::available(&why)) return {false, why};
  const int devices = runtime::device_count();
  if (devices < 1) return {false, "the driver reports no CUDA device"};
  const runtime::DeviceInfo info = runtime::device_info(0);
  return {true, fmt::format("{} CUDA device(s), device 0: {}", devices, info.name)};
}

BackendChoice parse_backend_choice(std::string_view text) {
  if (text == "auto") return BackendChoice::Auto;
  if (text == "cpu") return BackendChoice::Cpu;
  if (text == "gpu") return BackendChoice::Gpu;
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("backend '{}' is not a backend (rule: auto, cpu or gpu)", text));
}

BackendSelection select_backend(BackendChoice choice) {
  if (choice == BackendChoice::Cpu) return {make_cpu_backend(), "asked for"};
  const GpuProbe gpu = probe_gpu();
  if (choice == BackendChoice::Gpu && !gpu.usable)
    throw Error(ErrorCode::NoDevice,
                fmt::format("gpu backend: no usable GPU/driver ({})", gpu.detail));
  if (!gpu.usable) return {make_cpu_backend(), fmt::format("no GPU: {}", gpu.detail)};
  return {std::make_unique<GpuEngineBackend>(), gpu.detail};
}

}  // namespace qgemm::check
