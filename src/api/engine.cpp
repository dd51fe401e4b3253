// Engine: device context, prepared weights, and the gemm() launch path.
#include "qgemm/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include "common/log.hpp"
#include "dispatch/dense_config.hpp"
#include "dispatch/tuned_config.hpp"
#include "gemm/dense_gemm_params.cuh"
#include "gemm/dequant_cublas_args.cuh"
#include "gemm/mma_dequantize_shape.cuh"
#include "gemm/mma_weight_layout.cuh"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "jit/print_configs.hpp"
#include "layout/mma_repack_gpu.hpp"
#include "qgemm/error.hpp"
#include "runtime/cublas.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/mma_dequantize_launch.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm {

namespace detail {
// The mma layout (words, scales, zeros as kernels/gemm/mma_weight_layout.cuh draws them), or,
// for a weight that layout cannot hold (layout::mma_unsupported_reason), the canonical packed
// weight itself (codes, scales, zeros as include/qgemm/quant.hpp), which only dequant + cuBLAS
// serves.
struct PreparedWeight {
  WeightQuant quant;
  // How gemm() quantizes bf16/fp16 activations for this weight, and the 16-bit operand type
  // quantized activations are served through (jit::activation_operand_format).
  ActivationQuant activation;
  double static_activation_scale = 0.0;
  Format operand = formats::bf16;
  layout::MmaWeight host;  // metadata only (sizes; for `canonical`, n, k and the padding)
  std::optional<PackedWeight> canonical;  // shapes and scales' metadata only: vectors empty
  runtime::DeviceBuffer words, scales, zeros;
  std::size_t bytes() const { return words.bytes() + scales.bytes() + zeros.bytes(); }
};
}  // namespace detail

std::int64_t QuantWeight::n() const { return impl_->host.n; }
std::int64_t QuantWeight::k() const { return impl_->host.k; }
const WeightQuant& QuantWeight::quant() const { return impl_->quant; }
const ActivationQuant& QuantWeight::activation() const { return impl_->activation; }
std::size_t QuantWeight::device_bytes() const { return impl_->bytes(); }

struct Engine::Impl {
  int device = 0;
  CUcontext context = nullptr;
  runtime::DeviceInfo info;
  dispatch::GpuLimits gpu;  // of `info`
  jit::Arch arch = jit::Arch::sm_80;

  // Scratch per stream. Split-K: fp32 sums and per-tile counters that the kernels leave zero.
  // Dequant + cuBLAS: the 16-bit weight chunk and, where C needs finishing, its fp32 sums.
  // Quantized activations: the 16-bit operand [M][round_up(K, 8)], its row factors, and the
  // tensor absmax of the scalings that need one.
  struct Workspace {
    runtime::DeviceBuffer sums, counters;
    runtime::DeviceBuffer weight_chunk, chunk_sums;
    runtime::DeviceBuffer operand, row_factors, absmax;
  };
  std::mutex mutex;
  std::map<void*, Workspace> workspaces;

  // Kernels by spec text: the launch path looks up a loaded function, never re-hashes headers.
  std::map<std::string, runtime::LoadedKernel> kernels;

  void make_current() const { runtime::use_primary_context(device); }

  // The one place a call's tile config, split factor and kernel spec are chosen.
  struct Launch {
    dispatch::DensePlan plan;
    jit::KernelSpec spec;
    runtime::LoadedKernel kernel;  // of `spec`, once loaded (ready())
  };
  Launch choose(std::int64_t m, const detail::PreparedWeight& weight, const Format& activation,
                const Format& output, const GemmOptions& options) const {
    Launch launch;
    if (weight.canonical) {
      if (!options.tile_config.empty() && options.tile_config != "dequant-cublas")
        throw Error(
            ErrorCode::Unsupported,
            fmt::format("dense gemm: config '{}' cannot serve this weight: {}", options.tile_config,
                        *layout::mma_unsupported_reason(weight.quant)));
      launch.plan = dispatch::plan_dense_gemm(m, weight.host, activation, gpu, "dequant-cublas");
      launch.spec = jit::dequantize_weight_spec(weight.quant, activation, arch);
      return launch;
    }
    // Unforced: the tuning table's config where one applies (dispatch/tuned_config.hpp), keyed
    // by the weight's scheme (its activation part when gemm() quantizes A for it).
    std::string config = options.tile_config;
    // (The tuning tables hold 16-bit operand configs only.)
    if (config.empty() && activation.storage_bytes() == 2) {
      Scheme scheme = dispatch::call_scheme(weight.quant, activation, output);
      if (weight.activation.is_quantized()) scheme.activation = weight.activation;
      config = dispatch::tuned_dense_config(info, scheme, m, weight.host, activation);
    }
    launch.plan = dispatch::plan_dense_gemm(m, weight.host, activation, gpu, config);
    launch.spec = dispatch::dense_gemm_spec(launch.plan, weight.host, activation, output, arch);
    return launch;
  }

