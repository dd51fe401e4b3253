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

kernels::QuantizeActivationArgs quantize_activation_args(std::int64_t m, std::int64_t k,
                                                         CUdeviceptr input, CUdeviceptr codes,
                                                         CUdeviceptr scales);
void launch_quantize_activation(const LoadedKernel& kernel,
                                const kernels::QuantizeActivationArgs& args, CUstream stream);

// Words of the repacked layout: ceil(k / floor(32 / bits)) · n.
std::int64_t repacked_word_count(std::int64_t n, std::int64_t k, int bits);
kernels::RepackWeightArgs repack_weight_args(std::int64_t n, std::int64_t k, int bits,
                                             CUdeviceptr codes, CUdeviceptr words);
// `bits` as in the kernel's spec (it sizes the grid).
void launch_repack_weight(const LoadedKernel& kernel, const kernels::RepackWeightArgs& args,
                          int bits, CUstream stream);

}  // namespace qgemm::runtime
