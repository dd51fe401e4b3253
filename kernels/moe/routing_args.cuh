// Arguments of the MoE routing kernels (moe/routing.cuh): a plain struct included by the kernels
// and by the host launcher (src/moe/routing.cpp), so both sides agree on its layout.
#pragma once

namespace qgemm::kernels {

// The step a moe_routing kernel performs (the `step` parameter of its spec).
// kMoeSmall: one block does every step (and the host's memsets), for routings of at most
// kMoeSmallSlots slots (decode), where six launches would cost more than the work.
enum MoeRoutingStep { kMoeCount = 0, kMoeOffsets = 1, kMoeScatter = 2, kMoeSmall = 3 };
inline constexpr long long kMoeSmallSlots = 2048;

// The "indexed" layout of routed tokens that the grouped GEMM reads (include/qgemm/moe.hpp):
//
//   slot s = token · top_k + choice, routed to global expert expert_ids[s], local expert
//   e = expert_map[that] (the identity without a map; −1: another rank's expert)
//
//   positions   0 .. offsets[1]−1          offsets[1] .. offsets[2]−1        ...  capacity−1
//   sorted      e = 0's slots, then pad    e = 1's slots, then pad           ...  unused
//   blocks      block_experts[p / block] = the local expert whose run holds p; −1 past the total
//
//   each expert's run is padded to a multiple of `block` (the GEMM's token tile) with the
//   sentinel `slots`; slot_positions[s] = where slot s went (−1: not on this rank), the inverse
//   the top-k reduction reads. The order of slots inside a run is not defined (atomics): every
//   row of the GEMM is computed on its own, so the result does not depend on it.
struct MoeRoutingArgs {
  const int* expert_ids;  // [slots] global expert ids
  const int* expert_map;  // [global_experts]: local id or −1; null: the identity
  long long slots;        // tokens · top_k
  int global_experts, local_experts;
  int block;            // the GEMM's token tile: each expert's run padded to a multiple
  long long capacity;   // positions: round_up(slots + local_experts · (block − 1), block)
  int* counts;          // [local_experts], zeroed before the count step
  int* offsets;         // [local_experts + 1]; offsets[local_experts] = the padded total
  int* cursors;         // [local_experts] scatter cursors (set by the offsets step)
  int* sorted_slots;    // [capacity]
  int* block_experts;   // [capacity / block]
  int* slot_positions;  // [slots]
  int* invalid_ids;     // [1]: count of ids outside [0, global_experts) (routed nowhere)
};

// Rows the caller already grouped by expert (Engine::moe_gemm_grouped, include/qgemm/moe.hpp):
//
//   contiguous  rows [rows, K]: expert e's rows are offsets[e] .. offsets[e+1]−1
//   masked      rows [experts · capacity, K]: row e · capacity + i is expert e's when
//               i < counts[e]
//
// A grouping breaks its rule when offsets fall or a count lies outside [0, capacity].
struct MoeRowGroupingArgs {
  const int* offsets;  // contiguous: [experts + 1], or null
  const int* counts;   // masked: [experts], or null
  long long capacity;  // masked: rows per expert
  long long rows;
  int experts;  // 1 .. 512
};

// Such rows become one top-1 id per row, which the routing steps above then lay out as any
// routing:
//
//   ids[r]    e for expert e's rows; `experts` for a row of no expert (before offsets[0], from
//             offsets[experts] on, or past a count), which map[experts] = −1 sends nowhere as
//             another rank's expert would; −1 for every row when the grouping breaks its rule:
//             counted in invalid_ids
//   map       [experts + 1] the identity, then −1 (the routing's expert_map)
struct MoeGroupIdsArgs {
  MoeRowGroupingArgs grouping;
  int* ids;  // [rows]
  int* map;  // [experts + 1]
};

// Rows the caller grouped, read where they are by the grouped GEMM (Engine::moe_gemm_grouped's
// in-place path: no gather, no put-back): a table of token blocks of `tile` rows (the kernel's
// token tile), each storing rows of one expert:
//
//   expert e's rows   first_e .. end_e − 1, clipped to [0, rows): contiguous offsets[e] ..
//                     offsets[e+1] − 1; masked e · capacity .. e · capacity + counts[e] − 1
//   its blocks        ceil((end_e − first_e) / tile), numbered after expert e − 1's (a scan)
//   block b, the j-th of expert e, stores rows r_j = first_e + j · tile .. + count − 1
//   (count = min(tile, end_e − r_j)):
//     block_experts[b]   e
//     row_blocks[3b + ·] its entry (MoeRowBlockField):
//       load0            the first of the `tile` rows of A it reads; its token l is row
//                        load0 + l of A and of C
//       skip             r_j − load0: its tokens before the expert's rows
//       count            the tokens from skip on that it stores
//   *routed_total     blocks · tile: the token positions the kernels walk, as the routing's
//
//   load0 = r_j, skip = 0, except where r_j + tile would pass the last row: there load0 =
//   max(0, rows − tile), so that a kernel reading `tile` whole rows (the decode kernel) stays
//   inside A when rows >= tile. The tokens it reads and does not store (the next expert's or no
//   expert's rows, or rows before r_j) are multiplied and never stored. A grouping that breaks
//   its rule gives no block. With `out` given, the rows of no expert (every row of a broken
//   grouping) are zeroed there.
// The fields of token block b in row_blocks: row_blocks[kMoeRowBlockFields · b + field].
enum MoeRowBlockField {
  kRowBlockLoad0 = 0,
  kRowBlockSkip = 1,
  kRowBlockCount = 2,
  kMoeRowBlockFields = 3
};

struct MoeRowBlocksArgs {
  MoeRowGroupingArgs grouping;  // rows < 2^31
  int tile;
  int* block_experts;  // [ceil(rows / tile) + experts]: at most that many blocks
  int* row_blocks;     // [ceil(rows / tile) + experts][kMoeRowBlockFields]
  int* routed_total;   // [1]
  int* invalid_rows;   // [1]: the rows of a broken grouping (0 for a valid one), or null
  void* out;           // [rows][ldo] elements of out_bytes (2 or 4), n columns; or null
  long long ldo;
  int n, out_bytes;
};

}  // namespace qgemm::kernels
