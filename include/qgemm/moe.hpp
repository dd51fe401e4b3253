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
#include <string>

namespace qgemm {

struct MoeRoutingShape {
  std::int64_t tokens = 0;
  int top_k = 1;           // 1 ..
  int global_experts = 0;  // ids are in [0, global_experts)
  int local_experts = 0;   // experts on this rank, 1 .. 512 (= global_experts without a map)
  int block = 16;          // the grouped GEMM's token tile: runs are padded to a multiple
};

// Positions of sorted_slots: round_up(slots + min(local_experts, slots) · (block − 1), block),
// slots = tokens · top_k (only that many runs can be non-empty).
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

// Rows a caller has already grouped by expert (its own dispatch, e.g. expert-parallel
// all-to-all), for Engine::moe_gemm_grouped. Every array is on the device, read there (a call
// captures into a CUDA graph and replays for any grouping):
//   Contiguous  rows [M, K] sorted by expert: expert e's rows are offsets[e] .. offsets[e+1]−1
//               (int32 [experts + 1], non-decreasing; rows before offsets[0] or from
//               offsets[experts] on belong to no expert)
//   Masked      rows [experts · capacity, K], a fixed capacity per expert: expert e's rows are
//               e · capacity .. e · capacity + counts[e] − 1 (int32 [experts], each in
//               [0, capacity]); the rest belong to no expert
// Rows of no expert come out zero (zero_rows_of_no_expert = false: the call need not write
// them, so a masked layout's unused capacity costs nothing). A grouping that breaks its rule
// (offsets that fall, a count outside [0, capacity]) is seen on the device only: every row is
// then a row of no expert and, where `invalid_rows` is given, the call stores how many rows
// were routed nowhere for that reason (0 for a valid grouping; read it after the stream, as
// route_moe's invalid_ids).
//
// The kernels read the rows and write the output where they are (a table of token blocks per
// expert, built on the device) when rows_in's rows are 16-byte aligned, rows_out does not
// overlap them and, for experts with quantized activations, the rows are contiguous and their
// scales row-local; otherwise (or with QGEMM_GROUPED_IN_PLACE=0) the rows are gathered by
// expert and the results put back (QGEMM_LOG_LEVEL >= 2 says which path and why).
enum class MoeRowGrouping { Contiguous, Masked };
struct MoeGroupedRows {
  MoeRowGrouping grouping = MoeRowGrouping::Contiguous;
  const std::int32_t* offsets = nullptr;  // Contiguous
  const std::int32_t* counts = nullptr;   // Masked
  std::int64_t capacity = 0;              // Masked: rows per expert
  std::int32_t* invalid_rows = nullptr;   // device int32 [1], or null
  bool zero_rows_of_no_expert = true;
};

// The activation between an expert's gate_up GEMM (N = 2·I: gate rows 0 .. I−1, up rows
// I .. 2I−1) and its down GEMM: h[j] = f(gate[j], up[j]) for j < I.
//   Silu           silu(g) · u                      (Llama, Qwen, DeepSeek: SiLU-GLU)
//   Gelu           gelu(g) · u, the erf form        (GELU-GLU)
//   ClampedSwiglu  g' = min(g, limit), u' = clamp(u, −limit, limit),
//                  g' · sigmoid(alpha · g') · (u' + 1)   (gpt-oss: alpha 1.702, limit 7)
enum class GluKind { Silu, Gelu, ClampedSwiglu };
struct GluActivation {
  GluKind kind = GluKind::Silu;
  float alpha = 1.702f, limit = 7.0f;  // ClampedSwiglu only
};
const char* glu_kind_name(GluKind kind);  // "silu", "gelu", "clamped-swiglu"

// The one layout Engine::prepare_experts keeps an expert set in (one copy of the experts'
// bytes). The streamed mma.sync decode kernel in grouped mode (sm80_decode.cuh) reads either:
// a token block of 8 or 16 routed rows streams its expert's weight once, so it is the decode
// choice (few rows per expert; on SM90 it streams faster than the small wgmma tiles: H100,
// Qwen3-30B-A3B gate_up at 1-64 tokens 10-22 % faster than wgmma-8) and costs one weight pass
// per 16 rows beyond that.
//   Auto    the wgmma order on SM90 (decode kernel and wgmma tiles), the mma layout on
//           SM80-SM89 (their only grouped kernel)
//   Wgmma   SM90 only: as Auto there
//   Mma     the decode kernel only (on SM90 a decode-only expert set)
enum class ExpertLayout { Auto, Wgmma, Mma };
const char* expert_layout_name(ExpertLayout layout);  // "auto", "wgmma", "mma"

// What an expert set is for (Engine::prepare_experts).
//   Plain   any grouped GEMM: moe_gemm, moe_gemm_grouped, Engine::moe (with its GLU as a pass
//           of its own between the two GEMMs)
//   GateUp  the gate_up projection of Engine::moe (N = 2·I: gate rows, then up rows), kept with
//           gate and up rows interleaved so that the grouped GEMM applies the GLU in its
//           epilogue and writes the activation rows [rows, I] directly: one launch and a round
//           trip of the [rows, 2·I] rows less. Such a set serves Engine::moe only.
//           QGEMM_FUSED_GLU=0 prepares it as Plain (the separate pass), for comparisons.
enum class ExpertRole { Plain, GateUp };
const char* expert_role_name(ExpertRole role);  // "plain", "gate_up"

// Options of Engine::moe (a whole routed expert layer).
struct MoeOptions {
  GluActivation activation;
  const float* gate_up_bias = nullptr;  // device fp32 [experts, 2·I], or null (gpt-oss has both)
  const float* down_bias = nullptr;     // device fp32 [experts, hidden], or null
  // Expert parallelism: device int32 [global_experts], global id -> local id or -1 (held by
  // another rank: those choices contribute nothing); null: every expert is local.
  const std::int32_t* expert_map = nullptr;
  int global_experts = 0;  // 0: the weights' expert count
  // A candidate by name for both grouped GEMMs ("decode", "wgmma-16", ...: benches and tests;
  // it must serve both at their routing block), empty: the selector chooses.
  std::string gemm_candidate;
};

}  // namespace qgemm
