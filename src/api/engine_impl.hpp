// What the Engine holds (include/qgemm/engine.hpp), shared by the files that implement it:
// engine.cpp (prepare, plan, run, gemm) and moe.cpp (expert weights, routing, the MoE layer).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/plan_data.hpp"
#include "dispatch/select.hpp"
#include "dispatch/tuned_config.hpp"
#include "jit/cache.hpp"
#include "jit/kernel_spec.hpp"
#include "layout/mma_repack_gpu.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "quant/quantize_on_device.hpp"
#include "runtime/cublas.hpp"
#include "runtime/cublaslt.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/moe.hpp"

namespace qgemm {

namespace detail {

// A weight prepared on one device: the layouts it was given (WeightFacts says which), the
// activation quantization gemm() applies for it, and the plans gemm() made for it.
struct PreparedWeight {
  std::uint64_t id = 0;  // unique per prepared weight (plans are made for one)
  const void* engine = nullptr;  // the Engine::Impl that prepared it
  int device = 0;
  WeightQuant quant;
  std::int64_t n = 0, k = 0;
  double global_scale = 1.0;
  ActivationQuant activation;
  double static_activation_scale = 0.0;
  dispatch::WeightFacts facts;
  PackedWeight canonical_shape;  // the canonical metadata (vectors empty), for its dequantizer
  runtime::DeviceBuffer words, scales, zeros;                      // the mma layout
  runtime::DeviceBuffer wgmma_words, wgmma_scales, wgmma_zeros;    // the wgmma order
  // The arrays of the weight prepared in `order` (empty buffers when it was not).
  struct OrderArrays {
    const runtime::DeviceBuffer &words, &scales, &zeros;
  };
  OrderArrays in_order(layout::FragmentOrder order) const {
    if (order == layout::FragmentOrder::Wgmma) return {wgmma_words, wgmma_scales, wgmma_zeros};
    return {words, scales, zeros};
  }
  runtime::DeviceBuffer codes, canonical_scales, canonical_zeros;  // the canonical form
  runtime::DeviceBuffer fp8_scales;  // cuBLASLt's fp32 scales (facts.fp8_weight_mode's layout)
  // Expert weights (Engine::prepare_experts): `experts` wgmma orders back to back (the kernel
  // finds expert e's tiles from e · n_tiles and its scale rows from e · groups); 0: dense.
  int experts = 0;
  // A gate_up expert set interleaved for Engine::moe's fused GLU (ExpertRole::GateUp): I, half
  // its N (the repack's kernels::glu_source_row order); 0: rows where they are.
  std::int64_t glu_inter = 0;

  // gemm()'s plans, by call shape.
  struct PlanKey {
    std::int64_t m;
    std::string input, output, candidate;
    bool bias;
    int a_alignment;
    std::int64_t ldc;
    int c_alignment;
    std::uint64_t table_generation;
    friend bool operator<(const PlanKey& a, const PlanKey& b) {
      return std::tie(a.m, a.input, a.output, a.candidate, a.bias, a.a_alignment, a.ldc,
                      a.c_alignment, a.table_generation) <
             std::tie(b.m, b.input, b.output, b.candidate, b.bias, b.a_alignment, b.ldc,
                      b.c_alignment, b.table_generation);
    }
  };
  mutable std::shared_mutex plans_mutex;
  mutable std::map<PlanKey, GemmPlan> plans;
  // The plan kept under `key`, made by `make()` on the key's first call (a call racing it makes
  // one too; the first kept serves both).
  template <class Make>
  GemmPlan plan_for(const PlanKey& key, Make&& make) const {
    {
      std::shared_lock lock(plans_mutex);
      if (auto found = plans.find(key); found != plans.end()) return found->second;
    }
    GemmPlan plan = make();
    std::unique_lock lock(plans_mutex);
    return plans.emplace(key, std::move(plan)).first->second;
  }

