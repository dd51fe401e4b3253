#include "jit/hash.hpp"

#define XXH_INLINE_ALL
#include <fmt/format.h>
#include <xxhash.h>

namespace qgemm::jit {

std::string Hash128::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

Hash128 hash128(std::string_view bytes) {
  const XXH128_hash_t hash = XXH3_128bits(bytes.data(), bytes.size());
  return Hash128{hash.low64, hash.high64};
}

std::uint64_t hash64(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

Hasher128::Hasher128() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher128::~Hasher128() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

Hasher128& Hasher128::add(std::string_view field) {
  auto* state = static_cast<XXH3_state_t*>(state_);
  const std::uint64_t length = field.size();
  XXH3_128bits_update(state, &length, sizeof length);
  XXH3_128bits_update(state, field.data(), field.size());
  return *this;
}

Hash128 Hasher128::finish() const {
  const XXH128_hash_t hash = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Hash128{hash.low64, hash.high64};
}

}  // namespace qgemm::jit