  std::unique_ptr<runtime::Cublas> cublas_handle;  // made at the first dequant + cuBLAS call

  static void grow(runtime::DeviceBuffer& buffer, std::size_t bytes) {
    if (buffer.bytes() >= bytes) return;
    buffer = runtime::DeviceBuffer(bytes);
    buffer.fill_bytes(0);
  }

  Workspace& workspace(void* stream, std::size_t sum_bytes, std::size_t counter_bytes) {
    Workspace& w = workspaces[stream];
    grow(w.sums, sum_bytes);
    grow(w.counters, counter_bytes);
    return w;
  }

  runtime::Cublas& cublas() {
    if (!cublas_handle) cublas_handle = std::make_unique<runtime::Cublas>();
    return *cublas_handle;
  }

  // choose() with the kernel loaded (JIT-compiled on first use): a call plans and loads all its
  // kernels before it enqueues any, so that they reach the stream back to back.
  Launch ready(std::int64_t m, const detail::PreparedWeight& weight, const Format& activation,
               const Format& output, const GemmOptions& options) {
    Launch launch = choose(m, weight, activation, output, options);
    launch.kernel = kernel(launch.spec);
    return launch;
  }
  // The GEMM proper on a 16-bit A (the caller's, or the operand of quantized activations with
  // their row factors). Called with `mutex` held and the context current.
  void run(const DeviceMatrix& a, const detail::PreparedWeight& weight, const DeviceMatrix& c,
           void* stream, const GemmOptions& options, const Launch& launch,
           const float* row_factors);
  void dequant_cublas(const DeviceMatrix& a, const detail::PreparedWeight& weight,
                      const DeviceMatrix& c, void* stream, const GemmOptions& options,
                      const Launch& launch, const float* row_factors);
  static const detail::PreparedWeight& prepared(const QuantWeight& weight) {
    if (!weight)
      throw Error(ErrorCode::InvalidArgument, "gemm: weight is empty (prepare_weight first)");
    return *weight.impl_;
  }
  // The type the GEMM's mma takes for A of type `input` against `weight`: A itself, or for
  // quantized activations their 8-bit codes or 16-bit operand (dispatch::dense_operand).
  Format operand_type(std::int64_t m, const detail::PreparedWeight& weight, const Format& input,
                      const GemmOptions& options) const {
    if (!weight.activation.is_quantized()) return input;
    return operand_type(m, weight, weight.activation, weight.operand, options);
  }
  // The same for activations quantized as `quant`, whose 16-bit operand is `operand16`.
  Format operand_type(std::int64_t m, const detail::PreparedWeight& weight,
                      const ActivationQuant& quant, const Format& operand16,
                      const GemmOptions& options) const {
    if (weight.canonical) return operand16;  // dequant + cuBLAS only
    return dispatch::dense_operand(m, weight.host, quant, operand16, gpu, options.tile_config);
  }
  // The operand matrix (and row factors) of M quantized rows of K in `stream`'s workspace:
  // 16-byte aligned rows, whole runs of 16 for 8-bit codes (their K order permutes inside them).
  DeviceMatrix operand_for(void* stream, std::int64_t m, std::int64_t k, const Format& type,
                           float** row_factors) {
    Workspace& ws = workspaces[stream];
    const std::int64_t bytes = type.storage_bytes();
    const std::int64_t ldo = (k + 16 / bytes - 1) / (16 / bytes) * (16 / bytes);
    grow(ws.operand, static_cast<std::size_t>(m * ldo * bytes));
    grow(ws.row_factors, static_cast<std::size_t>(m) * sizeof(float));
    *row_factors = ws.row_factors.as<float>();
    return {ws.operand.as<void>(), m, k, ldo, type};
  }

