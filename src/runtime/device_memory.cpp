#include "runtime/device_memory.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
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

void prefault_host(void* begin, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  constexpr std::size_t kPerThread = std::size_t{16} << 20;  // a thread's start costs ~20 µs
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  // Whole pages inside the range: the partial ones at its ends may hold other objects' bytes
  // (populating keeps contents, but madvise takes page-aligned starts only).
  const std::uintptr_t first = (reinterpret_cast<std::uintptr_t>(begin) + page - 1) / page * page;
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(begin) + bytes) / page * page;
  if (end <= first) return;
  const std::size_t span = end - first;
  const std::size_t threads = std::clamp<std::size_t>(
      span / kPerThread, 1, std::max(1u, std::min(8u, std::thread::hardware_concurrency())));
  const std::size_t share = (span / threads + page - 1) / page * page;
  const auto populate = [&](std::size_t i) {
    const std::size_t from = i * share;
    if (from < span)
      madvise(reinterpret_cast<void*>(first + from), std::min(share, span - from),
              MADV_POPULATE_WRITE);  // an error leaves the pages to fault in during the copy
  };
  std::vector<std::thread> pool;
  for (std::size_t i = 1; i < threads; ++i) pool.emplace_back(populate, i);
  populate(0);
  for (std::thread& t : pool) t.join();
#else
  (void)begin;
  (void)bytes;
#endif
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  require(bytes <= bytes_, "upload of {} bytes into a {}-byte buffer", bytes, bytes_);
  if (!bytes) return;
  const Driver& driver = Driver::get();
  driver.check(driver.cuMemcpyHtoD(address_, host, bytes), "cuMemcpyHtoD");
}

namespace {

constexpr std::size_t kStagingChunk = std::size_t{8} << 20;

// The two chunks, made on first use (portable: any context may copy into them) and kept for
// the process; one staged download at a time.
struct PinnedStaging {
  std::mutex mutex;
  void* chunks[2] = {nullptr, nullptr};
};
PinnedStaging& pinned_staging() {
  static auto* staging = new PinnedStaging;  // never freed: the driver may be gone at exit
  return *staging;
}

}  // namespace

// A pageable cuMemcpyDtoH of a weight's codes into fresh host memory ran at ~1.9 GB/s (H100,
// bench/NOTES.md). Here the copy engine fills one pinned chunk while the host takes the other:
//   chunk i:  DMA into chunks[i % 2] on the legacy stream (ordered after earlier work there,
//             as cuMemcpyDtoH is), event[i % 2] recorded
//   then:     wait for event[(i - 1) % 2], hand chunk i - 1 to `take`
// so chunk i's buffer was emptied (chunk i - 2 taken) one step before it is refilled.
void DeviceBuffer::download_in_pieces(
    std::size_t bytes, const std::function<void(const unsigned char*, std::size_t)>& take) const {
  require(bytes <= bytes_, "download of {} bytes from a {}-byte buffer", bytes, bytes_);
  if (!bytes) return;
  const Driver& driver = Driver::get();
  const CUdeviceptr source = address_;
  PinnedStaging& staging = pinned_staging();
  std::lock_guard lock(staging.mutex);
  for (void*& chunk : staging.chunks)
    if (!chunk)
      driver.check(driver.cuMemHostAlloc(&chunk, kStagingChunk, CU_MEMHOSTALLOC_PORTABLE),
                   "cuMemHostAlloc (download staging)");
  struct Events {
    const Driver& driver;
    CUevent done[2] = {nullptr, nullptr};
    ~Events() {
      for (CUevent event : done)
        if (event) driver.cuEventDestroy(event);
    }
  } events{driver};
  for (CUevent& event : events.done)
    driver.check(driver.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  const std::size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  const auto piece = [&](std::size_t i) {
    return std::min(kStagingChunk, bytes - i * kStagingChunk);
  };
  for (std::size_t i = 0; i <= chunks; ++i) {
    if (i < chunks) {
      driver.check(driver.cuMemcpyDtoHAsync(staging.chunks[i % 2], source + i * kStagingChunk,
                                            piece(i), nullptr),
                   "cuMemcpyDtoHAsync (download staging)");
      driver.check(driver.cuEventRecord(events.done[i % 2], nullptr), "cuEventRecord");
    }
    if (i >= 1) {
      const std::size_t previous = i - 1;
      driver.check(driver.cuEventSynchronize(events.done[previous % 2]), "cuEventSynchronize");
      take(static_cast<const unsigned char*>(staging.chunks[previous % 2]), piece(previous));
    }
  }
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  require(bytes <= bytes_, "download of {} bytes from a {}-byte buffer", bytes, bytes_);
  if (!bytes) return;
  if (bytes >= kStagedFrom) {
    auto* to = static_cast<unsigned char*>(host);
    prefault_host(host, bytes);
    download_in_pieces(bytes, [&](const unsigned char* piece, std::size_t size) {
      std::memcpy(to, piece, size);
      to += size;
    });
    return;
  }
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

CaptureModeRelaxed::CaptureModeRelaxed(CUstream stream) {
  const Driver& driver = Driver::get();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult result = driver.cuStreamIsCapturing(stream, &status);
  // The legacy stream, queried while a blocking stream captures, answers "implicit": a capture
  // is under way.
  if (result == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  } else {
    driver.check(result, "cuStreamIsCapturing");
  }
  if (status == CU_STREAM_CAPTURE_STATUS_NONE) return;
  capturing_ = true;
  previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  driver.check(driver.cuThreadExchangeStreamCaptureMode(&previous_),
               "cuThreadExchangeStreamCaptureMode");
}

CaptureModeRelaxed::~CaptureModeRelaxed() {
  if (capturing_) Driver::get().cuThreadExchangeStreamCaptureMode(&previous_);
}

void zero_outside_capture(const DeviceBuffer& buffer) {
  const Driver& driver = Driver::get();
  CUstream own = nullptr;
  driver.check(driver.cuStreamCreate(&own, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  const CUresult set = driver.cuMemsetD8Async(buffer.address(), 0, buffer.bytes(), own);
  const CUresult waited = set == CUDA_SUCCESS ? driver.cuStreamSynchronize(own) : set;
  driver.cuStreamDestroy(own);
  driver.check(waited, "zero_outside_capture: cuMemsetD8Async");
}

}  // namespace qgemm::runtime
