// A number format packed into one 64-bit integer, so a kernel template can take a whole format
// description as one constexpr parameter (device code is C++17: no class-type template
// parameters). The host (src/jit/kernel_spec.cpp) packs a qgemm::Format with pack(); the device
// unpacks it at compile time. This header is plain constexpr C++ so both sides include it.
//
//   bit  0      kind            0 integer, 1 float            (qgemm::NumberKind)
//   bit  1      is_signed
//   bits 2-7    bits            value bits, 1..32
//   bits 8-11   exponent_bits   float only
//   bits 12-16  mantissa_bits   float only
//   bits 17-18  specials        qgemm::FloatSpecials order: IEEE, FiniteOneNaN, FiniteNoNaN,
//                               ExponentOnly
//   bits 19-28  bias + 512      float only
//   bits 29-44  min_int + 32768 integer only
//   bits 45-60  max_int + 32768 integer only
#pragma once

namespace qgemm::kernels {

enum FormatKindCode { kIntegerFormat = 0, kFloatFormat = 1 };
enum FloatSpecialsCode { kIeee = 0, kFiniteOneNaN = 1, kFiniteNoNaN = 2, kExponentOnly = 3 };

struct FormatCode {
  int kind;
  bool is_signed;
  int bits;
  int exponent_bits;
  int mantissa_bits;
  int specials;
  int bias;
  int min_int;
  int max_int;

  constexpr unsigned long long pack() const {
    return static_cast<unsigned long long>(kind & 1) |
           static_cast<unsigned long long>(is_signed ? 1 : 0) << 1 |
           static_cast<unsigned long long>(bits & 63) << 2 |
           static_cast<unsigned long long>(exponent_bits & 15) << 8 |
           static_cast<unsigned long long>(mantissa_bits & 31) << 12 |
           static_cast<unsigned long long>(specials & 3) << 17 |
           static_cast<unsigned long long>((bias + 512) & 1023) << 19 |
           static_cast<unsigned long long>((min_int + 32768) & 65535) << 29 |
           static_cast<unsigned long long>((max_int + 32768) & 65535) << 45;
  }

  static constexpr FormatCode unpack(unsigned long long code) {
    return FormatCode{static_cast<int>(code & 1),
                      ((code >> 1) & 1) != 0,
                      static_cast<int>((code >> 2) & 63),
                      static_cast<int>((code >> 8) & 15),
                      static_cast<int>((code >> 12) & 31),
                      static_cast<int>((code >> 17) & 3),
                      static_cast<int>((code >> 19) & 1023) - 512,
                      static_cast<int>((code >> 29) & 65535) - 32768,
                      static_cast<int>((code >> 45) & 65535) - 32768};
  }

  constexpr bool is_float() const { return kind == kFloatFormat; }
  constexpr unsigned code_mask() const { return bits >= 32 ? 0xffffffffu : (1u << bits) - 1u; }
};

// The ranges pack() can hold; the host checks a format against them before packing.
constexpr bool format_code_fits(const FormatCode& f) {
  return f.bits >= 1 && f.bits <= 32 && f.exponent_bits >= 0 && f.exponent_bits <= 15 &&
         f.mantissa_bits >= 0 && f.mantissa_bits <= 31 && f.specials >= 0 && f.specials <= 3 &&
         f.bias >= -512 && f.bias < 512 && f.min_int >= -32768 && f.min_int < 32768 &&
         f.max_int >= -32768 && f.max_int < 32768;
}

}  // namespace qgemm::kernels