  runtime::LoadedKernel kernel(const jit::KernelSpec& spec) {
    const std::string text = jit::to_string(spec);
    auto found = kernels.find(text);
    if (found != kernels.end()) return found->second;
    auto lookup = jit::KernelCache::global().get(spec);
    runtime::LoadedKernel loaded = runtime::KernelLoader::global().get(*lookup.kernel);
    kernels.emplace(text, loaded);
    return loaded;
  }
};

Engine::Engine(int device) : impl_(std::make_unique<Impl>()) {
  const int count = runtime::device_count();
  if (device < 0 || device >= count)
    throw Error(
        ErrorCode::NoDevice,
        fmt::format("engine: device {} does not exist ({} CUDA devices visible)", device, count));
  impl_->device = device;
  impl_->context = runtime::use_primary_context(device);
  impl_->info = runtime::device_info(device);
  impl_->gpu = dispatch::GpuLimits::of_device(impl_->info);
  impl_->arch = impl_->gpu.arch;
}

Engine::~Engine() = default;

int Engine::device() const { return impl_->device; }
int Engine::sm_count() const { return impl_->info.sm_count; }

QuantWeight Engine::prepare_weight(const PackedWeight& weight, const ActivationQuant& activation,
                                   double static_activation_scale) {
  impl_->make_current();
  auto prepared = std::make_shared<detail::PreparedWeight>();
  prepared->quant = weight.quant;
  check_packed_weight(weight, "prepare_weight");
  if (activation.is_quantized()) {
    Scheme scheme;
    scheme.weight = weight.quant;
    scheme.activation = activation;
    validate(scheme);  // names the activation field and rule
    validate_shape(scheme, 1, weight.n, weight.k);
    require(std::isfinite(static_activation_scale),
            "prepare_weight: static_activation_scale = {} (rule: finite; > 0 a "
            "calibrated scale, <= 0 each call's tensor absmax)",
            static_activation_scale);
    prepared->activation = activation;
    prepared->static_activation_scale =
        activation.scaling == ActivationScaling::StaticTensor ? static_activation_scale : 0.0;
    prepared->operand = jit::activation_operand_format(activation);
  }
  if (auto reason = layout::mma_unsupported_reason(weight.quant)) {
    log(LogLevel::Info, "prepare_weight: {}: kept canonical, served by dequantize + cuBLAS",
        *reason);
    PackedWeight shape;  // the metadata, without the arrays
    shape.quant = weight.quant;
    shape.n = weight.n;
    shape.k = weight.k;
    shape.global_scale = weight.global_scale;
    prepared->host.format = weight.quant.format;
    prepared->host.n = weight.n;
    prepared->host.k = weight.k;
    prepared->host.n_padded = kernels::MmaWeightLayout::padded_n(weight.n);
    prepared->host.k_blocks = kernels::MmaWeightLayout::k_blocks(weight.k);
    prepared->host.global_scale = weight.global_scale;
    prepared->canonical = std::move(shape);
    prepared->words = runtime::DeviceBuffer::from(weight.codes);
    prepared->scales = runtime::DeviceBuffer::from(weight.scales);
    if (!weight.zeros.empty()) prepared->zeros = runtime::DeviceBuffer::from(weight.zeros);
    QuantWeight out;
    out.impl_ = std::move(prepared);
    return out;
  }
  // On the device (gemm/mma_repack.cuh; its host twin layout::repack_for_mma is what the tests
  // compare it with): the canonical weight goes up once and is reordered there.
  layout::MmaDeviceWeight device = layout::repack_for_mma_on_device(weight, impl_->arch, nullptr);
  prepared->host = std::move(device.meta);
  prepared->words = std::move(device.words);
  prepared->scales = std::move(device.scales);
  prepared->zeros = std::move(device.zeros);
  QuantWeight out;
  out.impl_ = std::move(prepared);
  return out;
}

