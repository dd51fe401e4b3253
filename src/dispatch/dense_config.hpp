// Configurations of the mma.sync dense GEMM kernels and how one is chosen for a problem.
//
// Two kernels: the tiled GEMM (kernels/gemm/sm80_dense.cuh, any M) and the streamed decode GEMM
// (kernels/gemm/sm80_decode.cuh, M <= 16); and the dequantize + cuBLAS path
// (kernels/gemm/dequant_cublas.cuh), which serves every weight the layout holds and is the
// faster one for large M until the wgmma kernels come. DenseGemmConfig mirrors their template
// constants; the launch shape (threads, shared memory) is computed here from the same formulas as
// the kernels' DenseGemmShape / DecodeGemmShape, and the kernels static_assert that the spec's
// values agree.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/gpu_limits.hpp"
#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::dispatch {

enum class DenseKernel {
  Tiled,          // block tiles through a block-wide cp.async pipeline (sm80_dense.cuh)
  Streamed,       // M <= 16: every warp streams its own K range (sm80_decode.cuh)
  DequantCublas,  // N chunks dequantized to 16 bits, multiplied by cuBLAS (dequant_cublas.cuh)
};

struct DenseGemmConfig {
  std::string name;  // "decode", "medium", "prefill", ...
  DenseKernel kernel = DenseKernel::Tiled;
  // Tiled: warps (k, m, n) of a block. Streamed: warps_k warps per block, each on its own K range.
  int m_tiles = 1, warps_m = 1, warps_n = 1, warps_k = 4;
  // K per pipeline stage (tiled: of the block; streamed: of each warp), and stages in flight.
  int block_k = 256, stages = 4;
  // Residency target: the kernel's __launch_bounds__ minimum (it caps registers) and the
  // split-K heuristic's expectation (further capped by shared memory).
  int blocks_per_sm = 2;
  // Bytes of an A element the tiled kernel's mma takes: 2 (bf16/fp16) or 1 (int8/e4m3 codes,
  // mma.m16n8k32: the "-a8" configs).
  int operand_bytes = 2;

  int threads() const { return 32 * warps_m * warps_n * warps_k; }
  int block_m() const { return 16 * m_tiles * warps_m; }
  int block_n() const { return 64 * warps_n; }
  // `rows`: the streamed kernel's A rows (a power of two up to 16); ignored by the tiled one.
  int shared_bytes(const layout::MmaWeight& weight, int rows) const;
  // Why this config cannot serve (M, weight, activation type) on `gpu` (nullopt when it can).
  std::optional<std::string> unsupported_reason(std::int64_t m, const layout::MmaWeight& weight,
                                                const Format& activation,
                                                const GpuLimits& gpu) const;
};

const std::vector<DenseGemmConfig>& dense_gemm_configs();

// What one launch needs besides the config.
struct DensePlan {
  DenseGemmConfig config;
  int splits = 1;
  int tiles_per_split = 0;  // tiled: K tiles of one split
  int k_tiles = 0;          // tiled: K tiles in all
  int rows = 16;  // streamed: A rows of the instantiation (M rounded up to 1, 2, 4, 8, 16)
  int blocks_per_warp = 0;   // streamed: k16 blocks of one warp
  std::int64_t chunk_n = 0;  // dequant + cuBLAS: weight rows dequantized per cuBLAS call
  unsigned grid_x = 1, grid_y = 1;
};

// Picks the config and split-K factor for (M, prepared weight) on `gpu`. Every rule that removes a
// candidate says why at QGEMM_LOG_LEVEL >= 3. A non-empty `forced` names the config to use
// (benches, the tuner); Error when it cannot serve.
DensePlan plan_dense_gemm(std::int64_t m, const layout::MmaWeight& weight, const Format& activation,
                          const GpuLimits& gpu, std::string_view forced = {});

// The type the GEMM's mma takes for activations quantized as `quant` (whose 16-bit operand is
// `operand16`): their 8-bit codes (int8, e4m3; per token or per tensor, so that one row factor
// scales a row) for 16 < M <= 256, where the "-a8" configs win, when they serve on `gpu`; else
// `operand16` (the decode kernel below, dequant + cuBLAS above). A non-empty `forced`
// config decides by its operand width. Why the 8-bit codes are not taken is logged at
// QGEMM_LOG_LEVEL >= 2.
Format dense_operand(std::int64_t m, const layout::MmaWeight& weight, const ActivationQuant& quant,
                     const Format& operand16, const GpuLimits& gpu, std::string_view forced = {});

// The KernelSpec of a plan for an activation type (bf16/fp16) and output format (for
// dequant + cuBLAS: its dequantization kernel).
jit::KernelSpec dense_gemm_spec(const DensePlan& plan, const layout::MmaWeight& weight,
                                const Format& activation, const Format& output, jit::Arch arch);

// The dequant + cuBLAS path's finishing kernel: fp32 sums (+ bias) -> C in `output`.
jit::KernelSpec finish_gemm_spec(const Format& output, jit::Arch arch);

}  // namespace qgemm::dispatch
