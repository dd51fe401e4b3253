#include "runtime/driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "qgemm/error.hpp"

namespace qgemm::runtime {

// Builds the Driver once; the outcome (a driver or the reason there is none) is kept.
struct DriverLoader {
  Driver driver;
  std::string failure;

  DriverLoader() {
    driver.library_ = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver.library_) {
      const char* reason = ::dlerror();
      failure = fmt::format(
          "libcuda.so.1 could not be loaded ({}): no NVIDIA driver on this "
          "machine",
          reason ? reason : "unknown reason");
      return;
    }
    // <cuda.h> maps the API names onto their current ABI versions (cuMemAlloc -> cuMemAlloc_v2,
    // ...); stringizing after macro expansion looks up exactly that versioned symbol.
#define QGEMM_STRINGIZE(x) #x
#define QGEMM_SYMBOL_NAME(x) QGEMM_STRINGIZE(x)
#define QGEMM_LOAD(name)                                                                          \
  driver.name =                                                                                   \
      reinterpret_cast<decltype(driver.name)>(::dlsym(driver.library_, QGEMM_SYMBOL_NAME(name))); \
  if (!driver.name) {                                                                             \
    failure = fmt::format("libcuda.so.1 has no {} (driver too old?)", QGEMM_SYMBOL_NAME(name));   \
    return;                                                                                       \
  }
    QGEMM_LOAD(cuInit)
    QGEMM_LOAD(cuDriverGetVersion)
    QGEMM_LOAD(cuGetErrorName)
    QGEMM_LOAD(cuGetErrorString)
    QGEMM_LOAD(cuDeviceGetCount)
    QGEMM_LOAD(cuDeviceGet)
    QGEMM_LOAD(cuDeviceGetName)
    QGEMM_LOAD(cuDeviceGetAttribute)
    QGEMM_LOAD(cuDeviceTotalMem)
    QGEMM_LOAD(cuDevicePrimaryCtxRetain)
    QGEMM_LOAD(cuDevicePrimaryCtxRelease)
    QGEMM_LOAD(cuCtxGetCurrent)
    QGEMM_LOAD(cuCtxSetCurrent)
    QGEMM_LOAD(cuCtxGetDevice)
    QGEMM_LOAD(cuCtxSynchronize)
    QGEMM_LOAD(cuModuleLoadData)
    QGEMM_LOAD(cuModuleUnload)
    QGEMM_LOAD(cuModuleGetFunction)
    QGEMM_LOAD(cuFuncSetAttribute)
    QGEMM_LOAD(cuLaunchKernel)
    QGEMM_LOAD(cuMemAlloc)
    QGEMM_LOAD(cuMemGetInfo)
    QGEMM_LOAD(cuMemFree)
    QGEMM_LOAD(cuMemcpyHtoD)
    QGEMM_LOAD(cuMemcpyDtoH)
    QGEMM_LOAD(cuMemsetD8)
    QGEMM_LOAD(cuMemcpyDtoDAsync)
    QGEMM_LOAD(cuMemcpyDtoHAsync)
    QGEMM_LOAD(cuMemHostAlloc)
    QGEMM_LOAD(cuEventCreate)
    QGEMM_LOAD(cuEventRecord)
    QGEMM_LOAD(cuEventSynchronize)
    QGEMM_LOAD(cuEventDestroy)
    QGEMM_LOAD(cuMemsetD32Async)
    QGEMM_LOAD(cuStreamCreate)
    QGEMM_LOAD(cuStreamDestroy)
    QGEMM_LOAD(cuStreamSynchronize)
    QGEMM_LOAD(cuStreamIsCapturing)
    QGEMM_LOAD(cuThreadExchangeStreamCaptureMode)
    QGEMM_LOAD(cuMemsetD8Async)
    QGEMM_LOAD(cuStreamBeginCapture)
    QGEMM_LOAD(cuStreamEndCapture)
    QGEMM_LOAD(cuGraphInstantiateWithFlags)
    QGEMM_LOAD(cuGraphLaunch)
    QGEMM_LOAD(cuGraphDestroy)
    QGEMM_LOAD(cuGraphExecDestroy)
    QGEMM_LOAD(cuGraphGetNodes)
    QGEMM_LOAD(cuTensorMapEncodeTiled)
#undef QGEMM_LOAD
    const CUresult result = driver.cuInit(0);
    if (result != CUDA_SUCCESS) {
      const char* name = nullptr;
      driver.cuGetErrorName(result, &name);
      failure = fmt::format("cuInit failed ({}): no usable CUDA device", name ? name : "?");
    }
  }
};

namespace {
const DriverLoader& loader() {
  static const DriverLoader instance;
  return instance;
}
}  // namespace

const Driver& Driver::get() {
  const DriverLoader& state = loader();
  if (!state.failure.empty()) throw Error(ErrorCode::NoDevice, state.failure);
  return state.driver;
}

bool Driver::available(std::string* why) {
  const DriverLoader& state = loader();
  if (why) *why = state.failure;
  return state.failure.empty();
}

void Driver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* description = nullptr;
  cuGetErrorName(result, &name);
  cuGetErrorString(result, &description);
  throw Error(ErrorCode::CudaError,
              fmt::format("{}: {}: {}", what, name ? name : "?", description ? description : "?"));
}

int device_count() {
  if (!Driver::available()) return 0;
  const Driver& driver = Driver::get();
  int count = 0;
  driver.check(driver.cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

DeviceInfo device_info(int index) {
  const Driver& driver = Driver::get();
  const int count = device_count();
  require(index >= 0 && index < count, "device index {} (rule: 0 <= index < {} devices)", index,
          count);
  CUdevice device;
  driver.check(driver.cuDeviceGet(&device, index), "cuDeviceGet");
  DeviceInfo info;
  info.index = index;
  char name[256] = {};
  driver.check(driver.cuDeviceGetName(name, sizeof name, device), "cuDeviceGetName");
  info.name = name;
  auto attribute = [&](int* value, CUdevice_attribute which) {
    driver.check(driver.cuDeviceGetAttribute(value, which, device), "cuDeviceGetAttribute");
  };
  attribute(&info.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  attribute(&info.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  attribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  attribute(&info.shared_per_block_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  attribute(&info.shared_per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  driver.check(driver.cuDeviceTotalMem(&info.memory_bytes, device), "cuDeviceTotalMem");
  return info;
}

std::string driver_version_text() {
  const Driver& driver = Driver::get();
  int version = 0;
  driver.check(driver.cuDriverGetVersion(&version), "cuDriverGetVersion");
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

CUcontext use_primary_context(int device_index) {
  const Driver& driver = Driver::get();
  CUdevice device;
  driver.check(driver.cuDeviceGet(&device, device_index), "cuDeviceGet");
  CUcontext context = nullptr;
  // Retained for the life of the process, as the CUDA runtime does.
  driver.check(driver.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  driver.check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent");
  return context;
}

}  // namespace qgemm::runtime
