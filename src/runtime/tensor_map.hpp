// TMA tensor maps (cuTensorMapEncodeTiled, through the dlopen'ed driver) for the SM90 kernels.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "gemm/wgmma_gemm_params.cuh"

namespace qgemm::runtime {

// A row-major [rows, cols] matrix of `element_bytes`-byte values (row stride `stride`
// elements) as a 2-D map with boxes of box_rows × 128 bytes (64 16-bit values, or 128 e4m3
// codes for element_bytes 1) and the 128-byte swizzle: the K-major wgmma operand of
// kernels/gemm/sm90_wgmma.cuh. Elements past the matrix read as zero. Throws Error
// (InvalidArgument) naming the rule the driver refused (16-byte aligned base and stride) or an
// element size other than 1 or 2.
kernels::TensorMapStorage activation_tensor_map(CUdeviceptr base, std::int64_t rows,
                                                std::int64_t cols, std::int64_t stride,
                                                int box_rows, int element_bytes = 2);

}  // namespace qgemm::runtime
