// GPU tests skip, with the reason, when this machine has no usable CUDA device or driver.
//
//   TEST(Suite, Name) {
//     QGEMM_REQUIRE_GPU();          // GTEST_SKIP()s "no CUDA device: <why>" otherwise
//     ...                           // device 0's primary context is current
//   }
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "jit/kernel_spec.hpp"
#include "runtime/driver.hpp"

namespace qgemm::test {

// Empty when device 0 is usable (and makes its primary context current); else why not.
inline std::string gpu_unavailable_reason() {
  std::string why;
  if (!runtime::Driver::available(&why)) return why;
  if (runtime::device_count() == 0) return "the driver reports 0 devices";
  const auto device = runtime::device_info(0);
  try {
    jit::arch_for_device(device.major, device.minor);
  } catch (const std::exception& error) {
    return error.what();
  }
  runtime::use_primary_context(0);
  return "";
}

// The qgemm target of device 0 (call after QGEMM_REQUIRE_GPU).
inline jit::Arch device_arch(int index = 0) {
  const auto device = runtime::device_info(index);
  return jit::arch_for_device(device.major, device.minor);
}

}  // namespace qgemm::test

#define QGEMM_REQUIRE_GPU()                                                                \
  do {                                                                                     \
    const std::string qgemm_gpu_reason = ::qgemm::test::gpu_unavailable_reason();          \
    if (!qgemm_gpu_reason.empty()) GTEST_SKIP() << "no CUDA device: " << qgemm_gpu_reason; \
  } while (0)
