// Content hashes of the JIT: XXH3 (xxhash, used header-only). 128 bits for cache keys and spec
// identity, 64 bits for entry checksums.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace qgemm::jit {

struct Hash128 {
  std::uint64_t low = 0, high = 0;
  std::string hex() const;  // 32 lowercase hex digits, high word first
  friend bool operator==(const Hash128&, const Hash128&) = default;
};

Hash128 hash128(std::string_view bytes);
std::uint64_t hash64(std::string_view bytes);

// Incremental 128-bit hash over several fields; each field is length-prefixed so that
// ("ab", "c") and ("a", "bc") hash differently.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;
  Hasher128& add(std::string_view field);
  Hash128 finish() const;

 private:
  void* state_;
};

struct Hash128Hasher {
  std::size_t operator()(const Hash128& hash) const { return static_cast<std::size_t>(hash.low); }
};

}  // namespace qgemm::jit
