// The cost model the selector ranks candidates with: a predicted time per candidate from the
// bytes it must move, the tensor-core work it must do, and the passes and launches beside its
// GEMM, each over a rate measured on the GPU.
//
//   time = fixed + max(memory, compute) + unhidden · min(memory, compute) + passes
//            (unhidden: the share of the shorter one that does not overlap the longer; 1 where
//            they add up, Cost::unhidden)
//     memory   bytes the GEMM must read from HBM (the weight as the path stores it, A, C)
//              / (copy bandwidth · the path's streaming efficiency)
//     compute  2 · M' · N · K / (the path's tensor-core rate · occupancy), M' = M rounded up to
//              the path's row granularity; occupancy = the share of the GPU's resident block
//              slots the grid fills (tiled kernels with few tiles run on a few SMs)
//     passes   every extra pass over memory: activation quantization, weight dequantization,
//              the fp32 finish of dequantize + cuBLAS, each at its own bandwidth plus a launch
//
// The rates are measured on the H200 (bench/NOTES.md, "Cost model"): a tuning table measured on
// the machine overrides the model wherever it has an entry, so the model only has to rank the
// candidates well where nothing was measured.
#pragma once

#include <cstdint>
#include <string>

#include "dispatch/gpu_limits.hpp"

namespace qgemm::dispatch {

// Measured rates of one GPU (defaults: the H200; other targets scale them by their datasheet
// ratios, which are leads until measured).
struct GpuRates {
  double copy_gbps = 4250;     // device copy, read + write
  double bf16_tflops = 790;    // cuBLAS BF16, 8192³
  double fp8_tflops = 1530;    // cuBLASLt FP8 (fast accumulation), 8192³
  double launch_us = 2.0;      // one more dependent kernel in a call (launch gap, ramp, tail)

