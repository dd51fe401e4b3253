// The error the formats allow: per-element rounding radii derived from the spacing of the
// formats at the values actually stored, for `qgemm check` and the tests.
//
// An element stored as code q under effective scale s (the cell scale times the global /
// tensor scale) stands for every real value that rounds to q. Its radius is
//
//   interior code          half_ulp(format, decode(q)) · |s|      half the gap to the
//                                                                 neighbouring code
//   code at an end of the  the same, or, when the original value   saturation is part of what
//   format's range         lies beyond that end, the distance      a finite format allows: the
//                          from it to the end value                end code stands for all
//                                                                  values beyond it
//
// so |original − dequantized| ≤ radius for every element of a round-to-nearest quantizer. The
// radii depend only on the codes, the scales and (for the saturated ends) the originals,
// never on the output of the GEMM being checked.
#pragma once

#include <cstdint>
#include <vector>

#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"

namespace qgemm::check {

// Radii of every weight element, row-major [n, k]. `original` is the fp32 weight that was
// quantized, `dequantized` = dequantize_weight(weight).
std::vector<double> weight_error_radii(const PackedWeight& weight, const float* original,
                                       const std::vector<double>& dequantized);

// Radii of every activation element, row-major [m, k] (unquantized fp16/bf16 activations:
// the rounding of the original to that format).
std::vector<double> activation_error_radii(const PackedActivation& activation,
                                           const float* original,
                                           const std::vector<double>& dequantized);

// Unit roundoff of a format: 2^-(mantissa+1) for floats; integers accumulate exactly (0).
double unit_roundoff(const Format& format);

// sqrt(Σ half_ulp(output, c)²): the largest Frobenius norm of the error that rounding each
// element of `rounded` (values of `output`) can have made.
double output_rounding_bound(const Format& output, const std::vector<double>& rounded);

// Element-wise bounds on |C_backend − C_ref| for a backend that multiplies the very operands
// the reference multiplies (A_q [m, k], W_q [n, k]: their exact dequantized values, row-major)
// through its own arithmetic, C_ref being their exact product rounded once to `output`:
//
//   bound[r, c] = λ·sqrt( Σ_k (a_k·w_k)²·(u_a² + u_w²) + k·u_acc²·Σ_k (a_k·t_k)² )
//                 + 4·u_acc·|C_ref[r, c]| + 2·half_ulp(output, |C_ref[r, c]| + the above)
//
//   u_a, u_w  the relative rounding of each activation / weight operand on its way into the
//             multiply (0 where the operand is exact)
//   u_acc     the accumulator's unit roundoff; t_k the magnitude of what is accumulated in
//             place of w_k (|w_k|, or more where codes are summed lifted and the offset is taken
//             off afterwards); k additions, each off by at most u_acc of a partial sum
//   λ = 8     operand rounding errors are at most u·|a_k·w_k| each and, against random
//             symmetric activations, of independent sign: by Hoeffding their sum exceeds
//             λ·sqrt(Σ (u·a_k·w_k)²) with probability ≤ 2·exp(−λ²/2) ≈ 3e-14 per element; the
//             accumulation term is the same random-sign model, not a worst case
//   4·u_acc   a few fp32 products in the epilogue (scales, row factors, split-K sums)
//   the last  the backend's own rounding to `output`: two values δ apart round at most one
//             spacing further apart
//
// An error that depends on the kernel's indexing (a wrong scale, a lost group) is of the order
// of the affected terms themselves, far above u·|a·w|, so the bound separates the two.
struct OperandRounding {
  double activation = 0;         // u_a
  double weight = 0;             // u_w
  double accumulator = 0x1p-24;  // u_acc (fp32)
};
std::vector<double> backend_error_bounds(const std::vector<double>& a, const std::vector<double>& w,
                                         const std::vector<double>& accumulated_w, std::int64_t m,
                                         std::int64_t n, std::int64_t k,
                                         const OperandRounding& rounding, const Format& output,
                                         const std::vector<double>& reference);

double frobenius_norm(const std::vector<double>& values);
double frobenius_norm(const float* values, std::int64_t count);
// ||a − b||_F over equally sized vectors.
double frobenius_distance(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace qgemm::check
