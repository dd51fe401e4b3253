// Checking a GEMM's output on the GPU against the double reference, element by element.
//
//   |got − expected| ≤ tolerance · Σ_k |a_k · w_k|  +  half an ulp of the output type at expected
//
// for every element: `tolerance` is the relative error each product may carry (operands
// rounded to 16 bits before the tensor-core multiply, 2^-9 each for bf16) and Σ_k |a_k · w_k| (the
// reference of |A| · |W|ᵀ) scales it to what cancellation cannot hide; the output rounding is
// added per element. Poisoned (unwritten) elements are non-finite and fail. The relative
// Frobenius error is reported too. A wrong tile — zeroed, shifted, another row's — fails the
// element-wise bound even where it barely moves the Frobenius norm
// (PlanGpu.ElementwiseBoundCatchesAZeroedTile is its negative control).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "qgemm/format.hpp"
#include "qgemm/reference.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::test {

struct OutputCheck {
  double relative = 0;         // ||got − expected|| / ||expected||
  std::size_t non_finite = 0;  // unwritten (poisoned) or NaN/Inf elements
  std::size_t outside = 0;     // elements outside their bound
  std::int64_t first_row = -1, first_col = -1;  // the first element outside it
  double first_got = 0, first_expected = 0, first_bound = 0;
  bool ok() const { return non_finite == 0 && outside == 0; }
  std::string describe() const {
    if (ok()) return "ok";
    return std::to_string(outside) + " elements outside their bound, " +
           std::to_string(non_finite) + " not finite; first at (" + std::to_string(first_row) +
           ", " + std::to_string(first_col) + "): got " + std::to_string(first_got) +
           ", expected " + std::to_string(first_expected) + " ± " + std::to_string(first_bound);
  }
};

// The output values, decoded from the device buffer (`count` elements of `out`).
inline std::vector<double> read_output(const runtime::DeviceBuffer& c, const Format& out,
                                       std::size_t count) {
  std::vector<double> got(count);
  if (out == formats::fp32) {
    const auto host = c.to_vector<float>(count);
    for (std::size_t i = 0; i < count; ++i) got[i] = host[i];
  } else {
    const auto host = c.to_vector<std::uint16_t>(count);
    for (std::size_t i = 0; i < count; ++i) got[i] = decode(out, host[i]);
  }
  return got;
}

// Σ_k |a_k · w_k| for every output element: the magnitudes the element-wise bound scales with.
inline std::vector<double> product_magnitudes(const std::vector<double>& a,
                                              const std::vector<double>& w, std::int64_t m,
                                              std::int64_t n, std::int64_t k) {
  std::vector<double> abs_a(a.size()), abs_w(w.size());
  for (std::size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
  for (std::size_t i = 0; i < w.size(); ++i) abs_w[i] = std::fabs(w[i]);
  return reference::matmul_nt(abs_a.data(), abs_w.data(), m, n, k);
}

inline OutputCheck check_output(const std::vector<double>& got, const std::vector<double>& expected,
                                const std::vector<double>& magnitude, std::int64_t n,
                                double tolerance, const Format& out) {
  OutputCheck check;
  double error = 0, norm = 0;
  const double half_ulp = out == formats::fp32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -(out.mantissa_bits + 1));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = expected[i];
    norm += e * e;
    if (!std::isfinite(got[i])) {
      ++check.non_finite;
      continue;
    }
    const double d = got[i] - e;
    error += d * d;
    // Half an ulp at |expected|, and at least the smallest normal's (values near zero).
    const double rounding = half_ulp * std::max(std::fabs(e), out.min_normal());
    const double bound = tolerance * magnitude[i] + rounding + 1e-30;
    if (std::fabs(d) > bound) {
      if (check.outside++ == 0) {
        check.first_row = static_cast<std::int64_t>(i) / n;
        check.first_col = static_cast<std::int64_t>(i) % n;
        check.first_got = got[i];
        check.first_expected = e;
        check.first_bound = bound;
      }
    }
  }
  check.relative = norm > 0 ? std::sqrt(error / norm) : std::sqrt(error);
  return check;
}

}  // namespace qgemm::test
