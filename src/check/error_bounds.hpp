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

// sqrt(Σ half_ulp(output, c)²): the largest Frobenius norm of the error that rounding each
// element of `rounded` (values of `output`) can have made.
double output_rounding_bound(const Format& output, const std::vector<double>& rounded);

double frobenius_norm(const std::vector<double>& values);
double frobenius_norm(const float* values, std::int64_t count);
// ||a − b||_F over equally sized vectors.
double frobenius_distance(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace qgemm::check
