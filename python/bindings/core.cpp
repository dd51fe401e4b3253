// qgemm._core: the Python face of the C++ library (python/qgemm re-exports it).
//
// What crosses the boundary, and how:
//   arrays in   numpy (or anything with the buffer protocol / DLPack on the CPU) as nanobind
//               ndarrays, C-contiguous, of the dtype each function names; never copied through
//               Python objects
//   arrays out  numpy arrays that own a copy of the C++ vector (capsule-freed)
//   errors      qgemm::Error becomes qgemm.Error (a ValueError) with the C++ message, which names
//               the argument and the rule
//   device      Engine.gemm takes CUDA arrays through DLPack (torch, CuPy, JAX), 2-D with unit
//               column stride, and the caller's stream as an integer (torch:
//               torch.cuda.current_stream().cuda_stream); it writes into the `out` array given,
//               adding an optional fp32 bias in the epilogue
//   torch       qgemm.ops registers torch.ops.qgemm.gemm over Engine.gemm (Python only: this
//               module never includes torch)
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/moe.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "qgemm/scheme.hpp"

namespace nb = nanobind;

namespace {

using qgemm::Error;
using qgemm::ErrorCode;

template <class T>
using HostMatrix = nb::ndarray<const T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Bytes = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A numpy array owning `values` (moved onto the heap, freed with the array).
template <class T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T> values, std::vector<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner);
}

std::vector<std::uint8_t> to_vector(const Bytes& bytes) {
  return {bytes.data(), bytes.data() + bytes.shape(0)};
}

const char* zero_point_name(qgemm::ZeroPoint z) {
  switch (z) {
    case qgemm::ZeroPoint::None: return "none";
    case qgemm::ZeroPoint::Midpoint: return "mid";
    case qgemm::ZeroPoint::Integer: return "int";
    case qgemm::ZeroPoint::Float: return "float";
  }
  return "?";
}

const char* granularity_name(qgemm::WeightGranularity g) {
  switch (g) {
    case qgemm::WeightGranularity::PerTensor: return "tensor";
    case qgemm::WeightGranularity::PerChannel: return "channel";
    case qgemm::WeightGranularity::Group: return "group";
    case qgemm::WeightGranularity::Block: return "block";
  }
  return "?";
}

using CudaArray = nb::ndarray<nb::device::cuda>;

// A CUDA array's element format as a DeviceMatrix takes it: bf16, fp16 or fp32.
qgemm::Format matrix_format(const CudaArray& t, const char* name, const char* function) {
  const nb::dlpack::dtype dt = t.dtype();
  if (dt == nb::dtype<float>()) return qgemm::formats::fp32;
  if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16)
    return qgemm::formats::fp16;
  if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16)
    return qgemm::formats::bf16;
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{}: {} must be bf16, fp16 or fp32", function, name));
}

// A CUDA array as a DeviceMatrix: 2-D, unit column stride, bf16 / fp16 / fp32, on `device`.
qgemm::DeviceMatrix device_matrix(const CudaArray& t, const char* name, int device,
                                  const char* function = "Engine.gemm") {
  qgemm::require(t.ndim() == 2, "{}: {} must be 2-D ({} dimensions given)", function, name,
                 t.ndim());
  qgemm::require(t.stride(1) == 1 || t.shape(1) == 1,
                 "{}: {} must have unit column stride (stride {} given)", function, name,
                 t.stride(1));
  qgemm::require(t.device_id() == device, "{}: {} is on GPU {}, the engine on GPU {}", function,
                 name, t.device_id(), device);
  qgemm::DeviceMatrix m;
  m.dtype = matrix_format(t, name, function);
  m.data = t.data();
  m.rows = static_cast<std::int64_t>(t.shape(0));
  m.cols = static_cast<std::int64_t>(t.shape(1));
  m.stride = t.shape(0) > 1 ? static_cast<std::int64_t>(t.stride(0)) : m.cols;
  return m;
}

// A CUDA array [E, N, K] as E matrices [N, K] (expert x starts x · stride(0) elements in): 3-D
// with E >= 1, unit column stride, bf16 / fp16 / fp32, on `device`.
std::vector<qgemm::DeviceMatrix> expert_matrices(const CudaArray& experts, int device,
                                                 const char* function) {
  qgemm::require(experts.ndim() == 3 && experts.shape(0) >= 1,
                 "{}: experts must be 3-D [E, N, K] with E >= 1 ({} dimensions given)", function,
                 experts.ndim());
  qgemm::require(experts.stride(2) == 1 || experts.shape(2) == 1,
                 "{}: experts must have unit column stride (stride {} given)", function,
                 experts.stride(2));
  qgemm::require(experts.device_id() == device, "{}: experts are on GPU {}, the engine on GPU {}",
                 function, experts.device_id(), device);
  qgemm::DeviceMatrix one;
  one.dtype = matrix_format(experts, "experts", function);
  one.rows = static_cast<std::int64_t>(experts.shape(1));
  one.cols = static_cast<std::int64_t>(experts.shape(2));
  one.stride = one.rows > 1 ? static_cast<std::int64_t>(experts.stride(1)) : one.cols;
  std::vector<qgemm::DeviceMatrix> matrices(experts.shape(0), one);
  for (std::size_t x = 0; x < matrices.size(); ++x)
    matrices[x].data = static_cast<unsigned char*>(experts.data()) +
                       static_cast<std::int64_t>(x) * experts.stride(0) * one.dtype.storage_bytes();
  return matrices;
}