namespace {

void check_matrix(const DeviceMatrix& m, const char* name, std::int64_t rows, std::int64_t cols) {
  auto fail = [&](const std::string& rule) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("gemm: {} {}", name, rule));
  };
  if (!m.data) fail("is null");
  if (m.rows != rows || m.cols != cols)
    fail(fmt::format("is {}x{}, expected {}x{}", m.rows, m.cols, rows, cols));
  if (m.stride < m.cols) fail(fmt::format("stride {} is below its {} columns", m.stride, m.cols));
}

}  // namespace

// C = A · Wᵀ chunk by chunk of N: dequantize the chunk's rows to A's type, multiply with cuBLAS
// (global scale as alpha) into C directly, or into fp32 sums that finish_gemm adds the bias to
// and converts (cuBLAS writes only fp32 or the input type, and has no bias here).
void Engine::Impl::dequant_cublas(const DeviceMatrix& a, const detail::PreparedWeight& weight,
                                  const DeviceMatrix& c, void* stream, const GemmOptions& options,
                                  const Launch& launch, const float* row_factors) {
  const layout::MmaWeight& w = weight.host;
  const std::int64_t m = a.rows;
  std::int64_t chunk = launch.plan.chunk_n;
  // A canonical weight's chunks start on scale rows (a block grid has rows_per > 1).
  const ScaleGrid grid = weight.canonical ? weight.canonical->scale_grid() : ScaleGrid{};
  chunk = (chunk + grid.rows_per - 1) / grid.rows_per * grid.rows_per;
  const bool direct =
      !options.bias && !row_factors && (c.dtype == a.dtype || c.dtype == formats::fp32);
  // The mma dequantization writes 16-byte aligned rows (ld K rounded up to 8); the canonical one
  // dense rows of K.
  const std::int64_t ld_w16 =
      weight.canonical ? w.k : kernels::MmaDequantizeShape::ld_out(w.k);
  Workspace& ws = workspaces[stream];
  grow(ws.weight_chunk, static_cast<std::size_t>(chunk * ld_w16) * 2);
  if (!direct) grow(ws.chunk_sums, static_cast<std::size_t>(m * chunk) * sizeof(float));
  const runtime::LoadedKernel& dequantize = launch.kernel;
  runtime::LoadedKernel finish;
  if (!direct) finish = kernel(dispatch::finish_gemm_spec(c.dtype, arch));
  runtime::Cublas& blas = cublas();
  auto grid_for = [](std::int64_t items) {
    return runtime::LaunchGrid{
        static_cast<unsigned>(std::clamp<std::int64_t>((items + 255) / 256, 1, 65536)), 1, 1};
  };
  const auto cu_stream = static_cast<CUstream>(stream);
  for (std::int64_t n0 = 0; n0 < w.n; n0 += chunk) {
    const std::int64_t rows = std::min(chunk, w.n - n0);
    unsigned short* w16 = ws.weight_chunk.as<unsigned short>();
    float alpha = static_cast<float>(w.global_scale);
    if (weight.canonical) {
      // Rows [n0, n0 + rows) of the canonical arrays, as a weight of `rows` rows.
      const PackedWeight& shape = *weight.canonical;
      PackedWeight part = shape;
      part.n = rows;
      const std::int64_t scale_row = n0 / grid.rows_per;
      const Format& scale_format = shape.quant.scale_format;
      const std::int64_t scale_bytes = scale_format.storage_bytes();
      const std::int64_t zero_row_bytes = shape.quant.zero_point == ZeroPoint::Integer
                                              ? (grid.cols * shape.quant.format.bits + 7) / 8
                                              : grid.cols * scale_bytes;
      const CUdeviceptr base_zeros =
          weight.zeros.bytes() ? reinterpret_cast<CUdeviceptr>(weight.zeros.as<void>()) : 0;
      const kernels::DequantizeWeightArgs args = runtime::dequantize_weight_args(
          part,
          reinterpret_cast<CUdeviceptr>(weight.words.as<unsigned char>() + n0 * shape.row_bytes()),
          reinterpret_cast<CUdeviceptr>(weight.scales.as<unsigned char>() +
                                        scale_row * grid.cols * scale_bytes),
          base_zeros ? base_zeros + scale_row * zero_row_bytes : 0,
          reinterpret_cast<CUdeviceptr>(w16));
      runtime::launch_dequantize_weight(dequantize, args, cu_stream);
      alpha = 1.0f;  // the canonical dequantization applies the global scale
    } else {
      kernels::MmaDequantizeArgs d{};
      d.words = weight.words.as<const unsigned>();
      d.scales = weight.scales.as<const float>();
      d.zeros = weight.zeros.bytes() ? weight.zeros.as<const float>() : nullptr;
      d.out = w16;
      d.n_begin = n0;
      d.rows = rows;
      d.k = w.k;
      d.ld_out = ld_w16;
      d.k_blocks = w.k_blocks;
      d.n_padded = w.n_padded;
      runtime::launch_mma_dequantize(dequantize, launch.spec, d, info.sm_count, cu_stream);
    }
    void* c_chunk = static_cast<unsigned char*>(c.data) + n0 * c.dtype.storage_bytes();
    if (direct) {
      blas.gemm_nt(stream, m, rows, w.k, alpha, a.data, a.stride, w16, ld_w16, a.dtype, c_chunk,
                   c.stride, c.dtype);
      continue;
    }
    blas.gemm_nt(stream, m, rows, w.k, alpha, a.data, a.stride, w16, ld_w16, a.dtype,
                 ws.chunk_sums.as<void>(), rows, formats::fp32);
    kernels::FinishGemmArgs f{};
    f.sums = ws.chunk_sums.as<const float>();
    f.row_factors = row_factors;
    f.bias = options.bias;
    f.c = c_chunk;
    f.m = m;
    f.cols = rows;
    f.ldc = c.stride;
    f.n_begin = n0;
    runtime::launch_kernel(finish, grid_for(m * rows), f, cu_stream);
  }
}

