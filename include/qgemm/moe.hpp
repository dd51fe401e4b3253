// Mixture-of-experts routing on the GPU (issue #17, part 3): the router's top-k expert ids become
// the "indexed" layout a grouped GEMM reads (each expert's slots contiguous and padded to the
// GEMM's token tile, a block -> expert map, and the inverse permutation the top-k reduction
// needs), with every size kept on the device so that a whole layer captures into a CUDA graph and
// replays for any routing.
//
//   slot s = token · top_k + choice, routed to global expert ids[s]; local expert
//   e = expert_map[ids[s]] (the identity without a map; −1: held by another rank)
//
//   sorted_slots  [capacity]  expert 0's slots, padding, expert 1's slots, padding, ...; the
//                             padding (and the unused tail) holds the sentinel tokens · top_k
//   offsets       [local_experts + 1]  where each expert's run starts; offsets[local_experts] =
//                             the padded total (≤ capacity)
//   counts        [local_experts]      slots per expert
//   block_experts [capacity / block]   the expert of each block of `block` positions; −1 past
//                             the total
//   slot_positions [tokens · top_k]    where each slot went; −1 for another rank's expert
//   invalid_ids   [1]         slots whose id is outside [0, global_experts) or whose map entry is
//                             outside [−1, local_experts): routed nowhere (the host reads it when
//                             it wants to check; checking it in the call would synchronize)
//
// The order of slots inside an expert's run is not defined (atomics); each row of the GEMM is
// computed on its own, so results do not depend on it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qgemm {

struct MoeRoutingShape {
  std::int64_t tokens = 0;
  int top_k = 1;           // 1 ..
  int global_experts = 0;  // ids are in [0, global_experts)
  int local_experts = 0;   // experts on this rank, 1 .. 512 (= global_experts without a map)
  int block = 16;          // the grouped GEMM's token tile: runs are padded to a multiple
};

// Positions of sorted_slots: round_up(tokens · top_k + local_experts · (block − 1), block).
std::int64_t moe_routing_capacity(const MoeRoutingShape& shape);
// Device memory route_moe needs (its arrays, 256-byte aligned each).
std::size_t moe_routing_workspace_bytes(const MoeRoutingShape& shape);

// Views into the workspace given to Engine::route_moe (device pointers).
struct MoeIndexedRouting {
  MoeRoutingShape shape;
  std::int64_t capacity = 0;
  const std::int32_t* sorted_slots = nullptr;
  const std::int32_t* offsets = nullptr;
  const std::int32_t* counts = nullptr;
  const std::int32_t* block_experts = nullptr;
  const std::int32_t* slot_positions = nullptr;
  const std::int32_t* invalid_ids = nullptr;
};

}  // namespace qgemm
