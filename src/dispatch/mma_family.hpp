// The mma.sync kernel family (SM80+) on the prepared mma layout (kernels/gemm/
// mma_weight_layout.cuh): its tile configs, the rules that say which problems a config can serve,
// and the launch geometry and kernel spec of a config for a problem.
//
//   tiled     kernels/gemm/sm80_dense.cuh   block tiles through a block-wide cp.async pipeline,
//                                           any M; 16-bit operands, or int8/e4m3 codes through
//                                           mma.m16n8k32 (the "-a8" configs)
//   streamed  kernels/gemm/sm80_decode.cuh  M ≤ 16: every warp streams its own K range; grouped
//                                           (MoE): one token block of 8 or 16 routed rows per
//                                           grid.y, its expert from the routing, one K split
//
// Threads and shared memory come from the kernels' own shape headers (sm80_dense_shape.cuh,
// sm80_decode_shape.cuh), evaluated here on the same values the spec passes to the template.
// Which config a call uses is the selector's business (dispatch/select.hpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/gpu_limits.hpp"
#include "gemm/sm80_decode_shape.cuh"
#include "gemm/sm80_dense_shape.cuh"
#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"

namespace qgemm::dispatch {

enum class MmaKernel { Tiled, Streamed };

struct MmaConfig {
  std::string name;  // "decode", "medium", "prefill-a8", ... (the tuning tables' key)
  MmaKernel kernel = MmaKernel::Tiled;
  kernels::DenseTile tile;     // tiled
  kernels::DecodeTile decode;  // streamed (rows: set from M)
  // Residency target: the kernel's __launch_bounds__ minimum (it caps registers) and the
  // split heuristic's expectation (further capped by shared memory).
  int blocks_per_sm = 1;
  // Bytes of an A element the tiled kernel's mma takes: 2 (bf16/fp16) or 1 (int8/e4m3 codes).
  int operand_bytes = 2;
  // Why the selector ranks this config only when it is forced (as WgmmaConfig::held_back);
  // empty: ranked like the rest.
  std::string held_back = {};

  int threads() const;
  int block_m() const;  // tiled: BM; streamed: 16 (one batch of up to 16 rows)
  int block_n() const;  // tiled: BN; streamed: one 64-column slice
  // `rows`: the streamed kernel's A rows (ignored by the tiled one).
  int shared_bytes(const layout::MmaWeight& weight, int rows) const;
  // Why this config cannot serve M rows of `operand` (bf16/fp16, or int8/e4m3 codes) against
  // `weight` on `gpu`; nullopt when it can.
  std::optional<std::string> unsupported_reason(std::int64_t m, const layout::MmaWeight& weight,
                                                const Format& operand,
                                                const GpuLimits& gpu) const;
};

const std::vector<MmaConfig>& mma_configs();
const MmaConfig* find_mma_config(std::string_view name);  // null when there is none

// One config's launch for a problem. A plan fixes it per M bucket at the bucket's largest M
// (the split and the kernel instantiation); a run sets only the grid's M dimension.
struct MmaLaunch {
  int splits = 1;
  int tiles_per_split = 0;   // tiled: K tiles of one split
  int k_tiles = 0;           // tiled: K tiles in all
  int rows = 16;             // streamed: A rows of the instantiation (1, 2, 4, 8 or 16)
  int blocks_per_warp = 0;   // streamed: k16 blocks of one warp
  unsigned grid_x = 1;       // column tiles (tiled) or 64-column slices (streamed)
  int resident_per_sm = 1;   // blocks of this config an SM holds
  // Streamed, grouped (MoE): grid.y walks the routing's token blocks of `rows` rows (rows = 8 or
  // 16, dividing the routing block), every block one expert's slice; one split.
  bool grouped = false;
  // Which prepared weight the kernel reads: the mma layout, or (streamed only) the wgmma order.
  layout::FragmentOrder order = layout::FragmentOrder::Mma;
  // Blocks in flight for M rows (for the cost model's occupancy).
  std::int64_t blocks(const MmaConfig& config, std::int64_t m) const;
  // Grouped: m is the routing's capacity (token blocks = capacity / rows).
  unsigned grid_y(const MmaConfig& config, std::int64_t m) const;
};

MmaLaunch mma_launch(const MmaConfig& config, std::int64_t m, const layout::MmaWeight& weight,
                     const GpuLimits& gpu);

// The streamed kernel's token block in grouped mode: 8 rows when an expert expects ≤ 8 routed
// rows, else 16; with a routing block fixed by the caller (the down GEMM takes gate_up's), the
// preferred rows when they divide it, else 8 when 8 does; 0 when neither divides it.
int grouped_decode_rows(std::int64_t rows_per_expert, int route_block);

// The streamed config's grouped launch for `slots` routed rows of `experts` experts whose
// routing blocks are `route_block` rows (0: the kernel's own token block): every 64-column
// slice of the one expert weight `weight` (prepare_experts' per-expert metadata) × every token
// block of the capacity, one K split (a split's partial sums would cover the whole capacity).
// Error(Unsupported) when no token block divides route_block.
MmaLaunch grouped_mma_launch(const MmaConfig& config, std::int64_t slots, int experts,
                             int route_block, const layout::MmaWeight& weight,
                             const GpuLimits& gpu);

// Split-K scratch of a launch at M rows: fp32 sums [M, N] and one counter per output tile,
// which the kernels leave zero (0 without split-K).
std::size_t mma_zeroed_bytes(const MmaConfig& config, const MmaLaunch& launch, std::int64_t m,
                             const layout::MmaWeight& weight);

// `glu`: a grouped launch's fused GLU (GemmProblem::glu; the streamed kernel only).
jit::KernelSpec mma_spec(const MmaConfig& config, const MmaLaunch& launch,
                         const layout::MmaWeight& weight, const Format& operand,
                         const Format& output, jit::Arch arch,
                         const std::optional<GluKind>& glu = std::nullopt);

}  // namespace qgemm::dispatch
