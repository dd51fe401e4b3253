// The backends `qgemm check` and `qgemm demo` run a quantized GEMM on, and the one place that
// decides which one `auto` means.
//
//   cpu   the library's CPU backend: the reference path (dequantize exactly, multiply in
//         double, round once to the output format)
//   gpu   qgemm::Engine on device 0: the JIT-compiled kernels (every scheme; quantized
//         activations go in as their packed codes and scales, a DeviceActivation)
//   auto  gpu when probe_gpu() finds a usable driver and device, else cpu (saying why)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::runtime {
class DeviceBuffer;
}

namespace qgemm::check {

// What a non-reference backend's tolerance against the reference is derived from: the format
// its dequantized operands are rounded to before the multiply, and its accumulator's format.
struct BackendPrecision {
  Format operand_format = formats::fp32;
  Format accumulator_format = formats::fp32;
};

// Where a device backend places A and C: each row `pad` elements longer than its columns (the
// row stride), the matrix `offset` elements past its allocation's 256-byte aligned start (an odd
// offset starts a 16-bit matrix mid-word). A applies to bf16/fp16 activations (quantized codes
// come packed). The CPU reference has no placement.
struct MatrixPlacement {
  std::int64_t a_pad = 0, a_offset = 0, c_pad = 0, c_offset = 0;
  bool is_default() const { return a_pad == 0 && a_offset == 0 && c_pad == 0 && c_offset == 0; }
};

struct MoeInputs;  // check/moe_check.hpp

// `count` values of `type` (bf16, fp16 or fp32) read back from a device buffer, decoded.
std::vector<double> read_device_values(const runtime::DeviceBuffer& buffer, const Format& type,
                                       std::size_t count);

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  virtual std::string name() const = 0;         // "cpu", "gpu"
  virtual std::string description() const = 0;  // one line for people
  // True for the CPU reference path: it must reproduce reference::gemm bit for bit.
  virtual bool is_reference() const = 0;
  virtual BackendPrecision precision() const { return {}; }
  // C[m, n] = A · Wᵀ as the scheme defines it, rounded to scheme.output.
  virtual std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a,
                                   const PackedWeight& w) = 0;
  // A whole routed expert layer (Engine::moe's definition) on `inputs`: [tokens, hidden] in the
  // scheme's output type. The CPU backend runs reference::moe_layer.
  virtual std::vector<double> moe_layer(const MoeInputs& inputs);
  // Elements around C (before it, in its row gaps, after it) that the last gemm changed.
  virtual std::int64_t outside_writes() const { return 0; }

  void place(const MatrixPlacement& placement) { placement_ = placement; }

 protected:
  MatrixPlacement placement_;
};

std::unique_ptr<GemmBackend> make_cpu_backend();

// Whether a GPU can serve: the driver (libcuda.so.1, dlopen'ed) loads, initializes and reports
// at least one device. `detail` says what was found or why not.
struct GpuProbe {
  bool usable = false;
  std::string detail;
};
GpuProbe probe_gpu();

enum class BackendChoice { Auto, Cpu, Gpu };
// "auto" | "cpu" | "gpu"; anything else is an Error naming the text.
BackendChoice parse_backend_choice(std::string_view text);

struct BackendSelection {
  std::unique_ptr<GemmBackend> backend;
  std::string reason;  // why this backend, e.g. "no GPU: libcuda.so.1: cannot open ..."
};
// Auto never fails (the GPU when there is one: it serves every valid scheme). Gpu fails with
// ErrorCode::NoDevice ("gpu backend: no usable GPU/driver (...)") when probe_gpu() finds none.
BackendSelection select_backend(BackendChoice choice);

}  // namespace qgemm::check