namespace {

// Where a quantize or expand kernel's `args` write the GEMM's operand: 8-bit codes or 16-bit
// values (by the operand's type), and the rows' factors.
template <typename Args>
void write_operand_to(Args& args, const DeviceMatrix& operand, float* row_factors) {
  if (operand.dtype.storage_bytes() == 1) {
    args.operand8 = static_cast<unsigned char*>(operand.data);
  } else {
    args.operand = static_cast<unsigned short*>(operand.data);
  }
  args.ldo = operand.stride;
  args.row_factors = row_factors;
}

// The quantization of `input` into the GEMM's operand `type` (16-bit, or the 8-bit codes).
jit::KernelSpec quantize_spec(const detail::PreparedWeight& weight, const Format& input,
                              const Format& type, jit::Arch arch) {
  return jit::quantize_activation_spec(
      weight.activation, input,
      type.storage_bytes() == 1 ? jit::ActivationEmit::Operand8 : jit::ActivationEmit::Operand,
      type, arch);
}

}  // namespace

std::string Engine::kernel_for(std::int64_t m, const QuantWeight& weight, const Format& activation,
                               const Format& output, const GemmOptions& options) const {
  const detail::PreparedWeight& w = Impl::prepared(weight);
  const Format type = impl_->operand_type(m, w, activation, options);
  const Impl::Launch launch = impl_->choose(m, w, type, output, options);
  std::string text = w.activation.is_quantized()
                         ? jit::to_string(quantize_spec(w, activation, type, impl_->arch)) + " + "
                         : std::string();
  text += jit::to_string(launch.spec);
  if (launch.plan.config.kernel == dispatch::DenseKernel::DequantCublas)
    return text + fmt::format(" + cuBLAS chunk_n={}", launch.plan.chunk_n);
  return text + fmt::format(" splits={}", launch.plan.splits);
}

void Engine::warm_up(std::int64_t m, const QuantWeight& weight, const Format& activation,
                     const Format& output, const GemmOptions& options) const {
  const detail::PreparedWeight& w = Impl::prepared(weight);
  const Format type = impl_->operand_type(m, w, activation, options);
  const Impl::Launch launch = impl_->choose(m, w, type, output, options);
  jit::KernelCache::global().get(launch.spec);
  if (w.activation.is_quantized()) {
    jit::KernelCache::global().get(quantize_spec(w, activation, type, impl_->arch));
    if (runtime::needs_tensor_absmax(w.activation, w.static_activation_scale))
      jit::KernelCache::global().get(jit::tensor_absmax_spec(activation, impl_->arch));
  }
  if (launch.plan.config.kernel == dispatch::DenseKernel::DequantCublas) {
    jit::KernelCache::global().get(dispatch::finish_gemm_spec(output, impl_->arch));
    std::lock_guard lock(impl_->mutex);
    impl_->make_current();
    impl_->cublas();  // the handle exists before any stream capture
  }
}

