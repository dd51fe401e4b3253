// Host side of the MoE routing kernels (kernels/moe/routing.cuh): the shape's rules, the
// workspace layout, and the launches. Nothing here allocates or synchronizes.
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
  LoadedKernel count, offsets, scatter;
};

// Lays the arrays out in `workspace` (moe_routing_workspace_bytes(shape) bytes) and enqueues a
// memset of the counts and the three steps on `stream`.
MoeIndexedRouting launch_moe_routing(const MoeRoutingKernels& kernels, const MoeRoutingShape& shape,
                                     const std::int32_t* expert_ids, const std::int32_t* expert_map,
                                     void* workspace, std::size_t workspace_bytes, CUstream stream);

}  // namespace qgemm::runtime
