// Round-to-nearest weight quantization on the GPU (kernels/util/quantize_weight.cuh): a weight
// in device memory becomes its canonical packed form in device memory, code for code what
// quantize_weight computes on the host from the same values (tests/gpu/test_quantize_weight.cpp
// holds them to it). Engine::prepare_weight(DeviceMatrix, ...) repacks the result where it is.
#pragma once

#include <cuda.h>

#include <optional>
#include <string>

#include "jit/kernel_spec.hpp"
#include "qgemm/engine.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::quant_detail {

struct DeviceQuantizedWeight {
  // quant, n, k, global_scale, and host copies of the scales and zeros where asked for
  // (HostScales::Copy); its codes are empty: they live in `codes` only.
  PackedWeight meta;
  runtime::DeviceBuffer codes, scales, zeros;
};

// The canonical packed form of a weight quantized on the device: its metadata and host scales
// (HostScales::Copy), with the codes downloaded.
PackedWeight downloaded(const DeviceQuantizedWeight& canonical);

// A packed weight's arrays uploaded as they are (meta left empty: the caller holds the weight).
DeviceQuantizedWeight upload_packed_weight(const PackedWeight& weight);

// Why the GPU quantizer cannot take `quant`, or nothing: it takes every 1..8-bit integer
// format and every float format with a mantissa, with any scale format, zero point and grid;
// not exponent-only or mantissa-less elements, nor float zeros in e8m0 (no checkpoint uses them).
std::optional<std::string> device_quantizer_gap(const WeightQuant& quant);

// Whether the quantized weight's scales and zeros are also copied to the host (meta): what
// quantize_weight returns needs them; prepare_weight reads them on the device.
enum class HostScales { Copy, Leave };

// Quantizes `weight` (bf16, fp16 or fp32 rows in device memory) in the current context on
// `stream` and returns when done. Error(InvalidArgument) names a bad matrix or scheme, or the
// first non-finite element as quantize_weight does. A scheme the GPU quantizer does not take
// (device_quantizer_gap) is served by the host quantizer (logged at QGEMM_LOG_LEVEL >= 2).
DeviceQuantizedWeight quantize_weight_on_device(const DeviceMatrix& weight,
                                                const WeightQuant& quant, jit::Arch arch,
                                                CUstream stream,
                                                HostScales host_scales = HostScales::Copy);

}  // namespace qgemm::quant_detail