  std::size_t bytes() const {
    return words.bytes() + scales.bytes() + zeros.bytes() + wgmma_words.bytes() +
           wgmma_scales.bytes() + wgmma_zeros.bytes() + codes.bytes() +
           canonical_scales.bytes() + canonical_zeros.bytes() + fp8_scales.bytes();
  }
};

}  // namespace detail

namespace detail {

// Device buffers and scratch regions are 256-byte aligned (TMA and 16-byte vector accesses
// need less; this keeps every region on its own cache lines).
// Ids of prepared weights (plans are made for one).
inline std::atomic<std::uint64_t> next_weight_id{1};

inline constexpr std::size_t kAlign = 256;
inline std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
template <typename T>
T* at(void* base, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace detail

struct Engine::Impl {
  int device = 0;
  CUcontext context = nullptr;
  runtime::DeviceInfo info;
  dispatch::GpuLimits gpu;  // of `info`
  dispatch::GpuRates rates;
  jit::Arch arch = jit::Arch::sm_80;

  // Loaded kernels by spec text (plan time only: runs hold their LoadedKernel).
  std::mutex kernels_mutex;
  std::map<std::string, runtime::LoadedKernel> kernels;

  // cuBLAS for dequantize + cuBLAS: one handle, used under this lock (its stream and workspace
  // are per call).
  std::mutex blas_mutex;
  std::unique_ptr<runtime::Cublas> blas;
  // cuBLASLt for its FP8 candidate (made at the first plan that takes it).
  std::mutex lt_mutex;
  std::unique_ptr<runtime::CublasLt> lt;

  // Workspaces per stream: scratch, and the split-K region the kernels leave zero. They only
  // grow, in plan() / warm_up() / a gemm() that plans; an outgrown buffer is kept until the
  // engine goes (a run on another thread may still hold its address).
  // Calls from several threads on one stream enqueue one at a time: a call's kernels pass its
  // operand through the stream's scratch, which the next call's first kernel would overwrite.
  struct StreamWorkspace {
    runtime::DeviceBuffer scratch, zeroed;
    std::mutex enqueue;
  };
  std::shared_mutex workspace_mutex;
  std::unordered_map<void*, StreamWorkspace> workspaces;
  std::vector<runtime::DeviceBuffer> retired;

  void make_current() const { runtime::use_primary_context(device); }

  runtime::LoadedKernel kernel(const jit::KernelSpec& spec) {
    const std::string text = jit::to_string(spec);
    std::lock_guard lock(kernels_mutex);
    auto found = kernels.find(text);
    if (found != kernels.end()) return found->second;
    auto lookup = jit::KernelCache::global().get(spec);
    make_current();
    runtime::LoadedKernel loaded = runtime::KernelLoader::global().get(*lookup.kernel);
    kernels.emplace(text, loaded);
    return loaded;
  }

  // A stream seen first (or outgrown) while it is being captured into a CUDA graph, e.g. the
  // capture stream of torch.cuda.graph after a warm-up on another stream: the allocation runs
  // with this thread's capture mode relaxed (cuMemAlloc is no stream operation; the global
  // mode refuses it as potentially unsafe), and the zeroed part is cleared on a stream of its
  // own, outside the capture. The memory outlives the graph: workspaces, and the ones they
  // outgrew (retired), stay until the engine goes.
  void reserve(void* stream, std::size_t scratch, std::size_t zeroed) {
    std::unique_lock lock(workspace_mutex);
    StreamWorkspace& w = workspaces[stream];
    make_current();
    const runtime::CaptureModeRelaxed relaxed(static_cast<CUstream>(stream));
    auto grow = [&](runtime::DeviceBuffer& buffer, std::size_t bytes, bool zero) {
      if (buffer.bytes() >= bytes) return;
      // Grow by half again at least, so that a shape sweep reallocates a few times only.
      const std::size_t size = std::max(bytes, buffer.bytes() + buffer.bytes() / 2);
      runtime::DeviceBuffer fresh(detail::aligned(size));
      if (zero) relaxed.capturing() ? runtime::zero_outside_capture(fresh) : fresh.fill_bytes(0);
      if (buffer.bytes()) retired.push_back(std::move(buffer));
      buffer = std::move(fresh);
    };
    grow(w.scratch, scratch, false);
    grow(w.zeroed, zeroed, true);
  }

  // Grows the stream's workspace to the plan's size when it is smaller (a shared-lock check
  // first: gemm() calls this every time).
  void ensure_workspace(void* stream, const detail::PlanData& plan) {
    ensure_workspace(stream, plan.scratch_bytes, plan.zeroed_bytes);
  }
  void ensure_workspace(void* stream, std::size_t scratch_bytes, std::size_t zeroed_bytes) {
    {
      std::shared_lock lock(workspace_mutex);
      auto found = workspaces.find(stream);
      if (found != workspaces.end() && found->second.scratch.bytes() >= scratch_bytes &&
          found->second.zeroed.bytes() >= zeroed_bytes)
        return;
    }
    reserve(stream, scratch_bytes, zeroed_bytes);
  }

  // The stream's workspace (scratch and zeroed base pointers, and the lock of its stream, held
  // while a call enqueues); Error when it is too small.
  struct StreamSlot {
    void* scratch = nullptr;
    void* zeroed = nullptr;
    std::unique_lock<std::mutex> enqueue;
  };
  StreamSlot stream_workspace(void* stream, std::size_t scratch_bytes, std::size_t zeroed_bytes) {
    std::shared_lock lock(workspace_mutex);
    auto found = workspaces.find(stream);
    const bool fits = found != workspaces.end() &&
                      found->second.scratch.bytes() >= scratch_bytes &&
                      found->second.zeroed.bytes() >= zeroed_bytes;
    if (!fits)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm run: the engine's workspace of this stream holds less than the "
                              "plan's {} bytes (rule: make the plan, or warm_up, with this stream, "
                              "or pass a Workspace)",
                              scratch_bytes + zeroed_bytes));
    return {found->second.scratch.as<void>(), found->second.zeroed.as<void>(),
            std::unique_lock<std::mutex>(found->second.enqueue)};
  }

