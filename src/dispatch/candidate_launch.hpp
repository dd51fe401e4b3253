// What a chosen candidate launches for a problem at M rows: how A becomes the GEMM's operand,
// the kernel specs (to compile, or to print in `qgemm explain`) and each path's launch geometry.
// The Engine turns it into a plan step by loading the kernels; nothing here needs a GPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dispatch/mma_family.hpp"
#include "dispatch/qdq_family.hpp"
#include "dispatch/select.hpp"

namespace qgemm::dispatch {

// How A becomes the GEMM's operand.
enum class ActivationPrep {
  None,      // A is the operand (unquantized activations, or codes cuBLASLt reads as they are)
  Quantize,  // bf16/fp16 A quantized on the GPU (kernels/util/quantize_activation.cuh)
  Expand,    // codes quantized beforehand, expanded (the expand_activation kernel)
};

struct CandidateLaunch {
  Path path = Path::Qdq;
  const MmaConfig* config = nullptr;
  Format operand;  // A's type at the GEMM
  ActivationPrep prep = ActivationPrep::None;
  bool row_factors = false;  // the GEMM applies per-row factors (mma epilogue, qdq finish)
  // The activation prep multiplies them into the operand instead (qdq_folds_row_factors).
  bool fold_row_factors = false;
  // The GEMM reads the activation codes' 1x128 group scales (the FP8 wgmma configs on
  // fp8-block's activations): the quantizer writes them beside the codes, pre-quantized codes
  // bring them.
  bool group_scales = false;
  std::optional<jit::KernelSpec> prepare, absmax;       // the activation step
  std::optional<jit::KernelSpec> gemm;                  // mma and wgmma paths
  std::optional<jit::KernelSpec> dequantize, finish;    // qdq
  MmaLaunch mma;
  WgmmaLaunch wgmma;  // the wgmma path (its config: verdict.candidate->wgmma)
  const WgmmaConfig* wgmma_config = nullptr;
  QdqLaunch qdq;

  std::vector<jit::KernelSpec> specs() const;  // every kernel, in launch order
  std::string text() const;  // the specs and library calls, e.g. "... + cuBLAS (1 chunk ...)"
};

// `static_activation_scale`: StaticTensor's calibrated scale (≤ 0: the tensor's absmax, which
// takes one more kernel).
CandidateLaunch candidate_launch(const GemmProblem& problem, std::int64_t m,
                                 const Verdict& verdict, const WeightFacts& weight,
                                 const GpuLimits& gpu, double static_activation_scale);

// Every kernel `problem` can launch over its M range on `gpu` (each bucket's winner, judged from
// the scheme alone: WeightFacts::of_scheme), without duplicates: what deployments compile ahead
// (`qgemm cache prewarm --recipe`, `qgemm compile --all`, Engine::warm_up). `every_m`: also each
// M's own winner, what Engine::gemm launches (it plans each M on its own, and an M's winner may
// differ from its bucket's, judged at the bucket's largest M).
std::vector<jit::KernelSpec> problem_specs(const GemmProblem& problem, const WeightFacts& weight,
                                           const SelectionContext& context,
                                           double static_activation_scale = 0.0,
                                           bool every_m = false);

// Every kernel qgemm ships for `arch` (`qgemm compile --all`, `qgemm cache prewarm`): the
// utility kernels (jit::catalog_specs), and the GEMM kernels every preset scheme selects at a
// 4096 x 4096 layer for M = 1 .. 8192 on `gpu` (the cost model's choices, no tuning table).
std::vector<jit::KernelSpec> kernel_catalog(const GpuLimits& gpu);

}  // namespace qgemm::dispatch