namespace {

void check_output(const DeviceMatrix& c, std::int64_t m, std::int64_t n) {
  check_matrix(c, "C", m, n);
  if (!(c.dtype == formats::bf16 || c.dtype == formats::fp16 || c.dtype == formats::fp32))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: output type {} is not fp16, bf16 or fp32", c.dtype.name()));
  if (c.dtype.storage_bytes() == 2 && reinterpret_cast<std::uintptr_t>(c.data) % 4 != 0)
    throw Error(ErrorCode::InvalidArgument, "gemm: C must be 4-byte aligned");
}

void check_rows(std::int64_t m) {
  if (m < 1)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} rows; M must be at least 1", m));
  constexpr std::int64_t kIndexLimit = 0x7fffffff;  // the kernels index rows and columns in int
  if (m > kIndexLimit)
    throw Error(ErrorCode::InvalidArgument, fmt::format("gemm: M = {} exceeds 2^31 - 1", m));
}

}  // namespace

void Engine::gemm(const DeviceMatrix& a, const QuantWeight& weight, const DeviceMatrix& c,
                  void* stream, const GemmOptions& options) {
  const detail::PreparedWeight& w = Impl::prepared(weight);
  const std::int64_t m = a.rows;
  check_rows(m);
  check_matrix(a, "A", m, w.host.k);
  check_output(c, m, w.host.n);
  if (!(a.dtype == formats::bf16 || a.dtype == formats::fp16))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: activation type {} is not bf16 or fp16 (quantized activations "
                            "come as a DeviceActivation)",
                            a.dtype.name()));
  std::lock_guard lock(impl_->mutex);
  impl_->make_current();
  if (!w.activation.is_quantized()) {
    if (a.stride % 8 != 0 || reinterpret_cast<std::uintptr_t>(a.data) % 16 != 0)
      throw Error(ErrorCode::Unsupported,
                  fmt::format("gemm: A needs 16-byte aligned rows (stride {} must be a multiple of "
                              "8 and the pointer 16-byte aligned)",
                              a.stride));
    impl_->run(a, w, c, stream, options, impl_->ready(m, w, a.dtype, c.dtype, options), nullptr);
    return;
  }
  // Quantize A as the weight's activation scheme says, into the operand the GEMM takes.
  float* row_factors = nullptr;
  const Format type = impl_->operand_type(m, w, a.dtype, options);
  const DeviceMatrix operand = impl_->operand_for(stream, m, w.host.k, type, &row_factors);
  const Impl::Launch launch = impl_->ready(m, w, type, c.dtype, options);
  const runtime::LoadedKernel quantize =
      impl_->kernel(quantize_spec(w, a.dtype, type, impl_->arch));
  const auto cu_stream = static_cast<CUstream>(stream);
  kernels::QuantizeActivationArgs args = runtime::quantize_activation_args(
      w.activation, m, w.host.k, reinterpret_cast<CUdeviceptr>(a.data), a.stride,
      w.static_activation_scale);
  write_operand_to(args, operand, row_factors);
  if (runtime::needs_tensor_absmax(w.activation, w.static_activation_scale)) {
    Impl::grow(impl_->workspaces[stream].absmax, sizeof(float));
    const runtime::DeviceBuffer& absmax = impl_->workspaces[stream].absmax;
    runtime::launch_tensor_absmax(impl_->kernel(jit::tensor_absmax_spec(a.dtype, impl_->arch)),
                                  reinterpret_cast<CUdeviceptr>(a.data), m, w.host.k, a.stride,
                                  absmax.address(), cu_stream);
    args.tensor_absmax = absmax.as<const float>();
  }
  runtime::launch_quantize_activation(quantize, args, cu_stream);
  impl_->run(operand, w, c, stream, options, launch, row_factors);
}