  runtime::Cublas& cublas() {
    if (!blas) blas = std::make_unique<runtime::Cublas>();
    return *blas;
  }

  const runtime::CublasLt& cublaslt() {
    std::lock_guard lock(lt_mutex);
    make_current();
    if (!lt) lt = std::make_unique<runtime::CublasLt>();
    return *lt;
  }

  // prepare_weight's body, from the canonical arrays on the device (`weight` describes them, its
  // scales and zeros on the host too): the layouts the selector can use, repacked there; the
  // canonical arrays are kept only where a candidate reads them.
  QuantWeight prepare_canonical(const PackedWeight& weight,
                                quant_detail::DeviceQuantizedWeight canonical,
                                const ActivationQuant& activation, double static_activation_scale,
                                std::int64_t max_rows);

  // One expert of a set, repacked on the device in the set's layout, and its global scale.
  struct RepackedExpert {
    layout::MmaDeviceWeight device;
    double global_scale;
  };
  // prepare_experts' body: `count` experts of `first`'s quantization and shape, expert e
  // repacked by `repack_expert(e, order, glu_inter)` (in order, one at a time; glu_inter: the
  // repack's, PreparedWeight::glu_inter), into one set.
  using RepackExpert =
      std::function<RepackedExpert(std::size_t, layout::FragmentOrder, std::int64_t)>;
  QuantWeight prepare_expert_set(const PackedWeight& first, std::size_t count,
                                 const ActivationQuant& activation, ExpertLayout layout,
                                 ExpertRole role, const RepackExpert& repack_expert);
  // Device experts quantized here one at a time and repacked from their device arrays (which go
  // before the next expert's come), each one's packed form downloaded into `packed` when given:
  // quantize_and_prepare_experts and prepare_experts' device form. `function` names errors.
  QuantWeight quantize_expert_set(const std::vector<DeviceMatrix>& experts,
                                  const WeightQuant& quant, const ActivationQuant& activation,
                                  ExpertLayout layout, ExpertRole role, void* stream,
                                  std::vector<PackedWeight>* packed, const char* function);

  // A new prepared weight of this engine with `like`'s quantization, shape and global scale
  // (its layouts still to fill).
  std::shared_ptr<detail::PreparedWeight> new_prepared(const PackedWeight& like) {
    auto prepared = std::make_shared<detail::PreparedWeight>();
    prepared->id = detail::next_weight_id++;
    prepared->engine = this;
    prepared->device = device;
    prepared->quant = like.quant;
    prepared->n = like.n;
    prepared->k = like.k;
    prepared->global_scale = like.global_scale;
    return prepared;
  }

