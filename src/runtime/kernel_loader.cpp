#include "runtime/kernel_loader.hpp"

#include <fmt/format.h>

#include <chrono>
#include <mutex>

#include "common/log.hpp"
#include "qgemm/error.hpp"
#include "runtime/driver.hpp"

namespace qgemm::runtime {
namespace {
thread_local double last_load_milliseconds = 0;
constexpr int kDefaultDynamicSmemLimit = 48 * 1024;  // above this a kernel must opt in
}  // namespace

double KernelLoader::last_load_ms() { return last_load_milliseconds; }

KernelLoader& KernelLoader::global() {
  static KernelLoader loader;
  return loader;
}

LoadedKernel KernelLoader::get(const jit::CompiledKernel& kernel) {
  const Driver& driver = Driver::get();
  CUcontext context = nullptr;
  driver.check(driver.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  if (!context) {
    throw Error(ErrorCode::CudaError,
                fmt::format("loading {}: no CUDA context is current on this thread (call "
                            "cudaSetDevice or cuCtxSetCurrent first)",
                            kernel.spec_text));
  }
  const Key key{context, kernel.key};
  last_load_milliseconds = 0;
  {
    std::shared_lock lock(mutex_);
    const auto found = functions_.find(key);
    if (found != functions_.end()) return found->second;
  }
  std::unique_lock lock(mutex_);
  const auto found = functions_.find(key);
  if (found != functions_.end()) return found->second;

  const auto start = std::chrono::steady_clock::now();
  CUmodule module = nullptr;
  driver.check(driver.cuModuleLoadData(&module, kernel.cubin.data()),
               fmt::format("cuModuleLoadData({})", kernel.spec_text).c_str());
  LoadedKernel loaded;
  loaded.launch = kernel.spec.launch;
  try {
    driver.check(driver.cuModuleGetFunction(&loaded.function, module, kernel.lowered_name.c_str()),
                 fmt::format("cuModuleGetFunction({})", kernel.lowered_name).c_str());
    // The 48 KB default covers static and dynamic shared memory together, so a kernel with
    // some static shared memory must opt in below 48 KB of dynamic memory already.
    if (loaded.launch.dynamic_smem_bytes + kernel.resources.static_smem_bytes >
        kDefaultDynamicSmemLimit) {
      driver.check(driver.cuFuncSetAttribute(loaded.function,
                                             CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             loaded.launch.dynamic_smem_bytes),
                   fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {}) for {}",
                               loaded.launch.dynamic_smem_bytes, kernel.spec_text)
                       .c_str());
    }
  } catch (...) {
    driver.cuModuleUnload(module);
    throw;
  }
  last_load_milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  log(LogLevel::Debug, "loaded {} in context {} ({:.2f} ms)", kernel.spec_text,
      static_cast<const void*>(context), last_load_milliseconds);
  // Modules stay loaded for the life of the context (the process, for primary contexts).
  functions_.emplace(key, loaded);
  return loaded;
}

void launch_raw(const LoadedKernel& kernel, LaunchGrid grid, void** params, CUstream stream) {
  const Driver& driver = Driver::get();
  const CUresult result = driver.cuLaunchKernel(
      kernel.function, grid.x, grid.y, grid.z,
      static_cast<unsigned>(kernel.launch.threads_per_block), 1, 1,
      static_cast<unsigned>(kernel.launch.dynamic_smem_bytes), stream, params, nullptr);
  if (result != CUDA_SUCCESS) driver.check(result, "cuLaunchKernel");
}

}  // namespace qgemm::runtime
