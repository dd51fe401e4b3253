// Plans: what a GEMM call will run, chosen once and reused.
//
//   qgemm::GemmProblem problem;                     // the call, before any data exists
//   problem.m = 1; problem.m_max = 256;             // any M in [1, 256]
//   problem.n = N; problem.k = K; problem.scheme = scheme;
//   qgemm::GemmPlan plan = engine.plan(problem, weight, stream);   // compiles, sizes workspace
//   std::puts(plan.to_string().c_str());            // per M bucket: the winner, µs, why
//   engine.run(plan, {a, M, K, K, qgemm::formats::bf16}, weight, {c, M, N, N, scheme.output},
//              stream);                             // no allocation, sync or strings
//
// The selector (src/dispatch) enumerates every candidate that could serve the problem (each
// kernel family × tile config, dequantize + cuBLAS, cuBLASLt FP8 on 8-bit float weights), rejects
// those that cannot with one stated reason each, ranks the rest with a cost model (or the
// measured tuning table, include/qgemm/tuning.hpp) and keeps the fastest per M bucket (powers of
// two: 1, 2, 4, ..., so a plan for an M range holds a handful of choices).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qgemm/moe.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm {

// One GEMM call C[M, N] = A[M, K] · W[N, K]ᵀ (+ bias), described before it runs.
struct GemmProblem {
  std::int64_t m = 1;      // rows of A
  std::int64_t m_max = 0;  // > m: plan for every M in [m, m_max]; else exactly m
  std::int64_t n = 0, k = 0;
  // The weight's quantization, the activation quantization the call applies (or that codes
  // passed as a DeviceActivation already have) and the output format.
  Scheme scheme;
  // A as the caller passes it: a bf16/fp16 DeviceMatrix (quantized on the GPU when
  // scheme.activation is quantized), or codes quantized beforehand (a DeviceActivation).
  Format input = formats::bf16;
  bool prequantized = false;
  bool bias = false;
  // The largest power of two (bytes, up to 16) dividing A's pointer and row stride in bytes:
  // the tensor-core kernels copy A in 16-byte pieces, cuBLAS takes any element alignment.
  int a_alignment = 16;
  // C's row stride in elements (0: N, rows back to back): cuBLASLt's descriptors fix it.
  std::int64_t ldc = 0;
  // The largest power of two (bytes, up to 16) dividing C's pointer: the qgemm kernels write C
  // at any element alignment and row stride, cuBLASLt's FP8 kernels only from 16 bytes.
  int c_alignment = 16;
  // A candidate forced by name (benches, the tuner; `qgemm explain` lists them); empty: the
  // selector chooses.
  std::string candidate;
  // Grouped (MoE) GEMM over `experts` experts (a weight from Engine::prepare_experts): M counts
  // the routed slots (tokens · top_k), and A holds them in expert order, each expert's run
  // padded to whole routing blocks (qgemm/moe.hpp). route_block: the block the caller routes
  // with (a config whose token tile divides it is chosen); 0: the plan picks the tile and the
  // caller routes with it (GemmPlan::Choice::route_block). 0 experts: a dense GEMM.
  int experts = 0;
  int route_block = 0;
  // Engine::moe's gate_up GEMM over a set prepared with ExpertRole::GateUp: the GLU applied in
  // the GEMM's epilogue, which writes C [M, N / 2] (16-bit). Engine::moe sets it.
  std::optional<GluKind> glu;

  std::int64_t max_rows() const { return m_max > m ? m_max : m; }
};

// Checks a problem on its own (sizes, the scheme, input type, alignment); Error(InvalidArgument)
// names the field, its value and the rule.
void validate(const GemmProblem& problem);

// Caller-owned scratch memory for one run (device memory of the plan's engine, 256-byte
// aligned, at least GemmPlan::workspace_bytes()). Its split-K counters must be zero before the
// first run; every run leaves them zero. Empty: the engine's workspace of the run's stream.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

namespace detail {
struct PlanData;
}

// What the selector chose for a problem. Cheap to copy (shared, immutable), tied to the Engine
// that made it (its device and compiled kernels).
class GemmPlan {
 public:
  // One M bucket's choice.
  struct Choice {
    std::int64_t m_low = 0, m_high = 0;  // the M this choice serves, inclusive
    std::string candidate;               // "decode", "medium", "qdq", "cublaslt-fp8", ...
    std::string kernel;                  // the kernel spec(s) or library call it launches
    double predicted_us = 0;             // at m_high (measured µs when a tuning table chose)
    std::string reason;                  // why it won
    int route_block = 0;                 // grouped: the routing block its runs take
    // The operand format its GEMM takes A (and the dequantized weight) in: 16-bit (bf16 / fp16,
    // whose rounding the weight's values pay), or 8-bit codes (e4m3 / int8, exact).
    Format operand = formats::bf16;
  };

  GemmPlan() = default;
  explicit operator bool() const { return data_ != nullptr; }
  const GemmProblem& problem() const;
  std::vector<Choice> choices() const;
  const Choice& choice_for(std::int64_t m) const;  // Error unless m is in the problem's range
  // Scratch the plan's runs need from a caller's Workspace or the engine's per-stream one.
  std::size_t workspace_bytes() const;
  // A hash of the problem and the choices: equal plans have equal keys.
  std::uint64_t key() const;
  // "GemmPlan w4a16 M 1..256 N 4096 K 4096 (bf16 in, bf16 out) on sm_90a:\n  M 1: decode ..."
  std::string to_string() const;

 private:
  std::shared_ptr<const detail::PlanData> data_;
  friend class Engine;
};

}  // namespace qgemm
