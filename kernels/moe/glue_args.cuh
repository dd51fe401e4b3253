// Arguments of the MoE glue kernels (moe/glue.cuh): a plain struct shared with the host launcher
// (src/runtime/moe_routing.cpp), so both sides agree on its layout.
#pragma once

namespace qgemm::kernels {

// Which glue kernel (the `step` parameter of its spec).
enum MoeGlueStep { kMoeGather = 0, kMoeCombine = 1, kMoeGlu = 2 };
// The GLU of the glu step (include/qgemm/moe.hpp's GluKind, same order).
enum MoeGluKind { kGluSilu = 0, kGluGelu = 1, kGluClampedSwiglu = 2 };
// 16-bit element types of the glue's data (kernels::HalfTypeCode's order) and fp32 for outputs.
enum MoeGlueType { kMoeBf16 = 0, kMoeFp16 = 1, kMoeFp32 = 2 };

// gather:  rows[p][c] = input[sorted_slots[p] / top_k][c] for p < offsets[local_experts] (the
//          padded total, read on the device); the sentinel's rows (padding) are zero. rows has
//          capacity rows of ld_rows; positions past the total are not written (the grouped GEMM
//          skips their blocks).
// glu:     rows_out[p][c] = f(rows[p][c], rows[p][columns + c]) for p below the padded total
//          and c < columns (gate_up's rows: gate then up; f by glu_kind, in fp32), rounded once.
// combine: output[t][c] = Σ_j weights[t·top_k + j] · rows[slot_positions[t·top_k + j]][c] in
//          fp32, choices in order j = 0 .. top_k − 1 (the reference's order), a position −1 (an
//          expert of another rank) contributing nothing; then rounded once to the output type.
//          Null weights: every weight 1 (top_k = 1: the rows put back in the caller's order).
struct MoeGlueArgs {
  const unsigned short* input;  // gather: [tokens][ld_input] 16-bit
  long long ld_input;
  const void* rows;  // combine, glu: [capacity][ld_rows] 16-bit or fp32 (a GEMM's sorted output)
  void* rows_out;    // gather: [capacity][ld_rows] 16-bit; glu: [capacity][ld_output]
  long long ld_rows;
  void* output;  // combine: [tokens][ld_output]
  long long ld_output;
  const float* weights;       // combine: router weights [tokens · top_k], or null (all 1)
  const int* sorted_slots;    // gather
  const int* offsets;         // gather, glu: offsets[local_experts] = the padded total
  const int* slot_positions;  // combine
  long long tokens, columns, capacity;
  int top_k, local_experts;
  int glu_kind;  // MoeGluKind
  float glu_alpha, glu_limit;
};

}  // namespace qgemm::kernels
