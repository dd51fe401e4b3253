// Engine: device context, prepared weights, and the gemm() launch path.
#include "qgemm/engine.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "common/log.hpp"
#include "dispatch/dense_config.hpp"
#include "gemm/dense_gemm_params.cuh"
#include "jit/cache.hpp"
#include "jit/print_configs.hpp"
#include "layout/mma_repack_gpu.hpp"
#include "qgemm/error.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"

namespace qgemm {

namespace detail {
struct PreparedWeight {
  WeightQuant quant;
  layout::MmaWeight host;  // metadata only: the arrays live on the device
  runtime::DeviceBuffer words, scales, zeros;
  std::size_t bytes() const { return words.bytes() + scales.bytes() + zeros.bytes(); }
};
}  // namespace detail

std::int64_t QuantWeight::n() const { return impl_->host.n; }
std::int64_t QuantWeight::k() const { return impl_->host.k; }
const WeightQuant& QuantWeight::quant() const { return impl_->quant; }
std::size_t QuantWeight::device_bytes() const { return impl_->bytes(); }

struct Engine::Impl {
  int device = 0;
  CUcontext context = nullptr;
  runtime::DeviceInfo info;
  jit::Arch arch = jit::Arch::sm_80;

  // Split-K scratch, per stream: fp32 sums and per-tile counters that the kernels leave zero.
  struct Workspace {
    runtime::DeviceBuffer sums, counters;
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
  };
  Launch choose(std::int64_t m, const layout::MmaWeight& w, const Format& activation,
                const Format& output, const GemmOptions& options) const {
    Launch launch;
    launch.plan = dispatch::plan_dense_gemm(m, w, activation, info.sm_count, options.tile_config);
    launch.spec = dispatch::dense_gemm_spec(launch.plan, w, activation, output, arch);
    return launch;
  }

  Workspace& workspace(void* stream, std::size_t sum_bytes, std::size_t counter_bytes) {
    Workspace& w = workspaces[stream];
    auto grow = [](runtime::DeviceBuffer& buffer, std::size_t bytes) {
      if (buffer.bytes() >= bytes) return;
      buffer = runtime::DeviceBuffer(bytes);
      buffer.fill_bytes(0);
    };
    grow(w.sums, sum_bytes);
    grow(w.counters, counter_bytes);
    return w;
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
  impl_->arch = jit::arch_for_device(impl_->info.major, impl_->info.minor);
}

Engine::~Engine() = default;

int Engine::device() const { return impl_->device; }
int Engine::sm_count() const { return impl_->info.sm_count; }

QuantWeight Engine::prepare_weight(const PackedWeight& weight) {
  impl_->make_current();
  auto prepared = std::make_shared<detail::PreparedWeight>();
  prepared->quant = weight.quant;
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

std::string Engine::kernel_for(std::int64_t m, const QuantWeight& weight, const Format& activation,
                               const Format& output, const GemmOptions& options) const {
  const Impl::Launch launch = impl_->choose(m, weight.impl_->host, activation, output, options);
  return jit::to_string(launch.spec) + fmt::format(" splits={}", launch.plan.splits);
}

void Engine::warm_up(std::int64_t m, const QuantWeight& weight, const Format& activation,
                     const Format& output, const GemmOptions& options) const {
  jit::KernelCache::global().get(
      impl_->choose(m, weight.impl_->host, activation, output, options).spec);
}

void Engine::gemm(const DeviceMatrix& a, const QuantWeight& weight, const DeviceMatrix& c,
                  void* stream, const GemmOptions& options) {
  if (!weight)
    throw Error(ErrorCode::InvalidArgument, "gemm: weight is empty (prepare_weight first)");
  const layout::MmaWeight& w = weight.impl_->host;
  const std::int64_t m = a.rows;
  if (m < 1)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: A has {} rows; M must be at least 1", m));
  constexpr std::int64_t kIndexLimit = 0x7fffffff;  // the kernels index rows and columns in int
  if (m > kIndexLimit)
    throw Error(ErrorCode::InvalidArgument, fmt::format("gemm: M = {} exceeds 2^31 - 1", m));
  check_matrix(a, "A", m, w.k);
  check_matrix(c, "C", m, w.n);
  if (!(a.dtype == formats::bf16 || a.dtype == formats::fp16))
    throw Error(ErrorCode::Unsupported,
                fmt::format("gemm: activation type {} is not bf16 or fp16 (quantized activations "
                            "are not served on the GPU yet)",
                            a.dtype.name()));
  if (!(c.dtype == formats::bf16 || c.dtype == formats::fp16 || c.dtype == formats::fp32))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gemm: output type {} is not fp16, bf16 or fp32", c.dtype.name()));
  if (a.stride % 8 != 0 || reinterpret_cast<std::uintptr_t>(a.data) % 16 != 0)
    throw Error(ErrorCode::Unsupported,
                fmt::format("gemm: A needs 16-byte aligned rows (stride {} must be a multiple of 8 "
                            "and the pointer 16-byte aligned)",
                            a.stride));
  if (c.dtype.storage_bytes() == 2 && reinterpret_cast<std::uintptr_t>(c.data) % 4 != 0)
    throw Error(ErrorCode::InvalidArgument, "gemm: C must be 4-byte aligned");

  std::lock_guard lock(impl_->mutex);
  impl_->make_current();
  const Impl::Launch launch = impl_->choose(m, w, a.dtype, c.dtype, options);
  const auto& plan = launch.plan;
  const jit::KernelSpec& spec = launch.spec;
  jit::print_chosen_config("gemm", m, w.n, w.k, spec, plan.config.name);
  const runtime::LoadedKernel kernel = impl_->kernel(spec);

  kernels::DenseGemmParams params{};
  params.a = a.data;
  params.b = weight.impl_->words.as<const unsigned>();
  params.scales = weight.impl_->scales.as<const float>();
  params.zeros = weight.impl_->zeros.bytes() ? weight.impl_->zeros.as<const float>() : nullptr;
  params.c = c.data;
  params.bias = options.bias;
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
    auto& ws =
        impl_->workspace(stream, static_cast<std::size_t>(m) * w.n * sizeof(float),
                         static_cast<std::size_t>(plan.grid_x) * plan.grid_y * sizeof(unsigned));
    params.workspace = ws.sums.as<float>();
    params.counters = ws.counters.as<unsigned>();
  }
  runtime::launch_kernel(kernel, {plan.grid_x, plan.grid_y, static_cast<unsigned>(plan.splits)},
                         params, static_cast<CUstream>(stream));
}

}  // namespace qgemm
