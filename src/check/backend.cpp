#include "check/backend.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"

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

// The GPU backend plugs in here (issue 4): nullptr while the library has none.
std::unique_ptr<GemmBackend> make_gpu_backend() { return nullptr; }

constexpr const char* kNoGpuPath = "the GPU GEMM path is not built yet (issue 4)";

}  // namespace

std::unique_ptr<GemmBackend> make_cpu_backend() { return std::make_unique<CpuReferenceBackend>(); }

GpuProbe probe_gpu() {
  // The handle stays open on purpose: unloading a driver after cuInit is not supported, and the
  // runtime loads the same library again (dlopen reference-counts it).
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    const char* why = dlerror();
    return {false, why != nullptr ? why : "libcuda.so.1 could not be loaded"};
  }
  using CuInit = int (*)(unsigned int);
  using CuDeviceGetCount = int (*)(int*);
  auto cu_init = reinterpret_cast<CuInit>(dlsym(driver, "cuInit"));
  auto cu_device_get_count = reinterpret_cast<CuDeviceGetCount>(dlsym(driver, "cuDeviceGetCount"));
  if (cu_init == nullptr || cu_device_get_count == nullptr)
    return {false, "libcuda.so.1 lacks cuInit/cuDeviceGetCount"};
  if (const int status = cu_init(0); status != 0)
    return {false, fmt::format("cuInit failed with CUresult {}", status)};
  int devices = 0;
  if (const int status = cu_device_get_count(&devices); status != 0)
    return {false, fmt::format("cuDeviceGetCount failed with CUresult {}", status)};
  if (devices < 1) return {false, "the driver reports no CUDA device"};
  return {true, fmt::format("{} CUDA device(s)", devices)};
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
  if (choice == BackendChoice::Gpu) {
    if (!gpu.usable)
      throw Error(ErrorCode::NoDevice,
                  fmt::format("gpu backend: no usable GPU/driver ({})", gpu.detail));
    auto backend = make_gpu_backend();
    if (!backend)
      throw Error(ErrorCode::Unsupported,
                  fmt::format("gpu backend: {} found, but {}", gpu.detail, kNoGpuPath));
    return {std::move(backend), gpu.detail};
  }
  if (!gpu.usable) return {make_cpu_backend(), fmt::format("no GPU: {}", gpu.detail)};
  if (auto backend = make_gpu_backend()) return {std::move(backend), gpu.detail};
  return {make_cpu_backend(), fmt::format("{} found, but {}", gpu.detail, kNoGpuPath)};
}

}  // namespace qgemm::check
