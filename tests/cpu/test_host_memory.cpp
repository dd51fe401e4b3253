// runtime::prefault_host, which the large downloads call on their fresh host memory: it must
// keep what the range holds (populating for writing, never discarding) and accept any range.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/device_memory.hpp"

namespace {

TEST(HostMemory, PrefaultKeepsEveryByteOfAnyRange) {
  // 40 MiB: past the per-thread share, so several threads take parts of the range.
  std::vector<std::uint8_t> bytes(std::size_t{40} << 20);
  std::mt19937 rng(11);
  for (std::uint8_t& b : bytes) b = static_cast<std::uint8_t>(rng());
  const std::vector<std::uint8_t> before = bytes;
  // Unaligned ends (partial pages both sides), the whole range, a sub-page range, nothing.
  qgemm::runtime::prefault_host(bytes.data() + 3, bytes.size() - 7);
  qgemm::runtime::prefault_host(bytes.data(), bytes.size());
  qgemm::runtime::prefault_host(bytes.data() + 100, 50);
  qgemm::runtime::prefault_host(bytes.data(), 0);
  EXPECT_TRUE(bytes == before);
}

TEST(HostMemory, PrefaultedReservationTakesItsElements) {
  // What to_vector does: reserve, prefault the reservation, then append.
  std::vector<std::uint32_t> host;
  host.reserve(std::size_t{24} << 20);
  qgemm::runtime::prefault_host(host.data(), host.capacity() * sizeof(std::uint32_t));
  for (std::uint32_t i = 0; i < host.capacity(); ++i) host.push_back(i * 2654435761u);
  ASSERT_EQ(host.size(), std::size_t{24} << 20);
  for (std::uint32_t i = 0; i < host.size(); i += 4099) EXPECT_EQ(host[i], i * 2654435761u);
}

}  // namespace
