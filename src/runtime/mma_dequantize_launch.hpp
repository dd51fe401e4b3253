// Host side of mma_dequantize (kernels/gemm/mma_dequantize.cuh): the rules its arguments keep,
// and the launch on the grid of kernels/gemm/mma_dequantize_shape.cuh. The Engine's dequantize +
// cuBLAS path and the GPU tests launch it through here, so the rules are checked in one place.
#pragma once

#include <cuda.h>

#include "gemm/dequant_cublas_args.cuh"
#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"
#include "runtime/kernel_loader.hpp"

namespace qgemm::runtime {

// Throws Error(InvalidArgument) naming the field, its value and the rule it breaks: non-null
// words, scales and a 16-byte aligned out; n_begin a multiple of 64; rows ≥ 1 within n_padded;
// k_blocks = the k16 blocks `order` stores (layout::stored_k_blocks); ld_out ≥ k and a multiple
// of 8.
void check_mma_dequantize_args(const kernels::MmaDequantizeArgs& args,
                               layout::FragmentOrder order);

// The blocks per SM a jit::mma_dequantize_spec kernel is built for (MmaDequantizeShape::
// blocks_per_sm of its weight, zero mode and group).
int mma_dequantize_blocks_per_sm(const jit::KernelSpec& spec);

// Blocks for `args` on a device of `sm_count` SMs (MmaDequantizeShape::grid_blocks).
LaunchGrid mma_dequantize_grid(const jit::KernelSpec& spec, const kernels::MmaDequantizeArgs& args,
                               int sm_count);

// Checks `args`, then launches `kernel` (compiled from `spec`, a jit::mma_dequantize_spec) on
// `stream`.
void launch_mma_dequantize(const LoadedKernel& kernel, const jit::KernelSpec& spec,
                           const kernels::MmaDequantizeArgs& args, int sm_count, CUstream stream);

}  // namespace qgemm::runtime
