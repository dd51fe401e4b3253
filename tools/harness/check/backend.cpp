#include "check/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "check/moe_check.hpp"
#include "common/log.hpp"
#include "jit/catalog.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"

namespace qgemm::check {
namespace {

class CpuReferenceBackend final : public GemmBackend {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "CPU reference: exact dequantization, double multiply, one rounding";
  }
  bool is_reference() const override { return true; }
  std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a,
                           const PackedWeight& w) override {
    return reference::gemm(scheme, a, w);
  }
};

// qgemm::Engine on device 0: upload A, run, download C.
class GpuEngineBackend final : public GemmBackend {
 public:
  GpuEngineBackend() : engine_(0) {}
  std::string name() const override { return "gpu"; }
  std::string description() const override {
    return fmt::format("GPU: qgemm::Engine on device {} ({} SMs)", engine_.device(),
                       engine_.sm_count());
  }
  bool is_reference() const override { return false; }
  BackendPrecision precision() const override { return {operand_format_, formats::fp32}; }

  std::vector<double> gemm(const Scheme& scheme, const PackedActivation& a,
                           const PackedWeight& w) override {
    const QuantWeight weight = engine_.prepare_weight(w);
    runtime::DeviceBuffer a_device = runtime::DeviceBuffer::from(a.codes), scales;
    const Format out = scheme.output;
    const std::size_t c_bytes = out.storage_bytes();
    const std::int64_t ldc = w.n + placement_.c_pad;
    // C with a tail of 16 elements past its last row, everything poisoned (0xFF bytes: NaN): an
    // element the kernel does not write fails the check, one it writes outside C is counted.
    const std::size_t c_elements =
        static_cast<std::size_t>(placement_.c_offset + a.m * ldc + 16);
    runtime::DeviceBuffer c_device(c_elements * c_bytes);
    c_device.fill_bytes(0xFF);
    unsigned char* const c_start = c_device.as<unsigned char>() + placement_.c_offset * c_bytes;
    const DeviceMatrix c_matrix{c_start, a.m, w.n, ldc, out};
    if (a.quant.is_quantized()) {
      // The quantized codes and scales as they are: the GEMM sees exactly what the reference
      // dequantizes, through the 16-bit operand of jit::activation_operand_format; for a bf16
      // output, dequantize + cuBLAS rounds the row factors into a bf16 operand
      // (dispatch::qdq_folds_row_factors).
      // The chosen kernel's 16-bit operand may be coarser than the one the codes need (qdq
      // takes bf16 unless C is fp16): the weight's values are rounded to it. 8-bit operands are
      // the codes themselves, exact.
      scales = runtime::DeviceBuffer::from(a.scales);
      const DeviceActivation codes{a.quant, a_device.as<void>(), scales.as<void>(), a.m,
                                   a.k,     a.tensor_scale};
      const Format chosen =
          engine_.plan(gemm_problem(weight, codes, c_matrix), weight).choice_for(a.m).operand;
      operand_format_ = chosen == formats::bf16 ||
                                (out == formats::bf16 && jit::activation_row_factor(a.quant))
                            ? formats::bf16
                            : jit::activation_operand_format(a.quant);
      engine_.gemm(codes, weight, c_matrix, nullptr);
    } else {
      operand_format_ = a.quant.format;
      // A's rows `a_pad` elements apart beyond K, `a_offset` elements into its buffer.
      const std::size_t a_bytes = a.quant.format.storage_bytes();
      const std::int64_t lda = a.k + placement_.a_pad;
      std::vector<unsigned char> placed(
          static_cast<std::size_t>(placement_.a_offset + a.m * lda) * a_bytes, 0);
      for (std::int64_t r = 0; r < a.m; ++r)
        std::copy_n(a.codes.data() + r * a.k * a_bytes, a.k * a_bytes,
                    placed.data() + (placement_.a_offset + r * lda) * a_bytes);
      a_device = runtime::DeviceBuffer::from(placed);
      engine_.gemm({a_device.as<unsigned char>() + placement_.a_offset * a_bytes, a.m, a.k, lda,
                    a.quant.format},
                   weight, c_matrix, nullptr);
    }
    // C's elements out; every other element must still hold the poison.
    const std::vector<unsigned char> bytes = c_device.to_vector<unsigned char>(c_elements * c_bytes);
    const auto element = [&](std::size_t i) {
      if (out == formats::fp32) {
        float value;
        std::memcpy(&value, bytes.data() + i * 4, 4);
        return static_cast<double>(value);
      }
      std::uint16_t value;
      std::memcpy(&value, bytes.data() + i * 2, 2);
      return decode(out, value);
    };
    std::vector<double> c;
    c.reserve(static_cast<std::size_t>(a.m * w.n));
    outside_writes_ = 0;
    for (std::size_t i = 0; i < c_elements; ++i) {
      const std::int64_t at = static_cast<std::int64_t>(i) - placement_.c_offset;
      const bool inside = at >= 0 && at < a.m * ldc && at % ldc < w.n;
      if (inside) {
        c.push_back(element(i));
      } else if (std::any_of(bytes.begin() + i * c_bytes, bytes.begin() + (i + 1) * c_bytes,
                             [](unsigned char b) { return b != 0xFF; })) {
        ++outside_writes_;
      }
    }
    return c;
  }
  std::int64_t outside_writes() const override { return outside_writes_; }

