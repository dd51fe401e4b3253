// What a GemmPlan holds (include/qgemm/plan.hpp): per M bucket the selector's choice, ready to
// launch — its kernels loaded in the engine's context, its launch geometry fixed, its scratch
// laid out — so that Engine::run only picks the bucket and fills argument structs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/candidate_launch.hpp"
#include "qgemm/plan.hpp"
#include "runtime/cublaslt.hpp"
#include "runtime/kernel_loader.hpp"

namespace qgemm::detail {

// A prepared cuBLASLt FP8 call: its run sets scale pointers on the shared descriptor, so one
// thread at a time runs it.
struct Fp8Step {
  std::optional<runtime::Fp8Matmul> matmul;
  // Pre-quantized g128 codes: their scales into cuBLASLt's 1x128 layout (scratch code_scales).
  std::optional<runtime::Block1x128ScaleTranspose> code_scales;
  std::mutex mutex;
};

// Scratch of one step, as byte offsets into the scratch region (each 256-byte aligned), laid
// out for the step's largest M.
struct ScratchLayout {
  std::size_t operand = 0, row_factors = 0, absmax = 0;  // the prepared operand
  std::size_t group_scales = 0;  // its 1x128 group scales (CandidateLaunch::group_scales)
  std::size_t codes = 0, code_scales = 0;                 // cuBLASLt's FP8 operand
  std::size_t weight_chunk = 0, chunk_sums = 0;          // dequantize + cuBLAS
  std::size_t blas = 0;  // cuBLAS's or cuBLASLt's workspace
  std::size_t bytes = 0;
};

struct PlanStep {
  std::int64_t m_low = 0, m_high = 0;
  dispatch::CandidateLaunch launch;  // what the selector's winner launches (at m_high)
  std::int64_t ldo = 0;              // the prepared operand's row stride (elements)
  runtime::LoadedKernel prepare, absmax, gemm, dequantize, finish;  // of launch's specs
  std::shared_ptr<Fp8Step> fp8;  // cuBLASLt FP8
  ScratchLayout scratch;
  std::size_t zeroed_bytes = 0;  // split-K sums and counters

  // A grouped step's token tile: the routing block it needs by default (wgmma: the config's
  // tokens; the streamed decode kernel: its rows, 8 or 16), and the rows of an in-place table.
  int grouped_tile() const {
    if (launch.path == dispatch::Path::Wgmma) return launch.wgmma_config->block_m();
    return launch.mma.rows;
  }
};

struct PlanData {
  GemmProblem problem;
  std::vector<GemmPlan::Choice> choices;
  std::vector<PlanStep> steps;  // one per M bucket, ascending
  std::size_t scratch_bytes = 0, zeroed_bytes = 0;
  std::uint64_t key = 0;
  const void* engine = nullptr;  // the Engine::Impl that made it
  const void* weight = nullptr;  // the PreparedWeight it was made for
  std::string description;

  // The step of M (buckets ascend; the caller checked M against the problem's range).
  const PlanStep& step_for(std::int64_t m) const {
    const PlanStep* step = &steps.front();
    for (const PlanStep& s : steps)
      if (m >= s.m_low && m <= s.m_high) step = &s;
    return *step;
  }
};

}  // namespace qgemm::detail
