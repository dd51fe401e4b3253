// Host side of the MoE kernels: routing (kernels/moe/routing.cuh: the shape's rules, the
// workspace layout, the launches) and the glue around a grouped GEMM (kernels/moe/glue.cuh:
// gather, combine). Nothing here allocates or synchronizes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "qgemm/moe.hpp"
#include "runtime/kernel_loader.hpp"

namespace qgemm::runtime {

// Error(InvalidArgument) naming the field and the rule.
void check_moe_routing_shape(const MoeRoutingShape& shape);

struct MoeRoutingKernels {
  LoadedKernel count, offsets, scatter, small;
};

// Lays the arrays out in `workspace` (moe_routing_workspace_bytes(shape) bytes) and enqueues a
// memset of the counts and the three steps on `stream`.
MoeIndexedRouting launch_moe_routing(const MoeRoutingKernels& kernels, const MoeRoutingShape& shape,
                                     const std::int32_t* expert_ids, const std::int32_t* expert_map,
                                     void* workspace, std::size_t workspace_bytes, CUstream stream);

// A grouped GEMM's token blocks as its kernels read them (their grouped mode): block b of
// `tile` token positions belongs to expert block_experts[b / (route_block / tile)] and holds
// rows b · tile .. of A and C (the indexed layout, row_blocks null), or the rows the in-place
// table gives (row_blocks, route_block = tile); the kernels stop at *routed_total positions,
// the launch covers `positions`.
struct MoeGroupedBlocks {
  const std::int32_t* block_experts = nullptr;
  const std::int32_t* routed_total = nullptr;
  const std::int32_t* row_blocks = nullptr;
  std::int64_t positions = 0;
  int route_block = 0;
  std::int64_t slots = 0;  // the rows the plan's step is chosen by
  int experts = 0;
  GluActivation glu;  // a fused GLU's alpha and limit (the plan's problem.glu names its kind)

  static MoeGroupedBlocks of(const MoeIndexedRouting& routing);
};

// Rows the caller grouped by expert -> one top-1 id per row and the map the routing sends them
// through (kernels/moe/routing_args.cuh, MoeGroupIdsArgs): ids [rows], map [experts + 1] of
// device int32; `kernel` from jit::moe_group_ids_spec. Validates the grouping's host fields.
void launch_moe_group_ids(const LoadedKernel& kernel, const MoeGroupedRows& groups,
                          std::int64_t rows, int experts, std::int32_t* ids, std::int32_t* map,
                          CUstream stream);

// Rows the caller grouped by expert, read in place: the table of token blocks of `tile` rows
// (kernels/moe/routing_args.cuh, MoeRowBlocksArgs) laid out in `workspace`
// (moe_row_blocks_bytes), and its kernel enqueued (jit::moe_row_blocks_spec). `zero_out`
// non-null: the rows of no expert of that output ([rows][ld_out] elements of out_bytes, n
// columns) are zeroed too. Validates the grouping's host fields.
std::int64_t moe_row_blocks_max(std::int64_t rows, int experts, int tile);
std::size_t moe_row_blocks_bytes(std::int64_t rows, int experts, int tile);
MoeGroupedBlocks launch_moe_row_blocks(const LoadedKernel& kernel, const MoeGroupedRows& groups,
                                       std::int64_t rows, int experts, int tile, void* workspace,
                                       std::size_t workspace_bytes, void* zero_out,
                                       std::int64_t ld_out, std::int64_t n, int out_bytes,
                                       CUstream stream);

// rows_out[p] = input[sorted_slots[p] / top_k] (16-bit rows of `columns`; zero for padding) for
// p below the padded total the device holds; `kernel` from jit::moe_gather_spec.
void launch_moe_gather(const LoadedKernel& kernel, const MoeIndexedRouting& routing,
                       const void* input, std::int64_t ld_input, std::int64_t columns,
                       void* rows_out, std::int64_t ld_rows, CUstream stream);
// output[t] = Σ_j weights[t·top_k + j] · rows[slot_positions[t·top_k + j]] in fp32, in choice
// order, rounded once (null weights: all 1); `kernel` from jit::moe_combine_spec (the rows' and
// the output's types).
void launch_moe_combine(const LoadedKernel& kernel, const MoeIndexedRouting& routing,
                        const void* rows, std::int64_t ld_rows, const float* weights,
                        std::int64_t columns, void* output, std::int64_t ld_output,
                        CUstream stream);

// rows_out[p][c] = glu(rows[p][c], rows[p][columns + c]) for p below the padded total the
// device holds (columns = I; rows [capacity][ld_rows] with ld_rows >= 2 I); `kernel` from
// jit::moe_glu_spec.
void launch_moe_glu(const LoadedKernel& kernel, const MoeIndexedRouting& routing,
                    const GluActivation& activation, const void* rows, std::int64_t ld_rows,
                    std::int64_t columns, void* rows_out, std::int64_t ld_out, CUstream stream);

}  // namespace qgemm::runtime