// An expert layout by name (auto, wgmma, mma).
qgemm::ExpertLayout expert_layout_of(const std::string& layout, const char* function) {
  if (layout == "wgmma") return qgemm::ExpertLayout::Wgmma;
  if (layout == "mma") return qgemm::ExpertLayout::Mma;
  qgemm::require(layout == "auto", "{}: layout = '{}' (rule: auto, wgmma or mma)", function,
                 layout);
  return qgemm::ExpertLayout::Auto;
}

qgemm::ExpertRole expert_role_of(const std::string& role, const char* function) {
  if (role == "gate_up") return qgemm::ExpertRole::GateUp;
  qgemm::require(role == "plain", "{}: role = '{}' (rule: plain or gate_up)", function, role);
  return qgemm::ExpertRole::Plain;
}

// A CUDA array as the epilogue's bias: fp32, contiguous, n values, on `device`.
const float* device_bias(const CudaArray& t, std::int64_t n, int device) {
  qgemm::require(t.ndim() == 1 && static_cast<std::int64_t>(t.shape(0)) == n,
                 "Engine.gemm: bias must be 1-D with the weight's n = {} values", n);
  qgemm::require(t.dtype() == nb::dtype<float>(), "Engine.gemm: bias must be fp32");
  qgemm::require(t.stride(0) == 1 || n == 1, "Engine.gemm: bias must be contiguous (stride {})",
                 t.stride(0));
  qgemm::require(t.device_id() == device, "Engine.gemm: bias is on GPU {}, the engine on GPU {}",
                 t.device_id(), device);
  return static_cast<const float*>(t.data());
}

// The GLU between an MoE layer's GEMMs, by name ("silu", "gelu", "clamped-swiglu").
qgemm::GluActivation glu_of(const std::string& name, float alpha, float limit,
                            const char* function) {
  qgemm::GluActivation glu;
  glu.alpha = alpha;
  glu.limit = limit;
  for (qgemm::GluKind kind :
       {qgemm::GluKind::Silu, qgemm::GluKind::Gelu, qgemm::GluKind::ClampedSwiglu})
    if (name == qgemm::glu_kind_name(kind)) {
      glu.kind = kind;
      return glu;
    }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{}: activation '{}' (rule: silu, gelu or clamped-swiglu)", function,
                          name));
}

// A CUDA array of `count` contiguous int32 / fp32 values on `device` (MoE routing inputs).
template <class T>
T* device_vector(const CudaArray& t, std::int64_t count, int device, const char* name,
                 const char* function = "Engine.moe") {
  qgemm::require(t.dtype() == nb::dtype<T>(), "{}: {} must be {}", function, name,
                 sizeof(T) == 4 && std::is_integral_v<T> ? "int32" : "fp32");
  std::int64_t size = 1;
  for (size_t d = 0; d < t.ndim(); ++d) size *= static_cast<std::int64_t>(t.shape(d));
  qgemm::require(size == count, "{}: {} has {} values (rule: {})", function, name, size, count);
  std::int64_t expected = 1;
  for (size_t d = t.ndim(); d-- > 0;) {
    qgemm::require(t.shape(d) == 1 || t.stride(d) == expected, "{}: {} must be contiguous",
                   function, name);
    expected *= static_cast<std::int64_t>(t.shape(d));
  }
  qgemm::require(t.device_id() == device, "{}: {} is on GPU {}, the engine on GPU {}", function,
                 name, t.device_id(), device);
  return static_cast<T*>(t.data());
}

// A Scheme whose weight part is `weight`: PackedWeight carries only the weight's quantization.
qgemm::Scheme scheme_of(const qgemm::PackedWeight& w) {
  qgemm::Scheme s;
  s.weight = w.quant;
  return s;
}

