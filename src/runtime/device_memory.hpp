// Small device-memory helpers through the dlopen'ed driver (tests, tools, the CLI): an owning
// buffer in the current context and blocking copies.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace qgemm::runtime {

// Maps the pages of [begin, begin + bytes) for writing, on several threads at once. A first
// touch of fresh host memory ran at 1.2-1.5 GB/s on one thread on the device hosts (a page fault
// per 4 KiB), the large downloads' whole cost; faulted from 8 threads the download ran ~1.8x
// faster there (bench/NOTES.md, fifteenth session: those hosts' faults scale little; where
// nothing may come down at all, see host_copy=False). Best effort: nothing happens where the
// kernel lacks MADV_POPULATE_WRITE (Linux < 5.14), and the copy then faults the pages in.
void prefault_host(void* begin, std::size_t bytes);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // in the current context
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr address() const { return address_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address_));
  }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* host, std::size_t bytes);  // blocking
  void download(void* host, std::size_t bytes) const;
  // `part` whole into this buffer from byte `offset` on, device to device; blocking.
  void copy_in(const DeviceBuffer& part, std::size_t offset);
  void fill_bytes(unsigned char value);  // blocking; e.g. poison outputs before a test writes them

  template <typename T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size() * sizeof(T));
    buffer.upload(host.data(), host.size() * sizeof(T));
    return buffer;
  }
  // The first `count` elements. A large download (kStagedFrom bytes or more) fills the vector
  // as the pinned chunks arrive, never zero-filling it first (one pass over its fresh pages).
  template <typename T>
  std::vector<T> to_vector(std::size_t count) const {
    std::vector<T> host;
    if (count * sizeof(T) >= kStagedFrom) {
      host.reserve(count);
      prefault_host(host.data(), count * sizeof(T));
      download_in_pieces(count * sizeof(T), [&](const unsigned char* piece, std::size_t bytes) {
        const T* first = reinterpret_cast<const T*>(piece);  // pieces are whole elements
        host.insert(host.end(), first, first + bytes / sizeof(T));
      });
      return host;
    }
    host.resize(count);
    download(host.data(), count * sizeof(T));
    return host;
  }

  // Downloads of this size or more go through two pinned chunks (download_in_pieces).
  static constexpr std::size_t kStagedFrom = std::size_t{16} << 20;

 private:
  // The first `bytes` in order, in pieces of 8 MiB (the last: the rest), each handed to `take`
  // while the copy engine fetches the next into pinned memory. Blocking.
  void download_in_pieces(std::size_t bytes,
                          const std::function<void(const unsigned char*, std::size_t)>& take) const;

  CUdeviceptr address_ = 0;
  std::size_t bytes_ = 0;
};

// While `stream` is being captured into a CUDA graph, relaxes this thread's capture mode for the
// object's lifetime, then restores it: memory may then be allocated (the global mode refuses
// cuMemAlloc during a capture as potentially unsafe). Does nothing for a stream not capturing.
class CaptureModeRelaxed {
 public:
  explicit CaptureModeRelaxed(CUstream stream);
  ~CaptureModeRelaxed();
  CaptureModeRelaxed(const CaptureModeRelaxed&) = delete;
  CaptureModeRelaxed& operator=(const CaptureModeRelaxed&) = delete;
  bool capturing() const { return capturing_; }

 private:
  bool capturing_ = false;
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

// fill_bytes(0) for use during a capture: on a stream of its own (non-blocking, so no implicit
// synchronization with the capturing stream), waited for, with no context synchronization.
void zero_outside_capture(const DeviceBuffer& buffer);

}  // namespace qgemm::runtime
