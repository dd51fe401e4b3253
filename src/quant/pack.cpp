// Bit packing in the canonical order of include/qgemm/quant.hpp: element j of a run occupies
// bits [j·bits, (j+1)·bits), counted LSB-first through little-endian bytes.
//
// Both directions stream through a 64-bit bit buffer: codes enter (or leave) at the top of the
// filled part and whole bytes leave (or enter) at the bottom. One loop serves every width,
// including those that straddle bytes (3, 5, 6, 7 bits); 8/16/32 bits reduce to byte copies.
#include <fmt/format.h>

#include <cstring>

#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "quant/block_quant.hpp"

namespace qgemm {
namespace {

using quant_detail::packed_bytes;

// Called per code by read_code: the messages are formatted only on failure.
void require_packable(std::int64_t count, int bits, const char* function) {
  if (!(bits >= 1 && (bits <= 8 || bits == 16 || bits == 32)))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: bits = {} is not a packable width (rule: 1..8, 16 or 32)",
                            function, bits));
  if (count < 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: count = {} is negative (rule: count >= 0)", function, count));
}

// Byte-multiple widths: little-endian copies, no shifting.
void pack_whole_bytes(const std::uint32_t* codes, std::int64_t count, int bytes,
                      std::uint8_t* out) {
  for (std::int64_t i = 0; i < count; ++i)
    for (int b = 0; b < bytes; ++b) *out++ = static_cast<std::uint8_t>(codes[i] >> (8 * b));
}

void unpack_whole_bytes(const std::uint8_t* packed, std::int64_t count, int bytes,
                        std::uint32_t* out) {
  for (std::int64_t i = 0; i < count; ++i) {
    std::uint32_t code = 0;
    for (int b = 0; b < bytes; ++b) code |= static_cast<std::uint32_t>(*packed++) << (8 * b);
    out[i] = code;
  }
}

}  // namespace

void pack_codes(const std::uint32_t* codes, std::int64_t count, int bits, std::uint8_t* out) {
  require_packable(count, bits, "pack_codes");
  if (count == 0) return;
  require(codes != nullptr && out != nullptr, "pack_codes: codes and out must not be null");
  // Reject codes wider than `bits` instead of silently masking them: a wide code is a bug in
  // the caller's quantizer, and masking would hide it behind a plausible wrong value.
  if (bits < 32) {
    std::uint32_t overflow = 0;
    for (std::int64_t i = 0; i < count; ++i) overflow |= codes[i] >> bits;
    if (overflow != 0) {
      std::int64_t bad = 0;
      while ((codes[bad] >> bits) == 0) ++bad;
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("pack_codes: codes[{}] = {} does not fit in {} bits (rule: code < "
                              "2^bits = {})",
                              bad, codes[bad], bits, std::uint64_t{1} << bits));
    }
  }
  if (bits % 8 == 0) return pack_whole_bytes(codes, count, bits / 8, out);
  std::uint64_t buffer = 0;  // pending bits, LSB = the next bit to write
  int filled = 0;            // always < 8 between codes, so a code (≤ 7 bits here) always fits
  for (std::int64_t i = 0; i < count; ++i) {
    buffer |= static_cast<std::uint64_t>(codes[i]) << filled;
    filled += bits;
    while (filled >= 8) {
      *out++ = static_cast<std::uint8_t>(buffer);
      buffer >>= 8;
      filled -= 8;
    }
  }
  if (filled > 0) *out = static_cast<std::uint8_t>(buffer);  // the bits above are 0: padding
}

void unpack_codes(const std::uint8_t* packed, std::int64_t count, int bits, std::uint32_t* out) {
  require_packable(count, bits, "unpack_codes");
  if (count == 0) return;
  require(packed != nullptr && out != nullptr, "unpack_codes: packed and out must not be null");
  if (bits % 8 == 0) return unpack_whole_bytes(packed, count, bits / 8, out);
  const std::uint32_t mask = (1u << bits) - 1;
  const std::int64_t total_bytes = packed_bytes(count, bits);
  std::int64_t next_byte = 0;
  std::uint64_t buffer = 0;
  int filled = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    // Refill byte by byte; never read past the last byte that holds a bit of this run.
    while (filled < bits && next_byte < total_bytes) {
      buffer |= static_cast<std::uint64_t>(packed[next_byte++]) << filled;
      filled += 8;
    }
    out[i] = static_cast<std::uint32_t>(buffer) & mask;
    buffer >>= bits;
    filled -= bits;
  }
}

std::uint32_t read_code(const std::uint8_t* row, std::int64_t index, int bits) {
  require_packable(index, bits, "read_code");
  if (bits % 8 == 0) {
    std::uint32_t code = 0;
    unpack_whole_bytes(row + index * (bits / 8), 1, bits / 8, &code);
    return code;
  }
  const std::int64_t first_bit = index * bits;
  const std::uint8_t* byte = row + first_bit / 8;
  const int shift = static_cast<int>(first_bit % 8);
  std::uint32_t window = byte[0];
  if (shift + bits > 8) window |= static_cast<std::uint32_t>(byte[1]) << 8;  // straddles
  return (window >> shift) & ((1u << bits) - 1);
}

std::int64_t PackedWeight::row_bytes() const { return packed_bytes(k, quant.format.bits); }

std::int64_t PackedActivation::row_bytes() const { return packed_bytes(k, quant.format.bits); }

}  // namespace qgemm