  // prepare_experts (its default layout; gate_up for the fused GLU), upload, Engine::moe on the
  // default stream, download.
  std::vector<double> moe_layer(const MoeInputs& in) override {
    const MoeCase& c = in.shape;
    const QuantWeight gate_up = engine_.prepare_experts(in.gate_up, c.scheme.activation,
                                                        ExpertLayout::Auto, ExpertRole::GateUp);
    const QuantWeight down = engine_.prepare_experts(in.down, c.scheme.activation);
    const runtime::DeviceBuffer hidden = runtime::DeviceBuffer::from(in.hidden_input.codes);
    const runtime::DeviceBuffer ids = runtime::DeviceBuffer::from(in.routing.expert_ids);
    const runtime::DeviceBuffer weights = runtime::DeviceBuffer::from(in.routing.weights);
    runtime::DeviceBuffer gate_up_bias, down_bias;
    MoeOptions options;
    options.activation = c.glu;
    if (c.bias) {
      gate_up_bias = runtime::DeviceBuffer::from(in.gate_up_bias);
      down_bias = runtime::DeviceBuffer::from(in.down_bias);
      options.gate_up_bias = gate_up_bias.as<const float>();
      options.down_bias = down_bias.as<const float>();
    }
    const Format& out = c.scheme.output;
    const auto count = static_cast<std::size_t>(c.tokens * c.hidden);
    runtime::DeviceBuffer output(count * out.storage_bytes());
    output.fill_bytes(0xFF);  // NaN: an output the layer does not write fails the check
    engine_.moe({hidden.as<void>(), c.tokens, c.hidden, c.hidden, hidden_type(c)},
                ids.as<const std::int32_t>(), weights.as<const float>(), c.top_k, gate_up, down,
                {output.as<void>(), c.tokens, c.hidden, c.hidden, out}, nullptr, options);
    return read_device_values(output, out, count);
  }

 private:
  Engine engine_;
  Format operand_format_ = formats::bf16;
  std::int64_t outside_writes_ = 0;
};

}  // namespace

std::vector<double> read_device_values(const runtime::DeviceBuffer& buffer, const Format& type,
                                       std::size_t count) {
  std::vector<double> values(count);
  if (type == formats::fp32) {
    const auto host = buffer.to_vector<float>(count);
    std::copy(host.begin(), host.end(), values.begin());
  } else {
    const auto host = buffer.to_vector<std::uint16_t>(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = decode(type, host[i]);
  }
  return values;
}

std::vector<double> GemmBackend::moe_layer(const MoeInputs& in) {
  const MoeCase& c = in.shape;
  return reference::moe_layer(c.scheme, in.hidden, in.gate_up, in.down, in.routing, c.glu,
                              hidden_type(c),
                              in.gate_up_bias.empty() ? nullptr : in.gate_up_bias.data(),
                              in.down_bias.empty() ? nullptr : in.down_bias.data());
}

std::unique_ptr<GemmBackend> make_cpu_backend() { return std::make_unique<CpuReferenceBackend>(); }

GpuProbe probe_gpu() {
  std::string why;
  if (!runtime::Driver::available(&why)) return {false, why};
  const int devices = runtime::device_count();
  if (devices < 1) return {false, "the driver reports no CUDA device"};
  const runtime::DeviceInfo info = runtime::device_info(0);
  return {true, fmt::format("{} CUDA device(s), device 0: {}", devices, info.name)};
}

BackendChoice parse_backend_choice(std::string_view text) {
  if (text == "auto") return BackendChoice::Auto;
  if (text == "cpu") return BackendChoice::Cpu;
  if (text == "gpu") return BackendChoice::Gpu;
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("backend '{}' is not a backend (rule: auto, cpu or gpu)", text));
}

BackendSelection select_backend(BackendChoice choice) {
  if (choice == BackendChoice::Cpu) return {make_cpu_backend(), "asked for"};
  const GpuProbe gpu = probe_gpu();
  if (choice == BackendChoice::Gpu && !gpu.usable)
    throw Error(ErrorCode::NoDevice,
                fmt::format("gpu backend: no usable GPU/driver ({})", gpu.detail));
  if (!gpu.usable) return {make_cpu_backend(), fmt::format("no GPU: {}", gpu.detail)};
  return {std::make_unique<GpuEngineBackend>(), gpu.detail};
}

}  // namespace qgemm::check