  // The weight's prepared form; Error unless this Engine prepared it (its buffers live on
  // this engine's device, and its plans hold this engine's kernels).
  const detail::PreparedWeight& prepared(const QuantWeight& weight) const {
    if (!weight)
      throw Error(ErrorCode::InvalidArgument, "gemm: weight is empty (prepare_weight first)");
    if (weight.impl_->engine != this)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm: the weight was prepared by another Engine (of GPU {}); this "
                              "one is GPU {}'s (rule: prepare a weight on the Engine that runs it)",
                              weight.impl_->device, device));
    return *weight.impl_;
  }

  // The context the selector judges `problem` in: this GPU, and for a dense problem the measured
  // table that applies to it (the tables hold dense measurements), which `table` keeps alive
  // for the context's life.
  dispatch::SelectionContext selection_context(
      const GemmProblem& problem, std::shared_ptr<const dispatch::TuningTable>& table) const {
    dispatch::SelectionContext context;
    context.gpu = gpu;
    context.rates = rates;
    context.forced = problem.candidate;
    table = dispatch::applicable_tuning_table(info);
    if (problem.experts == 0) context.table = table.get();
    return context;
  }

  detail::PlanStep make_step(const GemmProblem& problem, std::int64_t low, std::int64_t high,
                             const dispatch::Verdict& verdict,
                             const detail::PreparedWeight& weight);
  GemmPlan make_plan(const GemmProblem& problem, const detail::PreparedWeight& weight);
  // Runs a plan in the caller's Workspace or the engine's of the stream (held while enqueuing).
  void run(const detail::PlanData& plan, const detail::PreparedWeight& weight,
           const DeviceMatrix* a, const DeviceActivation* codes, const DeviceMatrix& c,
           void* stream, const float* bias, const Workspace& workspace);
  // Where a run's scratch and split-K regions are.
  struct RunMemory {
    void* scratch = nullptr;
    void* zeroed = nullptr;
  };
  // The run itself; `grouped`: a grouped (MoE) run over the token blocks it describes (the
  // indexed routing's, or rows grouped in place by the caller).
  void run_in(const detail::PlanData& plan, const detail::PreparedWeight& weight,
              const DeviceMatrix* a, const DeviceActivation* codes, const DeviceMatrix& c,
              void* stream, const float* bias, RunMemory memory,
              const runtime::MoeGroupedBlocks* grouped);
  void run_fp8(const detail::PlanData& plan, const detail::PlanStep& step,
               const detail::PreparedWeight& weight, const DeviceMatrix* a,
               const DeviceActivation* codes, const DeviceMatrix& c, void* stream, void* scratch);
  void launch_dequantize(const detail::PreparedWeight& weight, const runtime::LoadedKernel& kernel,
                         const jit::KernelSpec& spec, std::int64_t n0, std::int64_t rows,
                         unsigned short* out, std::int64_t ld, CUstream stream);
  void run_qdq(const detail::PlanStep& step, const detail::PreparedWeight& weight,
               const DeviceMatrix& a, const DeviceMatrix& c, void* stream, const float* bias,
               void* scratch, const float* row_factors);
  // The three kernels of route_moe (compiled and loaded on first use).
  runtime::MoeRoutingKernels moe_routing_kernels();
  // Engine::moe's two plans for `slots` routed rows of `hidden`'s type (made on a count's first
  // call, kept with the gate_up weight): gate_up's picks the routing block, down's is made for
  // it. eight_bit_up: gate_up forced onto an 8-bit wgmma config (its rows quantized by its own
  // step, after the gather).
  struct MoeLayerPlans {
    GemmPlan up, down;
    bool eight_bit_up = false;
  };
  MoeLayerPlans moe_layer_plans(const detail::PreparedWeight& up_w,
                                const detail::PreparedWeight& down_w, const QuantWeight& gate_up,
                                const QuantWeight& down, std::int64_t slots, const Format& hidden,
                                const MoeOptions& options);
  // The kernels of quantize_to_operand: the quantizer, and the tensor absmax where the scaling
  // takes it.
  struct OperandQuantizer {
    runtime::LoadedKernel quantize;
    std::optional<runtime::LoadedKernel> absmax;
  };
  OperandQuantizer operand_quantizer(const ActivationQuant& quant, const Format& rows);
  // `rows` [m, k] (bf16/fp16) quantized as `quant` says into a 16-bit operand of rows' type
  // (code · scale, the row factor folded in, rounded once: what the grouped GEMMs multiply),
  // [m, ld_operand]; `factors` [m] floats and `absmax` (one float, for the scalings that take the
  // tensor's) are its scratch.
  void quantize_to_operand(const ActivationQuant& quant, const DeviceMatrix& rows, void* operand,
                           std::int64_t ld_operand, float* factors, float* absmax,
                           CUstream stream);
  // group_scales: the FP8 codes' 1x128 group scales, [M][ceil(K / 128)] (or null).
  void run_wgmma(const detail::PlanStep& step, const detail::PreparedWeight& weight,
                 const DeviceMatrix& a, const DeviceMatrix& c, CUstream stream, const float* bias,
                 const float* row_factors, const float* group_scales, void* zeroed,
                 const runtime::MoeGroupedBlocks* grouped);
};

}  // namespace qgemm