  // The mma.sync streamed decode kernel: fixed cost (split-K tail included), the share of the
  // copy bandwidth it streams the weight at, and its tensor-core rate at 16 rows.
  double decode_fixed_us = 8.0;
  double decode_stream = 0.92;
  double decode_tflops_16 = 105;
  // Its grouped (MoE) mode runs one split, so no split-K tail: the wgmma family's fixed cost.
  // Each of a block's warps streams its own share of K through its ring, and an expert's short K
  // leaves a warp little to stream (Qwen3's down GEMM, K = 768: 192 each) behind a first load
  // that nothing hides: it streams at warp_k / (warp_k + ramp_k). Fitted on an H100
  // (bench/NOTES.md, "Grouped decode"): Qwen3-30B-A3B w4a16 at 1-64 tokens, where it beat
  // wgmma-8 by 10-22 % on gate_up (K = 2048, 512 a warp) and lost by 2-12 % on down.
  double grouped_decode_fixed_us = 4.0;
  double grouped_decode_ramp_k = 96;
  // The tiled mma.sync kernel: fixed cost; tensor-core rate of long splits at full occupancy,
  // base + per m16 tile of a warp (packed16 integer dequantization), and its factors for the
  // fp32 dequantization (floats, inexact scales) and 8-bit codes; the K tiles a block's ramp and
  // epilogue cost; weight streaming efficiency. Fitted to 8192² M = 64 (medium, 80 µs) and
  // M = 256 (192 µs), M = 4096 (prefill, 262 TFLOPS).
  double tiled_fixed_us = 8.0;
  double tiled_tflops_base = 160;
  double tiled_tflops_per_m_tile = 40;
  double tiled_fp32_factor = 0.85;
  double tiled_bytes_factor = 1.5;
  double tiled_ramp_tiles = 30;
  double tiled_stream = 0.6;
  // The SM90 wgmma family (fitted on an H100 SXM: bench/NOTES.md, "SM90 wgmma"): the
  // consumers' dequantization and the tensor work of a chunk add up instead of overlapping (per
  // pair of weight tiles and 64-K chunk ≈ 356 + 4 · tokens cycles, i.e. the dequantization at
  // ~5300 G weight elements/s per token block for packed16 (float16 0.7x, fp32 0.4x; promoted
  // scales 4/3x) plus wgmma at ~1010 TFLOPS since the staged epilogue (950 before it: 8192²
  // M = 1024 / 4096 took 189 / 746 µs, from 201 / 786)), and decode's stream adds to them too
  // (the ring refills a stage only after it is computed). Fixed cost and streaming efficiency
  // as the other kernels'.
  // With transform warps the dequantization runs beside the wgmma on three warps of their own
  // and the slower of the two bounds: measured at only ~1160 G elements/s (8192² M = 1024 /
  // 4096: 238 / 928 µs), a sixth of the ~6300 predicted, so those configs are held back.
  // Memory and the consumers' work overlap only in part: the producer's ring (stages of 2–4
  // chunks) hides most of the weight stream behind dequantization at few tokens (H100, w4a16
  // 28672×8192 M = 16: wgmma-16 69.7 µs, -k256 61.3, against 65 for the longer alone and 112 for
  // the sum; 8192² M = 16: 25.2 against 18 / 31): about a third of the shorter one shows (0.35
  // keeps decode at 8192² M = 1, where the two measured level, and moves M = 16 of the large
  // layers, where the decode kernel took 92 µs, to wgmma-16).
  double wgmma_unhidden = 0.35;
  double wgmma_fixed_us = 4.0;
  double wgmma_stream = 0.85;
  double wgmma_tflops = 1010;
  double wgmma_dequant_gelems = 5300;
  double wgmma_transform_gelems = 1160;
  // The 8-bit configs (issue #16): their tensor work at an effective 780 TFLOPS, fitted to the
  // 128-token tiles' H100 times (bench/NOTES.md, twelfth session: w8a8-int8 / int4 × int8 /
  // w4a8-fp8 on 8192², M = 256 and 4096, predicted within 3-12 %; e4m3 weights ~15 % faster than
  // predicted): their weight fragment passes shared memory → registers → the conversion between
  // each wgmma, so they reach ~45 % of the FP8 peak where cuBLASLt reaches ~80 %. e4m3 weight
  // codes, one PRMT per 4 codes, are dequantized at 2.5x the rate of 4-bit ones.
  double wgmma_fp8_tflops = 780;
  double wgmma_e4m3_bytes_factor = 2.5;
  // Dequantize + cuBLAS: the dequantization pass's share of the copy bandwidth, cuBLAS's fixed
  // cost and the share of the copy bandwidth its GEMV-like small-M calls stream the weight at.
  double dequant_stream = 0.82;
  double cublas_fixed_us = 6.0;
  double cublas_stream = 0.75;
  // Passes over activations (quantize, expand) and outputs (finish): share of copy bandwidth.
  double pass_stream = 0.7;
  // cuBLASLt FP8: fixed cost, weight streaming efficiency, and the slowdowns measured for its
  // scale modes against per-tensor scaling (outer vectors at small M, 128-blocks everywhere).
  double fp8_fixed_us = 6.0;
  double fp8_stream = 0.7;
  double fp8_outer_small_m = 1.65;  // M ≤ 64
  double fp8_block = 1.35;

  static GpuRates of(const GpuLimits& gpu);
};

// Split-K's extra traffic: each of `splits` splits adds its fp32 partial sums of a rows × cols
// output (as the kernel's workspace holds it) into the workspace, and the last reads them back.
inline double split_partial_bytes(int splits, double rows, double cols) {
  return splits > 1 ? 2.0 * splits * rows * cols * 4.0 : 0.0;
}

// A prediction, by parts (µs).
struct Cost {
  double total_us = 0;
  double fixed_us = 0;
  double memory_us = 0;
  double compute_us = 0;
  double passes_us = 0;
  double unhidden = 0;  // the share of min(memory, compute) added to the max: 0 overlapped, 1 serial
  std::string note;  // what shaped it ("occupancy 24 %", "2 chunks", ...)
};

}  // namespace qgemm::dispatch
