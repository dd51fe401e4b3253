// `qgemm check --moe` and `qgemm sweep --moe`: a whole routed expert layer (Engine::moe) on random
// expert weights, hidden states and routings against reference::moe_layer, element by element;
// the MoE GPU tests (tests/gpu/test_moe_layer.cpp) take their bounds from here too.
//
// Bounds, element by element. The layer rounds where the reference does (gate_up rows and the
// activation to the hidden type u, the result once to the output's) but its GEMMs multiply each
// weight rounded to the 16-bit operand (relative u each) and accumulate in fp32, and its GLU
// runs in fp32. Every gate_up value g may then differ from the reference's by
//   dg = λ·u·sqrt(Σ_k (a_k w_k)²) + K·2^-24·Σ_k |a_k w_k| + 2u·|g|
// (weight roundings of independent sign, λ = 8 as in error_bounds.hpp; fp32 accumulation at
// its worst; one rounding flip), which moves h by at most |∂h/∂gate| dg_gate + |∂h/∂up| dg_up
// plus one rounding of h (dh). The down GEMM carries those of independent sign,
// λ·sqrt(Σ_k (D[n][k] dh_k)²), plus its own weight rounding λ·u·sqrt(Σ_k (D (|h| + dh))²) and
// accumulation; the top-k sum weights each choice by its router weight, and the output rounds
// once (2·u_out·|y|, + 1e-6). The GLUs' slopes: |silu'|, |gelu'| ≤ 1.13, and
// |d(g σ(αg))/dg| ≤ 1.1 for α ≤ 1.702, so 1.2 · (|up| + 1 + dg_up) bounds ∂h/∂gate and
// |gate| + dg_gate bounds ∂h/∂up for all three. A wrong expert, bias, half or row moves whole
// rows by O(|y|), far above this (MoeCheck.BoundsPassTheReferenceAndCatchEachFault).
//
// A scheme with quantized activations: the reference multiplies the hidden states' exact
// dequantized values (the host quantizer's codes, which the layer's GPU quantizer reproduces
// bit for bit); the layer multiplies code · scale rounded once to the hidden type, one more
// rounding of relative u per product, of independent sign: u² more in dg's squares.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "check/backend.hpp"
#include "qgemm/moe.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::check {

// One layer: `scheme` quantizes both expert sets; its activation format is the hidden states'
// type (bf16/fp16), or, where it quantizes them, `quantized_from` is (the layer quantizes the
// hidden states from it); its output is the layer's output type.
struct MoeCase {
  Scheme scheme;
  std::int64_t tokens = 16, hidden = 512, inter = 256;
  int experts = 16, top_k = 4;
  GluActivation glu;
  bool bias = false;
  Format quantized_from = formats::bf16;
};
// The hidden states' (and the intermediate's) 16-bit type.
Format hidden_type(const MoeCase& c);
std::string describe(const MoeCase& c);  // "w4a16 M=16 E=16 top4 H=512 I=256 silu bf16->bf16"
// Error(InvalidArgument) naming the field and the rule.
void validate(const MoeCase& c);

// A layer's host inputs: what a backend runs and the reference multiplies.
struct MoeInputs {
  MoeCase shape;
  PackedActivation hidden_input;               // [tokens, hidden] in hidden_type: the layer's
  PackedActivation hidden;                     // ... quantized as the scheme says: the reference's
  std::vector<PackedWeight> gate_up, down;     // E of [2·inter, hidden] and [hidden, inter]
  reference::MoeRouting routing;               // distinct experts per token, weights in (0, 1]
  std::vector<float> gate_up_bias, down_bias;  // [E · 2·inter], [E · hidden], or empty
};
// Weights ~ N(0, 1/k) per row of length k, hidden states ~ N(0, 1), biases ~ N(0, 0.25),
// router weights ~ U(0.05, 1), all from `seed`.
MoeInputs draw_moe_inputs(const MoeCase& c, std::uint64_t seed);

// The reference's output [tokens, hidden] and each element's bound (the derivation above).
// Routing weights of 0 (choices of another rank's expert) contribute nothing, exactly.
struct MoeExpected {
  std::vector<double> values, bounds;
};
// `input`: the 16-bit type of the hidden states and of the intermediate.
MoeExpected expect_moe_layer(const Scheme& scheme, const PackedActivation& hidden,
                             const Format& input, const std::vector<PackedWeight>& gate_up,
                             const std::vector<PackedWeight>& down,
                             const reference::MoeRouting& routing, const GluActivation& glu,
                             const float* gate_up_bias, const float* down_bias);

struct MoeCheckResult {
  MoeCase shape;
  std::string backend;
  std::uint64_t seed = 0;
  std::int64_t outside = 0;     // elements beyond their bound (NaN counts)
  std::int64_t non_finite = 0;  // NaN / Inf outputs (unwritten ones stay NaN)
  double worst = 0;             // the largest |got − expected| / bound over finite outputs
  double relative = 0;          // ||got − expected|| / ||expected|| over finite outputs
  bool pass = false;
  double time_ms = 0;  // the backend's one call
};
MoeCheckResult run_moe_check(const MoeCase& c, GemmBackend& backend, std::uint64_t seed);
std::string to_json(const MoeCheckResult& result);

}  // namespace qgemm::check
