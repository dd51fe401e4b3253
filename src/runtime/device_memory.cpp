#include "runtime/device_memory.hpp"

#include <fmt/format.h>

#include <utility>

#include "qgemm/error.hpp"
#include "runtime/driver.hpp"

namespace qgemm::runtime {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  const Driver& driver = Driver::get();
  // A zero-byte buffer still gets an address so kernels can take it.
  driver.check(driver.cuMemAlloc(&address_, bytes ? bytes : 1),
               fmt::format("cuMemAlloc({} bytes)", bytes).c_str());
}

DeviceBuffer::~DeviceBuffer() {
  if (address_) Driver::get().cuMemFree(address_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : address_(std::exchange(other.address_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (address_) Driver::get().cuMemFree(address_);
    address_ = std::exchange(other.address_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  require(bytes <= bytes_, "upload of {} bytes into a {}-byte buffer", bytes, bytes_);
  if (!bytes) return;
  const Driver& driver = Driver::get();
  driver.check(driver.cuMemcpyHtoD(address_, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  require(bytes <= bytes_, "download of {} bytes from a {}-byte buffer", bytes, bytes_);
  if (!bytes) return;
  const Driver& driver = Driver::get();
  driver.check(driver.cuMemcpyDtoH(host, address_, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::copy_in(const DeviceBuffer& part, std::size_t offset) {
  require(offset <= bytes_ && part.bytes() <= bytes_ - offset,
          "copy of {} bytes into a {}-byte buffer at {}", part.bytes(), bytes_, offset);
  if (!part.bytes()) return;
  const Driver& driver = Driver::get();
  driver.check(driver.cuMemcpyDtoDAsync(address_ + offset, part.address(), part.bytes(), nullptr),
               "cuMemcpyDtoDAsync");
  driver.check(driver.cuStreamSynchronize(nullptr), "cuStreamSynchronize (copy_in)");
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  const Driver& driver = Driver::get();
  driver.check(driver.cuMemsetD8(address_, value, bytes_ ? bytes_ : 1), "cuMemsetD8");
  // cuMemsetD8 on device memory returns before it runs, on the legacy stream, which kernels on
  // non-blocking streams do not wait for: finish it here, so that "filled" means filled (the
  // engine's zeroed split-K workspace, a test's poisoned output).
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize (fill_bytes)");
}

}  // namespace qgemm::runtime
