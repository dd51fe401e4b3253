// `qgemm check` and `qgemm demo` as a library function, so that the CLI and the tests run the
// same thing.
//
// run_check draws random inputs from `seed` (weights ~ N(0, 0.02²) with one element in 512
// an 8× outlier, activations ~ N(0, 1)), quantizes them per the scheme, runs the backend and
// measures
//
//   error_vs_exact       ||C_backend − A·Wᵀ||_F / ||A·Wᵀ||_F, A and W the unquantized fp32
//                        inputs multiplied exactly (in double): the quantization error
//   error_vs_reference   ||C_backend − C_ref||_F / ||C_ref||_F, C_ref = reference::gemm of the
//                        same quantized operands: the backend's own error
//
// against tolerances derived from the formats (error_bounds.hpp), never from the measurement:
//
//   ε_w = sqrt(Σ radius_w²) / ||W||_F      ε_a = sqrt(Σ radius_a²) / ||A||_F
//   ε_o = sqrt(Σ half_ulp(output, C_ref)²) / ||A·Wᵀ||_F
//   tolerance_vs_exact = safety · (ρ·(ε_w + ε_a + ε_w·ε_a) + ε_o)    (+ tolerance_vs_reference)
//   ρ = ||A||_F·||W||_F / (√k·||A·Wᵀ||_F)
//
// Why this bounds the output: A·Wᵀ − A_q·W_qᵀ = A·ΔWᵀ + ΔA·Wᵀ + ΔA·ΔWᵀ, and the radii bound
// ||ΔW||_F and ||ΔA||_F. For check's independent Gaussian inputs ||A·ΔWᵀ||_F ≈
// ||A||_F·||ΔW||_F/√k (in expectation over A), and the same for ΔA against the iid weights; the
// exact product itself is ≈ ||A||_F·||W||_F/√k, and ρ corrects for the draws (few outputs) where
// it came out smaller, which would otherwise inflate every relative error. The radii are worst
// cases per element (a uniform rounding error has RMS radius/√3), which leaves room; `safety` =
// 1.25 + 3/√(m·n) covers the sampling spread of a norm over m·n outputs.
//
// A non-reference backend must also stay within
//   tolerance_vs_reference = safety · (δ + sqrt(4·ε'_o·δ))
//   δ = 2·u_operand + 2·√k·u_accumulator·R
// δ is how far its unrounded outputs may drift from the reference's (relative): u is the unit
// roundoff 2^-(mantissa+1) of the format its dequantized operands are rounded to and of its
// accumulator, R = || |A_q|·|W_q|ᵀ ||_F / ||C_ref||_F the magnitude accumulation errors scale
// with, √k for errors of random sign. Two values δ apart round differently (by up to two
// half-steps h) only where a rounding boundary falls between them, with probability ~δ/(2h):
// E[difference²] ≤ 4·h·δ per element, hence the square root with ε'_o = sqrt(Σh²)/||C_ref||.
// The reference backend itself must reproduce reference::gemm exactly (tolerance 0).
#pragma once

#include <cstdint>
#include <string>

#include "check/backend.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::check {

struct ErrorBudget {
  double weight = 0;      // ε_w
  double activation = 0;  // ε_a
  double output = 0;      // ε_o
  double norm_ratio = 0;  // ρ = ||A||_F·||W||_F / (√k·||A·Wᵀ||_F), ≈ 1 for random inputs
  double safety_factor = 0;
};

struct CheckResult {
  Scheme scheme;
  std::int64_t m = 0, n = 0, k = 0;
  std::string backend;  // the backend's name
  std::uint64_t seed = 0;
  double error_vs_exact = 0, tolerance_vs_exact = 0;
  double error_vs_reference = 0, tolerance_vs_reference = 0;
  ErrorBudget budget;
  bool pass = false;
  double time_ms = 0;                    // one backend GEMM (mean of the timed runs)
  double gflops = 0;                     // 2·m·n·k / time
  std::int64_t packed_weight_bytes = 0;  // codes + scales + zeros
  MatrixPlacement placement;
  std::int64_t outside_writes = 0;  // elements around C the backend changed (a failure)
};

// A seed for a fresh run (std::random_device).
std::uint64_t fresh_seed();

// Validates scheme, shape and placement (qgemm::Error naming them), then runs as described
// above, A and C placed on the device as `placement` says (every element around C must stay
// untouched).
CheckResult run_check(const Scheme& scheme, std::int64_t m, std::int64_t n, std::int64_t k,
                      GemmBackend& backend, std::uint64_t seed,
                      const MatrixPlacement& placement = {});

// One JSON object: scheme (text form), preset, m, n, k, backend, seed, errors, tolerances,
// pass, time_ms, gflops, packed_weight_bytes, placement, outside_writes.
std::string to_json(const CheckResult& result);

}  // namespace qgemm::check
