// The kernel specs qgemm ships for an architecture (what `qgemm compile --all` and
// `qgemm cache prewarm` build), and the builders that turn a quantization description into a
// utility-kernel spec. Until the GEMM kernels exist (issue 4) the catalog holds the utility
// kernels: dequantize_weight, quantize_activation, repack_weight.
#pragma once

#include <vector>

#include "jit/kernel_spec.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::jit {

// Weight codes + scale grid (+ zero points) -> `output` (bf16 or fp16) [n, k].
KernelSpec dequantize_weight_spec(const WeightQuant& weight, const Format& output, Arch arch);
// bf16/fp16 [m, k] -> 8-bit codes of `code` with one fp32 scale per row.
KernelSpec quantize_activation_spec(const Format& code, const Format& input, Arch arch);
// Canonical packed codes of `bits` -> K-major 32-bit words (kernels/util/repack.cuh).
KernelSpec repack_weight_spec(int bits, Arch arch);

std::vector<KernelSpec> catalog_specs(Arch arch);

}  // namespace qgemm::jit