// Error unless `scheme` quantizes weights as `w` is quantized (`function` names the caller).
void require_weight_of(const qgemm::Scheme& scheme, const qgemm::PackedWeight& w,
                       const char* function) {
  qgemm::require(scheme.weight == w.quant,
                 "{}: the scheme's weight part ({}) differs from the weight's ({})", function,
                 qgemm::to_string(scheme), qgemm::to_string(scheme_of(w)));
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "qgemm: quantized GEMM for LLM inference (C++ core)";
  m.attr("__version__") = QGEMM_VERSION;
  nb::exception<Error>(m, "Error", PyExc_ValueError);
  // Schemes, packed and prepared weights are kept alive to the interpreter's end by caches
  // that outlive its last collection (qgemm.ops' registry, which torch's operator table holds,
  // and users' modules): nanobind's exit-time leak report would flag them in every program.
  nb::set_leak_warnings(false);

  m.def(
      "format_names",
      [] {
        std::vector<std::string> names;
        for (const qgemm::Format& f : qgemm::named_formats()) names.push_back(f.name());
        return names;
      },
      "The named number formats (uint4, e4m3, e2m1, bf16, ...).");

  nb::class_<qgemm::Scheme>(m, "Scheme",
                            "A quantization scheme: a preset name or the compact text form.")
      .def("__init__",
           [](qgemm::Scheme* self, const std::string& text) {
             new (self) qgemm::Scheme(qgemm::parse_scheme(text));
           },
           nb::arg("text"))
      .def("__str__", [](const qgemm::Scheme& s) { return qgemm::to_string(s); })
      .def("__repr__",
           [](const qgemm::Scheme& s) { return "qgemm.Scheme('" + qgemm::to_string(s) + "')"; })
      .def("__eq__", [](const qgemm::Scheme& a, const qgemm::Scheme& b) { return a == b; })
      // Pickled as its text (the preset's name where it has one), so that modules holding a
      // scheme (qgemm.nn.QuantLinear) copy and pickle.
      .def("__getstate__",
           [](const qgemm::Scheme& s) { return s.name.empty() ? qgemm::to_string(s) : s.name; })
      .def("__setstate__",
           [](qgemm::Scheme& self, const std::string& text) {
             new (&self) qgemm::Scheme(qgemm::parse_scheme(text));
           })
      .def_prop_ro("preset", [](const qgemm::Scheme& s) { return s.name; })
      .def_prop_ro("weight_format", [](const qgemm::Scheme& s) { return s.weight.format.name(); })
      .def_prop_ro("granularity",
                   [](const qgemm::Scheme& s) { return granularity_name(s.weight.granularity); })
      .def_prop_ro("group", [](const qgemm::Scheme& s) { return s.weight.group; })
      .def_prop_ro("scale_format",
                   [](const qgemm::Scheme& s) { return s.weight.scale_format.name(); })
      .def_prop_ro("zero_point",
                   [](const qgemm::Scheme& s) { return zero_point_name(s.weight.zero_point); })
      .def_prop_ro("activation_format",
                   [](const qgemm::Scheme& s) { return s.activation.format.name(); })
      .def_prop_ro("activation_quantized",
                   [](const qgemm::Scheme& s) { return s.activation.is_quantized(); })
      .def_prop_ro("output_format", [](const qgemm::Scheme& s) { return s.output.name(); });

  m.def(
      "presets",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const qgemm::Preset& p : qgemm::presets()) out.emplace_back(p.name, p.description);
        return out;
      },
      "The preset schemes as (name, description) pairs.");

  nb::class_<qgemm::PackedWeight>(
      m, "PackedWeight",
      "A weight in qgemm's canonical packed form: codes [n, ceil(k·bits/8)] LSB-first, the "
      "scale grid's codes, integer or float zero points, and an fp32 global scale.")
      .def_prop_ro("scheme", &scheme_of)
      .def_ro("n", &qgemm::PackedWeight::n)
      .def_ro("k", &qgemm::PackedWeight::k)
      .def_ro("global_scale", &qgemm::PackedWeight::global_scale)
      .def_prop_ro("codes", [](const qgemm::PackedWeight& w) { return to_numpy(w.codes, {w.codes.size()}); },
                   nb::rv_policy::move)
      .def_prop_ro("scales", [](const qgemm::PackedWeight& w) { return to_numpy(w.scales, {w.scales.size()}); },
                   nb::rv_policy::move)
      .def_prop_ro("zeros", [](const qgemm::PackedWeight& w) { return to_numpy(w.zeros, {w.zeros.size()}); },
                   nb::rv_policy::move)
      .def_prop_ro("scale_grid",
                   [](const qgemm::PackedWeight& w) {
                     const qgemm::ScaleGrid g = w.scale_grid();
                     return std::make_pair(g.rows, g.cols);
                   })
      .def_prop_ro(
          "scale_cell",
          [](const qgemm::PackedWeight& w) {
            const qgemm::ScaleGrid g = w.scale_grid();
            return std::make_pair(g.rows_per, g.cols_per);
          },
          "(rows, columns) of the weight one scale covers (the last cell of a row or column may "
          "be partial).")
      .def_prop_ro(
          "bits", [](const qgemm::PackedWeight& w) { return w.quant.format.bits; },
          "Bits per code.")
      .def_static(
          "from_parts",
          [](const qgemm::Scheme& scheme, std::int64_t n, std::int64_t k, const Bytes& codes,
             const Bytes& scales, std::optional<Bytes> zeros, double global_scale) {
            qgemm::PackedWeight w;
            w.quant = scheme.weight;
            w.n = n;
            w.k = k;
            w.codes = to_vector(codes);
            w.scales = to_vector(scales);
            if (zeros) w.zeros = to_vector(*zeros);
            w.global_scale = global_scale;
            qgemm::check_packed_weight(w, "PackedWeight.from_parts");
            return w;
          },
          nb::arg("scheme"), nb::arg("n"), nb::arg("k"), nb::arg("codes"), nb::arg("scales"),
          nb::arg("zeros") = nb::none(), nb::arg("global_scale") = 1.0,
          "A packed weight from its canonical parts (checkpoint importers build these); every "
          "size is checked against the scheme.");

  m.def(
      "quantize_weight",
      [](const qgemm::Scheme& scheme, const HostMatrix<float>& w) {
        nb::gil_scoped_release release;
        return qgemm::quantize_weight(scheme.weight, w.data(), static_cast<std::int64_t>(w.shape(0)),
                                      static_cast<std::int64_t>(w.shape(1)));
      },
      nb::arg("scheme"), nb::arg("weight"),
      "Round-to-nearest quantization of a float32 [n, k] weight as the scheme says.");

  m.def(
      "dequantize_weight",
      [](const qgemm::PackedWeight& w) {
        std::vector<double> values;
        {
          nb::gil_scoped_release release;
          values = qgemm::dequantize_weight(w);
        }
        return to_numpy(std::move(values),
                        {static_cast<size_t>(w.n), static_cast<size_t>(w.k)});
      },
      nb::arg("weight"), "The exact dequantized weight, float64 [n, k].");

  nb::class_<qgemm::QuantWeight>(m, "QuantWeight",
                                 "A weight prepared on a GPU in the layouts its plans use.")
      .def_prop_ro("n", &qgemm::QuantWeight::n)
      .def_prop_ro("k", &qgemm::QuantWeight::k)
      .def_prop_ro("device_bytes", &qgemm::QuantWeight::device_bytes)
      .def_prop_ro("experts", &qgemm::QuantWeight::experts)
      .def_prop_ro(
          "role",
          [](const qgemm::QuantWeight& w) { return qgemm::expert_role_name(w.role()); },
          "'gate_up' for an expert set interleaved for Engine.moe's fused GLU, else 'plain'.");

  nb::class_<qgemm::Engine>(m, "Engine", "One per GPU: prepares weights and runs GEMMs.")
      .def(nb::init<int>(), nb::arg("device") = 0)
      .def(
          "prepare_experts",
          [](qgemm::Engine& e, const std::vector<qgemm::PackedWeight>& experts,
             const qgemm::Scheme& scheme, const std::string& layout, const std::string& role) {
            qgemm::require(!experts.empty(), "Engine.prepare_experts: no experts");
            for (const qgemm::PackedWeight& w : experts)
              require_weight_of(scheme, w, "Engine.prepare_experts");
            const qgemm::ExpertLayout expert_layout =
                expert_layout_of(layout, "Engine.prepare_experts");
            const qgemm::ExpertRole expert_role = expert_role_of(role, "Engine.prepare_experts");
            nb::gil_scoped_release release;
            return e.prepare_experts(experts, scheme.activation, expert_layout, expert_role);
          },
          nb::arg("experts"), nb::arg("scheme"), nb::arg("layout") = "auto",
          nb::arg("role") = "plain",
          "Uploads E packed weights of one shape as one expert weight (the grouped GEMM's), in "
          "one layout: 'auto' (the wgmma order on SM90, the mma layout on SM80-SM89), 'wgmma' or "
          "'mma' (the grouped decode kernel: faster at decode, one weight pass per 16 rows an "
          "expert beyond it). role 'gate_up': a gate_up set (gate rows, then up rows) kept "
          "interleaved for Engine.moe's fused GLU (it then serves Engine.moe only).")
      .def(
          "quantize_and_prepare_experts",
          [](qgemm::Engine& e, const CudaArray& experts, const qgemm::Scheme& scheme,
             const std::string& layout, const std::string& role, std::uintptr_t stream) {
            constexpr const char* kFunction = "Engine.quantize_and_prepare_experts";
            const std::vector<qgemm::DeviceMatrix> matrices =
                expert_matrices(experts, e.device(), kFunction);
            const qgemm::ExpertLayout expert_layout = expert_layout_of(layout, kFunction);
            const qgemm::ExpertRole expert_role = expert_role_of(role, kFunction);
            nb::gil_scoped_release release;
            qgemm::Engine::QuantizedExperts both = e.quantize_and_prepare_experts(
                matrices, scheme.weight, scheme.activation, expert_layout, expert_role,
                reinterpret_cast<void*>(stream));
            return std::make_pair(std::move(both.packed), std::move(both.prepared));
          },
          nb::arg("experts"), nb::arg("scheme"), nb::arg("layout") = "auto",
          nb::arg("role") = "plain", nb::arg("stream") = 0,
          "Expert weights on this GPU (a CUDA array [E, N, K], bf16, fp16 or fp32) quantized "
          "there: ([PackedWeight] * E, QuantWeight), what quantize_weight per expert and "
          "prepare_experts give, without quantizing twice or uploading back.")
      .def(
          "prepare_experts",
          [](qgemm::Engine& e, const CudaArray& experts, const qgemm::Scheme& scheme,
             const std::string& layout, const std::string& role, std::uintptr_t stream) {
            constexpr const char* kFunction = "Engine.prepare_experts";
            const std::vector<qgemm::DeviceMatrix> matrices =
                expert_matrices(experts, e.device(), kFunction);
            const qgemm::ExpertLayout expert_layout = expert_layout_of(layout, kFunction);
            const qgemm::ExpertRole expert_role = expert_role_of(role, kFunction);
            nb::gil_scoped_release release;
            return e.prepare_experts(matrices, scheme.weight, scheme.activation, expert_layout,
                                     expert_role, reinterpret_cast<void*>(stream));
          },
          nb::arg("experts"), nb::arg("scheme"), nb::arg("layout") = "auto",
          nb::arg("role") = "plain", nb::arg("stream") = 0,
          "The same set from a CUDA array [E, N, K] quantized on this GPU and prepared there, "
          "nothing downloaded (no host copy: the CPU path and a state_dict need one).")
      .def(
          "moe",
          [](qgemm::Engine& e, const CudaArray& hidden, const CudaArray& topk_ids,
             const CudaArray& topk_weights, const qgemm::QuantWeight& gate_up,
             const qgemm::QuantWeight& down, const CudaArray& out, std::uintptr_t stream,
             const std::string& activation, float alpha, float limit,
             std::optional<CudaArray> gate_up_bias, std::optional<CudaArray> down_bias,
             std::optional<CudaArray> expert_map, int global_experts) {
            const qgemm::DeviceMatrix hm = device_matrix(hidden, "hidden", e.device());
            const qgemm::DeviceMatrix om = device_matrix(out, "out", e.device());
            qgemm::require(topk_ids.ndim() == 2 && topk_ids.shape(0) == hidden.shape(0),
                           "Engine.moe: topk_ids must be [tokens, top_k] ({} dimensions given)",
                           topk_ids.ndim());
            const int top_k = static_cast<int>(topk_ids.shape(1));
            const std::int64_t slots = hm.rows * top_k;
            qgemm::MoeOptions options;
            options.activation = glu_of(activation, alpha, limit, "Engine.moe");
            const int experts = gate_up.experts();
            if (gate_up_bias)
              options.gate_up_bias = device_vector<float>(
                  *gate_up_bias, static_cast<std::int64_t>(experts) * gate_up.n(), e.device(),
                  "gate_up_bias");
            if (down_bias)
              options.down_bias = device_vector<float>(
                  *down_bias, static_cast<std::int64_t>(experts) * down.n(), e.device(),
                  "down_bias");
            if (expert_map) {
              options.global_experts = global_experts;
              options.expert_map = device_vector<std::int32_t>(*expert_map, global_experts,
                                                               e.device(), "expert_map");
            }
            const std::int32_t* ids =
                device_vector<std::int32_t>(topk_ids, slots, e.device(), "topk_ids");
            const float* weights =
                device_vector<float>(topk_weights, slots, e.device(), "topk_weights");
            nb::gil_scoped_release release;
            e.moe(hm, ids, weights, top_k, gate_up, down, om, reinterpret_cast<void*>(stream),
                  options);
          },
          nb::arg("hidden"), nb::arg("topk_ids"), nb::arg("topk_weights"), nb::arg("gate_up"),
          nb::arg("down"), nb::arg("out"), nb::arg("stream") = 0, nb::arg("activation") = "silu",
          nb::arg("alpha") = 1.702f, nb::arg("limit") = 7.0f,
          nb::arg("gate_up_bias") = nb::none(), nb::arg("down_bias") = nb::none(),
          nb::arg("expert_map") = nb::none(), nb::arg("global_experts") = 0,
          "A routed expert layer (include/qgemm/engine.hpp, Engine::moe) on the given stream: "
          "hidden bf16/fp16 [tokens, H], topk_ids int32 and topk_weights fp32 [tokens, top_k], "
          "out [tokens, H]; biases fp32 [experts, N]; expert_map int32 [global_experts] (local "
          "id or -1).")
      .def(
          "moe_gemm_grouped",
          [](qgemm::Engine& e, const CudaArray& rows, const qgemm::QuantWeight& experts,
             const CudaArray& out, std::uintptr_t stream, std::optional<CudaArray> offsets,
             std::optional<CudaArray> counts, std::int64_t capacity,
             std::optional<CudaArray> bias, std::optional<CudaArray> invalid_rows,
             bool zero_rows_of_no_expert) {
            constexpr const char* kFunction = "Engine.moe_gemm_grouped";
            const qgemm::DeviceMatrix rm = device_matrix(rows, "rows", e.device(), kFunction);
            const qgemm::DeviceMatrix om = device_matrix(out, "out", e.device(), kFunction);
            qgemm::require(offsets.has_value() != counts.has_value(),
                           "{}: give offsets (contiguous rows) or counts (masked rows), one of "
                           "them",
                           kFunction);
            const int n_experts = experts.experts();
            qgemm::MoeGroupedRows groups;
            if (offsets) {
              groups.grouping = qgemm::MoeRowGrouping::Contiguous;
              groups.offsets = device_vector<std::int32_t>(*offsets, n_experts + 1, e.device(),
                                                           "offsets", kFunction);
            } else {
              groups.grouping = qgemm::MoeRowGrouping::Masked;
              groups.counts = device_vector<std::int32_t>(*counts, n_experts, e.device(),
                                                          "counts", kFunction);
              groups.capacity = capacity;
            }
            if (invalid_rows)
              groups.invalid_rows = device_vector<std::int32_t>(*invalid_rows, 1, e.device(),
                                                                "invalid_rows", kFunction);
            groups.zero_rows_of_no_expert = zero_rows_of_no_expert;
            const float* bias_values =
                bias ? device_vector<float>(*bias, static_cast<std::int64_t>(n_experts) * om.cols,
                                            e.device(), "bias", kFunction)
                     : nullptr;
            nb::gil_scoped_release release;
            e.moe_gemm_grouped(groups, rm, experts, om, reinterpret_cast<void*>(stream),
                               bias_values);
          },
          nb::arg("rows"), nb::arg("experts"), nb::arg("out"), nb::arg("stream") = 0,
          nb::arg("offsets") = nb::none(), nb::arg("counts") = nb::none(),
          nb::arg("capacity") = 0, nb::arg("bias") = nb::none(),
          nb::arg("invalid_rows") = nb::none(), nb::arg("zero_rows_of_no_expert") = true,
          "The grouped GEMM over rows already grouped by expert (include/qgemm/engine.hpp, "
          "Engine::moe_gemm_grouped): rows bf16/fp16 [R, K], out [R, N]; contiguous with "
          "offsets int32 [experts + 1], or masked with counts int32 [experts] and capacity "
          "(R = experts x capacity); bias fp32 [experts, N]; invalid_rows int32 [1] (rows a "
          "broken grouping sent nowhere). Rows of no expert come out zero, or need not be "
          "written with zero_rows_of_no_expert=False (a masked layout's unused capacity then "
          "costs nothing).")
      .def_prop_ro("device", &qgemm::Engine::device)
      .def_prop_ro("sm_count", &qgemm::Engine::sm_count)
      .def(
          "prepare_weight",
          [](qgemm::Engine& e, const qgemm::PackedWeight& w, const qgemm::Scheme& scheme,
             std::int64_t max_rows) {
            require_weight_of(scheme, w, "Engine.prepare_weight");
            nb::gil_scoped_release release;
            return e.prepare_weight(w, scheme.activation, 0.0, max_rows);
          },
          nb::arg("weight"), nb::arg("scheme"), nb::arg("max_rows") = 65536,
          "Uploads a packed weight in the kernel layouts the selector picks for calls of up to "
          "max_rows rows (fewer rows can mean fewer layouts, hence less memory); the scheme's "
          "activation part says how gemm() quantizes 16-bit activations for it.")
      .def(
          "prepare_weight",
          [](qgemm::Engine& e, const CudaArray& w, const qgemm::Scheme& scheme,
             std::int64_t max_rows, std::uintptr_t stream) {
            const qgemm::DeviceMatrix m =
                device_matrix(w, "weight", e.device(), "Engine.prepare_weight");
            nb::gil_scoped_release release;
            return e.prepare_weight(m, scheme.weight, scheme.activation, 0.0, max_rows,
                                    reinterpret_cast<void*>(stream));
          },
          nb::arg("weight"), nb::arg("scheme"), nb::arg("max_rows") = 65536,
          nb::arg("stream") = 0,
          "The same from a CUDA array [n, k] (bf16, fp16 or fp32) on this engine's GPU, "
          "quantized there (round to nearest, the codes qgemm.quantize_weight gives) and "
          "prepared without leaving the device.")
      .def(
          "quantize_weight",
          [](qgemm::Engine& e, const CudaArray& w, const qgemm::Scheme& scheme,
             std::uintptr_t stream) {
            const qgemm::DeviceMatrix m =
                device_matrix(w, "weight", e.device(), "Engine.quantize_weight");
            nb::gil_scoped_release release;
            return e.quantize_weight(m, scheme.weight, reinterpret_cast<void*>(stream));
          },
          nb::arg("weight"), nb::arg("scheme"), nb::arg("stream") = 0,
          "Round-to-nearest quantization of a CUDA array [n, k] (bf16, fp16 or fp32) on the "
          "GPU: the PackedWeight qgemm.quantize_weight gives for the same values.")
      .def(
          "quantize_and_prepare_weight",
          [](qgemm::Engine& e, const CudaArray& w, const qgemm::Scheme& scheme,
             std::int64_t max_rows, std::uintptr_t stream) {
            const qgemm::DeviceMatrix m =
                device_matrix(w, "weight", e.device(), "Engine.quantize_and_prepare_weight");
            nb::gil_scoped_release release;
            qgemm::Engine::QuantizedOnDevice both = e.quantize_and_prepare_weight(
                m, scheme.weight, scheme.activation, 0.0, max_rows,
                reinterpret_cast<void*>(stream));
            return std::make_pair(std::move(both.packed), std::move(both.prepared));
          },
          nb::arg("weight"), nb::arg("scheme"), nb::arg("max_rows") = 65536,
          nb::arg("stream") = 0,
          "Both from one quantization on the GPU: (PackedWeight, QuantWeight), what "
          "quantize_weight and prepare_weight give, without quantizing twice or uploading the "
          "packed weight back.")
      .def(
          "gemm",
          [](qgemm::Engine& e, const CudaArray& a, const qgemm::QuantWeight& w,
             const CudaArray& out, std::uintptr_t stream, const std::string& candidate,
             std::optional<CudaArray> bias) {
            const qgemm::DeviceMatrix am = device_matrix(a, "a", e.device());
            const qgemm::DeviceMatrix cm = device_matrix(out, "out", e.device());
            qgemm::require(am.cols == w.k() && cm.rows == am.rows && cm.cols == w.n(),
                           "Engine.gemm: a [{}, {}] · weightᵀ [{}, {}] needs out [{}, {}] ({}, {} "
                           "given)",
                           am.rows, am.cols, w.k(), w.n(), am.rows, w.n(), cm.rows, cm.cols);
            qgemm::GemmOptions options;
            options.candidate = candidate;
            if (bias) options.bias = device_bias(*bias, w.n(), e.device());
            nb::gil_scoped_release release;
            e.gemm(am, w, cm, reinterpret_cast<void*>(stream), options);
          },
          nb::arg("a"), nb::arg("weight"), nb::arg("out"), nb::arg("stream") = 0,
          nb::arg("candidate") = "", nb::arg("bias") = nb::none(),
          "out = a · dequant(weight)ᵀ (+ bias) on the given CUDA stream (an integer handle; 0: "
          "the legacy default stream). a: bf16/fp16 [m, k]; out: fp16/bf16/fp32 [m, n]; bias: "
          "fp32 [n] on the engine's GPU, added before the output's rounding.")
      .def(
          "warm_up",
          [](qgemm::Engine& e, const qgemm::QuantWeight& w, std::int64_t max_rows,
             const std::string& input, const std::string& output, bool bias,
             std::uintptr_t stream, bool progress) {
            qgemm::require(max_rows >= 1, "Engine.warm_up: max_rows = {} (rule: at least 1)",
                           max_rows);
            qgemm::GemmProblem problem = qgemm::gemm_problem(w, 1, qgemm::parse_format(input),
                                                             qgemm::parse_format(output));
            problem.m_max = max_rows;
            problem.bias = bias;
            nb::gil_scoped_release release;
            e.warm_up(problem, w, reinterpret_cast<void*>(stream), progress);
          },
          nb::arg("weight"), nb::arg("max_rows"), nb::arg("input") = "bf16",
          nb::arg("output") = "bf16", nb::arg("bias") = false, nb::arg("stream") = 0,
          nb::arg("progress") = false,
          "Compiles every kernel gemm() can choose for this weight at 1 .. max_rows rows of "
          "`input` (bf16/fp16) into `output` (bf16, fp16, fp32), on a pool of threads (a progress "
          "bar on stderr when `progress`), and sizes the stream's workspace: a later call of any "
          "such M, or a CUDA-graph capture of it, then compiles nothing.")
      .def(
          "warm_up_moe",
          [](qgemm::Engine& e, const qgemm::QuantWeight& gate_up, const qgemm::QuantWeight& down,
             const std::vector<std::int64_t>& tokens, int top_k, const std::string& hidden,
             const std::string& output, const std::string& activation, float alpha, float limit,
             bool gate_up_bias, bool down_bias, bool progress) {
            qgemm::MoeOptions options;
            options.activation = glu_of(activation, alpha, limit, "Engine.warm_up_moe");
            // Only whether a bias is given matters to the plans (warm_up_moe reads no pointer).
            static const float kGiven = 0.0f;
            options.gate_up_bias = gate_up_bias ? &kGiven : nullptr;
            options.down_bias = down_bias ? &kGiven : nullptr;
            nb::gil_scoped_release release;
            e.warm_up_moe(gate_up, down, tokens, top_k, qgemm::parse_format(hidden),
                          qgemm::parse_format(output), options, progress);
          },
          nb::arg("gate_up"), nb::arg("down"), nb::arg("tokens"), nb::arg("top_k"),
          nb::arg("hidden") = "bf16", nb::arg("output") = "bf16", nb::arg("activation") = "silu",
          nb::arg("alpha") = 1.702f, nb::arg("limit") = 7.0f, nb::arg("gate_up_bias") = false,
          nb::arg("down_bias") = false, nb::arg("progress") = false,
          "Makes moe()'s plans for each token count in `tokens` at top_k (their kernels "
          "compiled on a pool of threads) and loads the layer's other kernels, for `hidden` "
          "(bf16/fp16) in and `output` out, with the activation and biases the calls will pass: "
          "a later call of such a count, or a CUDA-graph capture of it, compiles nothing.");

  m.def(
      "kernel_cache_counts",
      [] {
        const qgemm::KernelCacheCounts counts = qgemm::kernel_cache_counts();
        nb::dict out;
        out["compiles"] = counts.compiles;
        out["disk_hits"] = counts.disk_hits;
        return out;
      },
      "The process's kernel cache: {'compiles': NVRTC compiles, 'disk_hits': kernels read from "
      "the disk cache} so far (a deployment checks that serving adds none after its warm-up).");

  m.def(
      "reference_moe_layer",
      [](const qgemm::Scheme& scheme, const HostMatrix<float>& hidden,
         const std::vector<qgemm::PackedWeight>& gate_up,
         const std::vector<qgemm::PackedWeight>& down, const HostMatrix<std::int32_t>& topk_ids,
         const HostMatrix<float>& topk_weights, const std::string& activation, float alpha,
         float limit, const std::string& intermediate,
         std::optional<HostMatrix<float>> gate_up_bias, std::optional<HostMatrix<float>> down_bias) {
        const auto tokens = static_cast<std::int64_t>(hidden.shape(0));
        const auto h = static_cast<std::int64_t>(hidden.shape(1));
        const auto top_k = static_cast<std::int64_t>(topk_ids.shape(1));
        qgemm::require(static_cast<std::int64_t>(topk_ids.shape(0)) == tokens &&
                           topk_weights.shape(0) == topk_ids.shape(0) &&
                           topk_weights.shape(1) == topk_ids.shape(1),
                       "reference_moe_layer: topk_ids {}x{} and topk_weights {}x{} for {} tokens "
                       "(rule: both [tokens, top_k])",
                       topk_ids.shape(0), topk_ids.shape(1), topk_weights.shape(0),
                       topk_weights.shape(1), tokens);
        const qgemm::GluActivation glu = glu_of(activation, alpha, limit, "reference_moe_layer");
        qgemm::reference::MoeRouting routing;
        routing.tokens = tokens;
        routing.top_k = static_cast<int>(top_k);
        routing.expert_ids.assign(topk_ids.data(), topk_ids.data() + tokens * top_k);
        routing.weights.assign(topk_weights.data(), topk_weights.data() + tokens * top_k);
        auto bias_of = [](const std::optional<HostMatrix<float>>& bias,
                          const std::vector<qgemm::PackedWeight>& experts, std::int64_t n,
                          const char* name) -> const float* {
          if (!bias) return nullptr;
          qgemm::require(bias->shape(0) == experts.size() &&
                             static_cast<std::int64_t>(bias->shape(1)) == n,
                         "reference_moe_layer: {} is {}x{} (rule: [experts, {}])", name,
                         bias->shape(0), bias->shape(1), n);
          return bias->data();
        };
        qgemm::require(!gate_up.empty() && !down.empty(),
                       "reference_moe_layer: no experts (rule: at least one)");
        const float* up_bias = bias_of(gate_up_bias, gate_up, gate_up.front().n, "gate_up_bias");
        const float* dn_bias = bias_of(down_bias, down, h, "down_bias");
        std::vector<double> out;
        {
          nb::gil_scoped_release release;
          const qgemm::PackedActivation packed =
              qgemm::quantize_activation(scheme.activation, hidden.data(), tokens, h);
          out = qgemm::reference::moe_layer(scheme, packed, gate_up, down, routing, glu,
                                            qgemm::parse_format(intermediate), up_bias, dn_bias);
        }
        return to_numpy(std::move(out), {static_cast<size_t>(tokens), static_cast<size_t>(h)});
      },
      nb::arg("scheme"), nb::arg("hidden"), nb::arg("gate_up"), nb::arg("down"),
      nb::arg("topk_ids"), nb::arg("topk_weights"), nb::arg("activation") = "silu",
      nb::arg("alpha") = 1.702f, nb::arg("limit") = 7.0f, nb::arg("intermediate") = "bf16",
      nb::arg("gate_up_bias") = nb::none(), nb::arg("down_bias") = nb::none(),
      "The CPU reference of a routed expert layer (Engine.moe's definition): hidden (float32 "
      "[tokens, H]) quantized as the scheme's activation part; per choice, gate_up (the "
      "expert's [2I, H]: gate rows, then up rows), rounded to `intermediate`, the GLU, rounded "
      "again, down ([H, I]); the router-weighted sum in double, rounded to the scheme's output; "
      "float64 [tokens, H].");

  m.def(
      "reference_gemm",
      [](const qgemm::Scheme& scheme, const HostMatrix<float>& a, const qgemm::PackedWeight& w,
         std::optional<nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>> bias) {
        require_weight_of(scheme, w, "reference_gemm");
        const auto m_rows = static_cast<std::int64_t>(a.shape(0));
        qgemm::require(static_cast<std::int64_t>(a.shape(1)) == w.k,
                       "reference_gemm: a has {} columns, the weight's k is {}", a.shape(1), w.k);
        if (bias)
          qgemm::require(static_cast<std::int64_t>(bias->shape(0)) == w.n,
                         "reference_gemm: bias has {} values, the weight's n is {}",
                         bias->shape(0), w.n);
        std::vector<double> c;
        {
          nb::gil_scoped_release release;
          const qgemm::PackedActivation packed =
              qgemm::quantize_activation(scheme.activation, a.data(), m_rows, w.k);
          c = qgemm::reference::gemm(scheme, packed, w, bias ? bias->data() : nullptr);
        }
        return to_numpy(std::move(c), {static_cast<size_t>(m_rows), static_cast<size_t>(w.n)});
      },
      nb::arg("scheme"), nb::arg("a"), nb::arg("weight"), nb::arg("bias") = nb::none(),
      "The CPU reference: a (float32 [m, k]) quantized as the scheme's activation part, times "
      "the weight, in double, rounded to the scheme's output format; float64 [m, n].");
}
