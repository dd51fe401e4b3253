// The kernel specs qgemm ships for an architecture (what `qgemm compile --all` and
// `qgemm cache prewarm` build), and the builders that turn a quantization description into a
// utility-kernel spec. Until the GEMM kernels exist (issue 4) the catalog holds the utility
// kernels: dequantize_weight, quantize_activation, repack_weight.
#pragma once

#include <string>
#include <vector>

#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::jit {

// Weight codes + scale grid (+ zero points) -> `output` (bf16 or fp16) [n, k].
KernelSpec dequantize_weight_spec(const WeightQuant& weight, const Format& output, Arch arch);
// What quantize_activation writes: the canonical codes and scales, or the 16-bit operand and
// row factors of the GEMM path (kernels/util/quantize_activation.cuh).
// Operand8: the codes themselves in the 8-bit mma's K order (kernels/gemm/mma_weight_layout.cuh,
// operand8_position) and row factors; int8 / e4m3 per token or per tensor only.
enum class ActivationEmit { Codes, Operand, Operand8 };
// bf16/fp16 `input` [m, k] -> the quantization `quant` describes (quantized only); `operand`
// (bf16/fp16) is the operand type for ActivationEmit::Operand and ignored for the others.
KernelSpec quantize_activation_spec(const ActivationQuant& quant, const Format& input,
                                    ActivationEmit emit, const Format& operand, Arch arch);
// The 16-bit type of that operand for `quant`: fp16 where it holds every operand value exactly
// (codes times an NV cell scale; static and token scalings leave the code's value alone), else
// bf16 (group scalings, whose products are rounded, and MX's powers of two beyond fp16's range).
Format activation_operand_format(const ActivationQuant& quant);
// Whether the operand of `quant` carries a factor per row that the GEMM must apply (static:
// the tensor scale, token: the row's scale, nv: the tensor scale); group and mx operands hold
// their whole value.
bool activation_row_factor(const ActivationQuant& quant);
// Whether `quant`'s codes can be the 8-bit mma's operand themselves (ActivationEmit::Operand8):
// int8 or e4m3 codes with one scale per row (per token, static), applied as a row factor.
bool codes_are_operand8(const ActivationQuant& quant);
// Canonical packed activations of `quant` -> the operand (`operand` type: bf16 / fp16, or the
// 8-bit code format itself for the 8-bit mma's operand) and row factors.
KernelSpec expand_activation_spec(const ActivationQuant& quant, const Format& operand, Arch arch);
// One step ("stats", "cells", "codes") of the GPU weight quantizer (kernels/util/
// quantize_weight.cuh) for `weight` from an `input` of bf16, fp16 or fp32.
KernelSpec quantize_weight_spec(const WeightQuant& weight, const Format& input,
                                const std::string& step, Arch arch);
// absmax of a bf16/fp16 tensor (NV's tensor scale, static scales taken from the tensor).
KernelSpec tensor_absmax_spec(const Format& input, Arch arch);
// One step of the MoE routing preparation (kernels/moe/routing.cuh): "count", "offsets",
// "scatter"; 512 threads (the offsets step scans up to 512 experts in one block).
KernelSpec moe_routing_spec(const std::string& step, Arch arch);
inline constexpr int kMoeRoutingThreads = 512;
// Rows the caller grouped by expert (contiguous or masked) -> top-1 ids for the routing steps,
// or the token-block table the grouped kernels read them in place with (and the rows of no
// expert zeroed in the output).
KernelSpec moe_group_ids_spec(Arch arch);
KernelSpec moe_row_blocks_spec(Arch arch);
// The MoE glue (kernels/moe/glue.cuh): gather of 16-bit `rows` (bf16 / fp16) into expert
// order, or the top-k combine of the grouped GEMM's `rows` (bf16 / fp16 / fp32) into `output`.
KernelSpec moe_gather_spec(const Format& rows, Arch arch);
KernelSpec moe_combine_spec(const Format& rows, const Format& output, Arch arch);
// The activation between an expert's GEMMs: gate_up rows (rows) -> 16-bit output rows.
KernelSpec moe_glu_spec(const Format& rows, const Format& output, Arch arch);
// Canonical packed codes of `bits` -> K-major 32-bit words (kernels/util/repack.cuh).
KernelSpec repack_weight_spec(int bits, Arch arch);
// A prepared mma weight (its metadata: format, zero mode, group, scale exactness) -> 16-bit
// `output` (bf16 or fp16) rows, for the dequantize + cuBLAS path (kernels/gemm/mma_dequantize.cuh;
// launch shape kernels/gemm/mma_dequantize_shape.cuh): the exact value in 16 bits where
// layout::unscaled_dequant makes one, scaled in 16 bits where the scales are exact there, else
// fp32 math. Every value is rounded once, as layout::mma_weight_value rounded to `output`.
KernelSpec mma_dequantize_spec(const layout::MmaWeight& weight, const Format& output, Arch arch);

std::vector<KernelSpec> catalog_specs(Arch arch);

}  // namespace qgemm::jit
