// Host side of the utility kernels (kernels/util/): argument structs filled from the canonical
// packed forms (include/qgemm/quant.hpp) and launches with their grids. Device pointers are in
// the current context; nothing here allocates or synchronizes.
#pragma once

#include <cuda.h>

#include "../../kernels/util/utility_args.cuh"
#include "qgemm/quant.hpp"
#include "runtime/kernel_loader.hpp"

namespace qgemm::runtime {

// `weight` describes the shapes (its host vectors are not read); `codes`, `scales`, `zeros`
// hold its codes / scales / zeros on the device; `out` receives [n, k] 16-bit values.
kernels::DequantizeWeightArgs dequantize_weight_args(const PackedWeight& weight, CUdeviceptr codes,
                                                     CUdeviceptr scales, CUdeviceptr zeros,
                                                     CUdeviceptr out);
void launch_dequantize_weight(const LoadedKernel& kernel, const kernels::DequantizeWeightArgs& args,
                              CUstream stream);

// Quantization of `input` [m, k] (rows `lda` elements apart) as `quant` (quantized) says;
// the caller sets the outputs of its emit mode (codes, scales, tensor_scale or operand, ldo,
// row_factors) and, where needs_tensor_absmax(quant, static_scale), tensor_absmax. Scales go
// to the canonical grid (runtime/cublaslt.hpp's fp8_quantize_activation_args: cuBLASLt's).
// `static_scale`: StaticTensor's given scale (> 0; rounded to fp32 as the host quantizer does),
// or <= 0 for the tensor's absmax. Codes emission of 4-bit codes pairs neighbouring lanes into a
// byte: it needs an even group (every preset's); the operand emission has no such rule.
kernels::QuantizeActivationArgs quantize_activation_args(const ActivationQuant& quant,
                                                         std::int64_t m, std::int64_t k,
                                                         CUdeviceptr input, std::int64_t lda,
                                                         double static_scale);
bool needs_tensor_absmax(const ActivationQuant& quant, double static_scale);
// The quantizer's grid for `args` in blocks of `threads_per_block`: x over rows (at most 65535,
// grid-stride beyond), y the blocks sharing a row (short cells only).
LaunchGrid quantize_activation_grid(const kernels::QuantizeActivationArgs& args,
                                    int threads_per_block);
void launch_quantize_activation(const LoadedKernel& kernel,
                                const kernels::QuantizeActivationArgs& args, CUstream stream);
void launch_expand_activation(const LoadedKernel& kernel, const kernels::ExpandActivationArgs& args,
                              CUstream stream);
// *absmax = 0, then the absmax of [m, k] (rows `lda` apart) into it.
void launch_tensor_absmax(const LoadedKernel& kernel, CUdeviceptr input, std::int64_t m,
                          std::int64_t k, std::int64_t lda, CUdeviceptr absmax, CUstream stream);
// The same over the quantizer's input (`args`' input, m, k, lda) into `absmax` (device fp32),
// which `args` then reads as its tensor_absmax.
void launch_tensor_absmax_for(const LoadedKernel& kernel, kernels::QuantizeActivationArgs& args,
                              float* absmax, CUstream stream);

// One step of the GPU weight quantizer (args.step's kernel; util/quantize_weight.cuh): stats a
// warp per piece, cells a thread per 8 cells of a grid row, codes a thread per 8 elements of a
// row, grid-stride beyond a few blocks per SM's worth.
void launch_quantize_weight(const LoadedKernel& kernel, const kernels::QuantizeWeightArgs& args,
                            kernels::WeightQuantizeStep step, CUstream stream);

// Words of the repacked layout: ceil(k / floor(32 / bits)) · n.
std::int64_t repacked_word_count(std::int64_t n, std::int64_t k, int bits);
kernels::RepackWeightArgs repack_weight_args(std::int64_t n, std::int64_t k, int bits,
                                             CUdeviceptr codes, CUdeviceptr words);
// `bits` as in the kernel's spec (it sizes the grid).
void launch_repack_weight(const LoadedKernel& kernel, const kernels::RepackWeightArgs& args,
                          int bits, CUstream stream);

}  // namespace qgemm::runtime
