// The CUDA driver API, loaded from libcuda.so.1 with dlopen at first use: qgemm never links
// libcuda, so it loads (and runs its CPU paths) on machines without a GPU driver. <cuda.h>
// supplies the types only.
#pragma once

#include <cuda.h>

#include <string>

namespace qgemm::runtime {

class Driver {
 public:
  // Loads the driver and calls cuInit once. Throws Error(NoDevice) naming the reason when the
  // library is missing, a symbol is missing, or cuInit fails (no device / no permission).
  static const Driver& get();
  // True when get() would succeed; `why` receives the reason otherwise. Never throws.
  static bool available(std::string* why = nullptr);

  // Throws Error(CudaError) "<what>: <driver error name>: <description>" unless CUDA_SUCCESS.
  void check(CUresult result, const char* what) const;

#define QGEMM_DRIVER_FUNCTION(name) decltype(&::name) name = nullptr
  QGEMM_DRIVER_FUNCTION(cuInit);
  QGEMM_DRIVER_FUNCTION(cuDriverGetVersion);
  QGEMM_DRIVER_FUNCTION(cuGetErrorName);
  QGEMM_DRIVER_FUNCTION(cuGetErrorString);
  QGEMM_DRIVER_FUNCTION(cuDeviceGetCount);
  QGEMM_DRIVER_FUNCTION(cuDeviceGet);
  QGEMM_DRIVER_FUNCTION(cuDeviceGetName);
  QGEMM_DRIVER_FUNCTION(cuDeviceGetAttribute);
  QGEMM_DRIVER_FUNCTION(cuDeviceTotalMem);
  QGEMM_DRIVER_FUNCTION(cuDevicePrimaryCtxRetain);
  QGEMM_DRIVER_FUNCTION(cuDevicePrimaryCtxRelease);
  QGEMM_DRIVER_FUNCTION(cuCtxGetCurrent);
  QGEMM_DRIVER_FUNCTION(cuCtxSetCurrent);
  QGEMM_DRIVER_FUNCTION(cuCtxGetDevice);
  QGEMM_DRIVER_FUNCTION(cuCtxSynchronize);
  QGEMM_DRIVER_FUNCTION(cuModuleLoadData);
  QGEMM_DRIVER_FUNCTION(cuModuleUnload);
  QGEMM_DRIVER_FUNCTION(cuModuleGetFunction);
  QGEMM_DRIVER_FUNCTION(cuFuncSetAttribute);
  QGEMM_DRIVER_FUNCTION(cuLaunchKernel);
  QGEMM_DRIVER_FUNCTION(cuMemAlloc);
  QGEMM_DRIVER_FUNCTION(cuMemFree);
  QGEMM_DRIVER_FUNCTION(cuMemGetInfo);
  QGEMM_DRIVER_FUNCTION(cuMemcpyHtoD);
  QGEMM_DRIVER_FUNCTION(cuMemcpyDtoH);
  QGEMM_DRIVER_FUNCTION(cuMemsetD8);
  QGEMM_DRIVER_FUNCTION(cuMemcpyDtoDAsync);
  QGEMM_DRIVER_FUNCTION(cuMemcpyDtoHAsync);
  QGEMM_DRIVER_FUNCTION(cuMemHostAlloc);
  QGEMM_DRIVER_FUNCTION(cuEventCreate);
  QGEMM_DRIVER_FUNCTION(cuEventRecord);
  QGEMM_DRIVER_FUNCTION(cuEventSynchronize);
  QGEMM_DRIVER_FUNCTION(cuEventDestroy);
  QGEMM_DRIVER_FUNCTION(cuMemsetD32Async);
  QGEMM_DRIVER_FUNCTION(cuStreamCreate);
  QGEMM_DRIVER_FUNCTION(cuStreamDestroy);
  QGEMM_DRIVER_FUNCTION(cuStreamSynchronize);
  QGEMM_DRIVER_FUNCTION(cuStreamIsCapturing);
  QGEMM_DRIVER_FUNCTION(cuThreadExchangeStreamCaptureMode);
  QGEMM_DRIVER_FUNCTION(cuMemsetD8Async);
  QGEMM_DRIVER_FUNCTION(cuStreamBeginCapture);
  QGEMM_DRIVER_FUNCTION(cuStreamEndCapture);
  QGEMM_DRIVER_FUNCTION(cuGraphInstantiateWithFlags);
  QGEMM_DRIVER_FUNCTION(cuGraphLaunch);
  QGEMM_DRIVER_FUNCTION(cuGraphDestroy);
  QGEMM_DRIVER_FUNCTION(cuGraphExecDestroy);
  QGEMM_DRIVER_FUNCTION(cuGraphGetNodes);
  QGEMM_DRIVER_FUNCTION(cuTensorMapEncodeTiled);
#undef QGEMM_DRIVER_FUNCTION

 private:
  Driver() = default;
  void* library_ = nullptr;
  friend struct DriverLoader;
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  int shared_per_block_optin = 0;  // bytes a block may use when it opts in
  int shared_per_sm = 0;
  std::size_t memory_bytes = 0;
};
int device_count();  // 0 when there is no driver
DeviceInfo device_info(int index);
std::string driver_version_text();  // "13.0"

// Makes the primary context of `device` current on this thread (what the CUDA runtime does on
// cudaSetDevice) and returns it.
CUcontext use_primary_context(int device);

}  // namespace qgemm::runtime