void Engine::gemm(const DeviceActivation& a, const QuantWeight& weight, const DeviceMatrix& c,
                  void* stream, const GemmOptions& options) {
  const detail::PreparedWeight& w = Impl::prepared(weight);
  const std::int64_t m = a.rows;
  check_rows(m);
  if (!a.quant.is_quantized())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: the DeviceActivation's format {} is not quantized (rule: pass "
                            "bf16/fp16 activations as a DeviceMatrix)",
                            a.quant.format.name()));
  Scheme scheme;
  scheme.weight = w.quant;
  scheme.activation = a.quant;
  validate(scheme);
  if (a.cols != w.host.k)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} columns, the weight's K is {}", a.cols, w.host.k));
  validate_shape(scheme, m, w.host.n, a.cols);
  if (!a.codes || !a.scales)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A's {} is null", a.codes ? "scales" : "codes"));
  if (!(std::isfinite(a.tensor_scale) && a.tensor_scale > 0))
    throw Error(
        ErrorCode::InvalidArgument,
        fmt::format("gemm: A's tensor_scale = {} (rule: positive and finite)", a.tensor_scale));
  check_output(c, m, w.host.n);
  std::lock_guard lock(impl_->mutex);
  impl_->make_current();
  // The codes as the 8-bit mma's operand where it serves (dispatch::dense_operand), else the
  // 16-bit operand.
  const Format type =
      impl_->operand_type(m, w, a.quant, jit::activation_operand_format(a.quant), options);
  float* row_factors = nullptr;
  const DeviceMatrix operand = impl_->operand_for(stream, m, a.cols, type, &row_factors);
  const Impl::Launch launch = impl_->ready(m, w, type, c.dtype, options);
  const runtime::LoadedKernel expand =
      impl_->kernel(jit::expand_activation_spec(a.quant, type, impl_->arch));
  kernels::ExpandActivationArgs args{};
  args.codes = static_cast<const unsigned char*>(a.codes);
  args.scales = static_cast<const unsigned char*>(a.scales);
  args.tensor_scale = static_cast<float>(a.tensor_scale);
  write_operand_to(args, operand, row_factors);
  args.m = m;
  args.k = a.cols;
  args.group = a.quant.group > 0 ? a.quant.group : a.cols;
  runtime::launch_expand_activation(expand, args, static_cast<CUstream>(stream));
  impl_->run(operand, w, c, stream, options, launch, row_factors);
}

void Engine::Impl::run(const DeviceMatrix& a, const detail::PreparedWeight& weight,
                       const DeviceMatrix& c, void* stream, const GemmOptions& options,
                       const Launch& launch, const float* row_factors) {
  const layout::MmaWeight& w = weight.host;
  const std::int64_t m = a.rows;
  const auto& plan = launch.plan;
  const jit::KernelSpec& spec = launch.spec;
  jit::print_chosen_config("gemm", m, w.n, w.k, spec, plan.config.name);
  if (plan.config.kernel == dispatch::DenseKernel::DequantCublas) {
    dequant_cublas(a, weight, c, stream, options, launch, row_factors);
    return;
  }

  kernels::DenseGemmParams params{};
  params.a = a.data;
  params.b = weight.words.as<const unsigned>();
  params.scales = weight.scales.as<const float>();
  params.zeros = weight.zeros.bytes() ? weight.zeros.as<const float>() : nullptr;
  params.c = c.data;
  params.bias = options.bias;
  params.row_factors = row_factors;
  params.lda = a.stride;
  params.ldc = c.stride;
  params.m = static_cast<int>(m);
  params.n = static_cast<int>(w.n);
  params.k = static_cast<int>(w.k);
  params.n_padded = static_cast<int>(w.n_padded);
  params.k_blocks = static_cast<int>(w.k_blocks);
  params.groups = w.groups;
  params.k_tiles = plan.k_tiles;
  params.tiles_per_split = plan.tiles_per_split;
  params.blocks_per_warp = plan.blocks_per_warp;
  params.global_scale = static_cast<float>(w.global_scale);
  if (plan.splits > 1) {
    auto& ws = workspace(stream, static_cast<std::size_t>(m) * w.n * sizeof(float),
                         static_cast<std::size_t>(plan.grid_x) * plan.grid_y * sizeof(unsigned));
    params.workspace = ws.sums.as<float>();
    params.counters = ws.counters.as<unsigned>();
  }
  runtime::launch_kernel(launch.kernel,
                         {plan.grid_x, plan.grid_y, static_cast<unsigned>(plan.splits)}, params,
                         static_cast<CUstream>(stream));
}

}  // namespace qgemm
