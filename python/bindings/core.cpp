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
#include <utility>
#include <vector>

#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
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

// A CUDA array as a DeviceMatrix: 2-D, unit column stride, bf16 / fp16 / fp32, on `device`.
qgemm::DeviceMatrix device_matrix(const CudaArray& t, const char* name, int device) {
  qgemm::require(t.ndim() == 2, "Engine.gemm: {} must be 2-D ({} dimensions given)", name,
                 t.ndim());
  qgemm::require(t.stride(1) == 1 || t.shape(1) == 1,
                 "Engine.gemm: {} must have unit column stride (stride {} given)", name,
                 t.stride(1));
  qgemm::require(t.device_id() == device, "Engine.gemm: {} is on GPU {}, the engine on GPU {}",
                 name, t.device_id(), device);
  qgemm::DeviceMatrix m;
  const nb::dlpack::dtype dt = t.dtype();
  if (dt == nb::dtype<float>())
    m.dtype = qgemm::formats::fp32;
  else if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16)
    m.dtype = qgemm::formats::fp16;
  else if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16)
    m.dtype = qgemm::formats::bf16;
  else
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("Engine.gemm: {} must be bf16, fp16 or fp32", name));
  m.data = t.data();
  m.rows = static_cast<std::int64_t>(t.shape(0));
  m.cols = static_cast<std::int64_t>(t.shape(1));
  m.stride = t.shape(0) > 1 ? static_cast<std::int64_t>(t.stride(0)) : m.cols;
  return m;
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
      .def_prop_ro("device_bytes", &qgemm::QuantWeight::device_bytes);

  nb::class_<qgemm::Engine>(m, "Engine", "One per GPU: prepares weights and runs GEMMs.")
      .def(nb::init<int>(), nb::arg("device") = 0)
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
          "fp32 [n] on the engine's GPU, added before the output's rounding.");

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
