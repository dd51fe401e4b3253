// Reading one code out of a canonical packed row (include/qgemm/quant.hpp): element j covers
// bits [j·b, (j+1)·b) of the row, LSB-first through little-endian bytes, so a code of up to 8
// bits lies within the two bytes starting at byte floor(j·b / 8).
//
//   b = 3:  byte 0 = c2[1:0] c1 c0 | byte 1 = ... c5 c4 c3 c2[2]
//           code j = (byte[j·3/8] | byte[j·3/8 + 1] << 8) >> (j·3 % 8) & 0b111
#pragma once

namespace qgemm::kernels {

template <int kBits>
__device__ __forceinline__ unsigned int read_packed_code(const unsigned char* row,
                                                         long long row_bytes, long long index) {
  static_assert(kBits >= 1 && kBits <= 8, "packed codes are 1..8 bits");
  const long long bit = index * kBits;
  const long long byte = bit >> 3;
  unsigned int window = row[byte];
  // The second byte exists only when the code straddles; never read past the row.
  if ((bit & 7) + kBits > 8 && byte + 1 < row_bytes)
    window |= static_cast<unsigned int>(row[byte + 1]) << 8;
  return (window >> (bit & 7)) & ((1u << kBits) - 1u);
}

// A scale (or float zero point) stored as its code, `bytes` little-endian bytes.
template <int kBytes>
__device__ __forceinline__ unsigned int read_stored_code(const unsigned char* base,
                                                         long long index) {
  const unsigned char* p = base + index * kBytes;
  unsigned int code = p[0];
  if constexpr (kBytes >= 2) code |= static_cast<unsigned int>(p[1]) << 8;
  if constexpr (kBytes == 4) {
    code |= static_cast<unsigned int>(p[2]) << 16 | static_cast<unsigned int>(p[3]) << 24;
  }
  return code;
}

// Its inverse: `code` stored at `index` in kBytes little-endian bytes (base + index · kBytes
// aligned to kBytes, as every scale array is).
template <int kBytes>
__device__ __forceinline__ void write_stored_code(unsigned char* base, long long index,
                                                  unsigned int code) {
  if constexpr (kBytes == 1) {
    base[index] = static_cast<unsigned char>(code);
  } else if constexpr (kBytes == 2) {
    reinterpret_cast<unsigned short*>(base)[index] = static_cast<unsigned short>(code);
  } else {
    reinterpret_cast<unsigned int*>(base)[index] = code;
  }
}

}  // namespace qgemm::kernels
