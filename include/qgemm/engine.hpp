// qgemm::Engine: one per GPU. Prepares quantized weights into the kernel layouts on that device,
// plans GEMMs (include/qgemm/plan.hpp) and runs them on the caller's stream.
//
//   qgemm::Engine engine(0);
//   qgemm::QuantWeight w = engine.prepare_weight(qgemm::quantize_weight(scheme.weight, ...),
//                                                scheme.activation);
//   // Plan once (compiles, sizes the stream's workspace), run many times: no allocation,
//   // synchronization or string building, so runs can be captured into a CUDA graph.
//   qgemm::GemmPlan plan = engine.plan(qgemm::gemm_problem(w, M, formats::bf16, scheme.output),
//                                      w, stream);
//   engine.run(plan, {a, M, K, K, formats::bf16}, w, {c, M, N, N, scheme.output}, stream);
//   // Or the convenience entry, which plans on a shape's first call and caches the plan:
//   engine.gemm({a, M, K, K, formats::bf16}, w, {c, M, N, N, scheme.output}, stream);
//
// Quantized activations (the A8/A4 schemes): prepare the weight with the scheme's activation
// part and pass bf16/fp16 A (quantized on the GPU, as the scheme says), or pass activations
// quantized earlier (a fused norm + quantize kernel) as a DeviceActivation.
//
// Calls issue work on `stream` (a CUstream / cudaStream_t, null = the legacy default stream) and
// return without synchronizing. One Engine may be used from many threads and streams at once:
// every stream has its own workspace.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qgemm/moe.hpp"
#include "qgemm/plan.hpp"
#include "qgemm/quant.hpp"

namespace qgemm {

// A row-major matrix in device memory: element (r, c) at data + (r · stride + c) · bytes.
struct DeviceMatrix {
  void* data = nullptr;
  std::int64_t rows = 0, cols = 0, stride = 0;
  Format dtype = formats::bf16;
};

// Quantized activations on the device in the canonical packed form (include/qgemm/quant.hpp):
// codes row-major [rows, cols], rows ceil(cols · bits / 8) bytes apart; scales the activation
// scale grid's codes in quant.scale_format (StaticTensor: one scale).
struct DeviceActivation {
  ActivationQuant quant;
  const void* codes = nullptr;
  const void* scales = nullptr;
  std::int64_t rows = 0, cols = 0;
  double tensor_scale = 1.0;  // NV: the fp32 tensor scale; else 1
};

// Options of the convenience entry gemm().
struct GemmOptions {
  const float* bias = nullptr;  // device fp32 [N], or null
  // A candidate by name ("decode", "medium", "qdq", "cublaslt-fp8", ...: `qgemm explain` lists
  // them), for benches and the tuner; empty: the selector chooses.
  std::string candidate;
};

namespace detail {
struct PreparedWeight;
}

class QuantWeight {
 public:
  QuantWeight() = default;
  std::int64_t n() const;
  std::int64_t k() const;
  const WeightQuant& quant() const;
  // How gemm() quantizes a bf16/fp16 A for this weight (not quantized: A is used as given).
  const ActivationQuant& activation() const;
  std::size_t device_bytes() const;  // the prepared weight's device memory
  // Expert weights (Engine::prepare_experts): how many; n() and k() are one expert's. 0: dense.
  int experts() const;
  // An expert set's role as prepared: GateUp when its rows are interleaved for Engine::moe's
  // fused GLU (not when QGEMM_FUSED_GLU=0 prepared it as Plain).
  ExpertRole role() const;
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<const detail::PreparedWeight> impl_;
  friend class Engine;
};

// The problem of a call with M rows of `input` (bf16/fp16, quantized by the call as the weight's
// activation() says) against `weight`, writing `output`. An expert set (experts() > 0): the
// problem of its grouped kernels, which multiply 16-bit rows of `input` (the activation
// quantization is applied before them, by Engine::moe and moe_gemm_grouped).
GemmProblem gemm_problem(const QuantWeight& weight, std::int64_t m, const Format& input,
                         const Format& output);

// The process's kernel cache (every Engine's): kernels compiled by NVRTC and read from the disk
// cache so far. A deployment checks with it that serving compiles nothing after its warm-up.
struct KernelCacheCounts {
  std::uint64_t compiles = 0, disk_hits = 0;
};
KernelCacheCounts kernel_cache_counts();

// The problem of a call with activations quantized beforehand (`a`, its codes) writing `c`: what
// Engine::gemm of a DeviceActivation plans (C's stride and alignment from `c`; no bias, no
// candidate).
GemmProblem gemm_problem(const QuantWeight& weight, const DeviceActivation& a,
                         const DeviceMatrix& c);

// prepare_weight's default max_rows: layouts for every M a call may bring.
inline constexpr std::int64_t kPrepareMaxRows = 65536;

class Engine {
 public:
  explicit Engine(int device = 0);  // Error(NoDevice) when there is no such GPU
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int device() const;
  int sm_count() const;

  // Repacks a canonical packed weight into the kernel layout and uploads it. `activation` says
  // how gemm() quantizes bf16/fp16 activations for it (the scheme's activation part; default:
  // not at all). StaticTensor takes `static_activation_scale` (the calibrated scale; <= 0: each
  // call's tensor absmax, as quantize_activation does). `max_rows`: the most rows a call will
  // have; the weight keeps the layouts the selector picks for M up to it. On SM90 the decode
  // kernel and dequantize + cuBLAS read the wgmma order too, so a range that reaches the wgmma
  // family holds the weight once (a second layout only where a tiled mma.sync kernel or
  // cuBLASLt's codes win some M). A later call with more rows is still served, by the
  // candidates the kept layouts allow.
  QuantWeight prepare_weight(const PackedWeight& weight, const ActivationQuant& activation = {},
                             double static_activation_scale = 0.0,
                             std::int64_t max_rows = kPrepareMaxRows);

  // The same from a weight in device memory: `weight` [n, k] (bf16, fp16 or fp32, rows `stride`
  // elements apart) quantized on this GPU by round to nearest as `quant` says (code for code what
  // quantize_weight computes from the same values), then prepared there; nothing crosses to the
  // host but the scales. On `stream`; returns when done. Error(InvalidArgument) names a bad
  // matrix, scheme or non-finite element.
  QuantWeight prepare_weight(const DeviceMatrix& weight, const WeightQuant& quant,
                             const ActivationQuant& activation = {},
                             double static_activation_scale = 0.0,
                             std::int64_t max_rows = kPrepareMaxRows, void* stream = nullptr);
  // The GPU quantization alone, downloaded into the canonical packed form (to save a checkpoint).
  PackedWeight quantize_weight(const DeviceMatrix& weight, const WeightQuant& quant,
                               void* stream = nullptr);
  // Both from one quantization: the canonical packed form downloaded (quantize_weight's) and
  // the weight prepared from the same device arrays (prepare_weight's). What a module that keeps
  // a host copy (a state_dict, a CPU path) needs, without quantizing twice or uploading back.
  struct QuantizedOnDevice {
    PackedWeight packed;
    QuantWeight prepared;
  };
  QuantizedOnDevice quantize_and_prepare_weight(const DeviceMatrix& weight,
                                                const WeightQuant& quant,
                                                const ActivationQuant& activation = {},
                                                double static_activation_scale = 0.0,
                                                std::int64_t max_rows = kPrepareMaxRows,
                                                void* stream = nullptr);

  // The plan for `problem` against `weight`: the selector's choice per M bucket, every kernel
  // compiled and loaded, and the workspace of `stream` sized for it. Error(Unsupported) when
  // nothing serves, naming every candidate's reason; Error(InvalidArgument) for a problem that
  // does not describe `weight`.
  GemmPlan plan(const GemmProblem& problem, const QuantWeight& weight, void* stream = nullptr);

  // Runs a plan: C = A · Wᵀ (+ bias). A, C and the bias must match the plan's problem (M within
  // its range, the types, A's alignment); `workspace` empty: the engine's workspace of `stream`,
  // sized by plan() or warm_up() for that stream (Error(InvalidArgument) when it is not).
  void run(const GemmPlan& plan, const DeviceMatrix& a, const QuantWeight& weight,
           const DeviceMatrix& c, void* stream, const float* bias = nullptr,
           const Workspace& workspace = {});
  void run(const GemmPlan& plan, const DeviceActivation& a, const QuantWeight& weight,
           const DeviceMatrix& c, void* stream, const float* bias = nullptr,
           const Workspace& workspace = {});

  // C = A · Wᵀ (+ bias) in the activation type of A (bf16 or fp16) and the output type of C
  // (fp16, bf16, fp32); A with 0 rows is a no-op (C must have 0 too). Plans on a shape's first
  // call (and on a stream's first call, sizes its
  // workspace), then runs the cached plan.
  void gemm(const DeviceMatrix& a, const QuantWeight& weight, const DeviceMatrix& c, void* stream,
            const GemmOptions& options = {});
  // The same with activations quantized beforehand (any quantized ActivationQuant; the weight's
  // own activation() is not consulted).
  void gemm(const DeviceActivation& a, const QuantWeight& weight, const DeviceMatrix& c,
            void* stream, const GemmOptions& options = {});

  // The weight dequantized into `out` (N x K, bf16 or fp16; its row stride a multiple of 8
  // elements, or K for a weight kept canonical), by the kernel dequantize + cuBLAS uses.
  // Error(Unsupported) for a weight with a global scale held in a prepared layout (NVFP4: the
  // GEMM applies it).
  void dequantize(const QuantWeight& weight, const DeviceMatrix& out, void* stream);

  // For deployments: compiles every kernel `problem` can select over its M range (each M
  // bucket's, which the returned plan runs, and each M's own, which gemm() runs: it plans every
  // M by itself), on a pool of threads with a progress bar on stderr when `progress`, and sizes
  // the workspace of `stream`. Returns the plan.
  GemmPlan warm_up(const GemmProblem& problem, const QuantWeight& weight, void* stream = nullptr,
                   bool progress = false);

  // MoE routing preparation (qgemm/moe.hpp): `expert_ids` device int32 [tokens · top_k];
  // `expert_map` device int32 [global_experts] (local id or −1), or null for the identity;
  // `workspace` at least moe_routing_workspace_bytes(shape) of device memory, 256-byte aligned.
  // Enqueues a memset and three kernels on `stream` (no synchronization, graph-capturable).
  // Error(InvalidArgument) naming the field and the rule for a bad shape or pointer.
  MoeIndexedRouting route_moe(const MoeRoutingShape& shape, const std::int32_t* expert_ids,
                              const std::int32_t* expert_map, void* workspace,
                              std::size_t workspace_bytes, void* stream);

  // Expert weights: E packed weights of one quantization and shape [N, K] (a layer's gate_up
  // experts, or its down experts; global scales may differ, as NVFP4 checkpoints' do: each
  // expert's is folded into its fp32 group scales), prepared as one QuantWeight with an expert
  // dimension (experts() = E; n() and k() are one expert's). `activation`: the scheme's
  // activation quantization, which Engine::moe applies to the hidden states (16-bit: none).
  // The experts keep ONE layout (their bytes once, never two copies), chosen by `layout`
  // (ExpertLayout, qgemm/moe.hpp): by default the wgmma order on SM90 and the mma layout on
  // SM80-SM89. `role` (ExpertRole): GateUp prepares a gate_up set for Engine::moe's fused GLU.
  QuantWeight prepare_experts(const std::vector<PackedWeight>& experts,
                              const ActivationQuant& activation = {},
                              ExpertLayout layout = ExpertLayout::Auto,
                              ExpertRole role = ExpertRole::Plain);
  // The same from expert weights in device memory (each [N, K], bf16, fp16 or fp32, one
  // shape), quantized on this GPU as quantize_and_prepare_weight does: their canonical packed
  // forms downloaded (one per expert), and the set prepared from the same device arrays.
  struct QuantizedExperts {
    std::vector<PackedWeight> packed;
    QuantWeight prepared;
  };
  QuantizedExperts quantize_and_prepare_experts(const std::vector<DeviceMatrix>& experts,
                                                const WeightQuant& quant,
                                                const ActivationQuant& activation = {},
                                                ExpertLayout layout = ExpertLayout::Auto,
                                                ExpertRole role = ExpertRole::Plain,
                                                void* stream = nullptr);
  // The same set prepared with nothing downloaded (prepare_weight's device form for experts):
  // for engines that keep no host copy of the weights.
  QuantWeight prepare_experts(const std::vector<DeviceMatrix>& experts, const WeightQuant& quant,
                              const ActivationQuant& activation = {},
                              ExpertLayout layout = ExpertLayout::Auto,
                              ExpertRole role = ExpertRole::Plain, void* stream = nullptr);

  // The grouped GEMM alone, for engines that route themselves:
  //   rows_out[p] = rows_in[p] · W_eᵀ (+ bias[e]),  e = routing.block_experts[p / block]
  // for every position p below the routed total (the device's offsets[local_experts]); rows
  // past it are not written. rows_in [>= capacity, K] (bf16/fp16) holds the routed rows in
  // expert order (moe.hpp: what a gather of sorted_slots gives), rows_out [>= capacity, N].
  // Experts prepared for quantized activations are refused (rows past the routed total are the
  // caller's, so a tensor scale could not be taken here: moe_gemm_grouped and Engine::moe
  // quantize their rows).
  // `routing` comes from route_moe, or from the caller's own arrays, with block =
  // plan.choice_for(slots).route_block (or the problem's route_block). `bias`: device fp32
  // [experts, N] or null. Graph-capturable: every size that depends on the routing is read on
  // the device.
  void moe_gemm(const GemmPlan& plan, const MoeIndexedRouting& routing, const DeviceMatrix& rows_in,
                const QuantWeight& experts, const DeviceMatrix& rows_out, void* stream,
                const float* bias = nullptr);

  // The grouped GEMM over rows the caller already grouped by expert (MoeGroupedRows,
  // qgemm/moe.hpp: contiguous with offsets, or masked with a capacity and counts):
  //   rows_out[r] = rows_in[r] · W_eᵀ (+ bias[e]) for each row r of expert e, zero for a row of no
  // expert. rows_in [R, K] (bf16/fp16, the plan's activation type), rows_out [R, N] (the plan's
  // output type), R = the rows of the grouping (masked: experts x capacity); the plan's M range
  // must hold R, and it chooses its config by R. The rows are routed, gathered into expert
  // runs padded to the GEMM's token tile, multiplied by moe_gemm's kernels and put back, all on
  // `stream` from the Engine's workspace for it (sized on a shape's first call: capture later
  // calls). Experts prepared for quantized activations (w4a8-fp8, fp8-block, nvfp4, ...): the
  // routed rows are quantized as their scheme says (per token, group or block on each row; a
  // tensor scale from the routed rows only), and code · scale, rounded once to rows_in's type,
  // is what the 16-bit grouped kernels multiply (as Engine::moe).
  void moe_gemm_grouped(const GemmPlan& plan, const MoeGroupedRows& groups,
                        const DeviceMatrix& rows_in, const QuantWeight& experts,
                        const DeviceMatrix& rows_out, void* stream, const float* bias = nullptr);
  // The same, planned on a shape's first call (rows, types, bias; kept with the experts, as
  // Engine::moe keeps its plans): capture later calls of the shape.
  void moe_gemm_grouped(const MoeGroupedRows& groups, const DeviceMatrix& rows_in,
                        const QuantWeight& experts, const DeviceMatrix& rows_out, void* stream,
                        const float* bias = nullptr);

  // A whole routed expert layer (hidden [M, H] bf16/fp16; top-k choices per token):
  //   out[t] = Σ_j weights[t·top_k + j] · down_e(glu(gate_up_e(hidden[t]))),  e = ids[t·top_k + j]
  // gate_up: experts [2·I, H] (gate rows, then up rows); down: experts [H, I]. The activation
  // between them is rounded to hidden's type (the down GEMM's A), the down rows stay fp32 and
  // the top-k sum rounds once into out [M, H] (bf16, fp16 or fp32). Experts prepared for
  // quantized activations (w4a8-fp8, fp8-block, mxfp8-mxfp4, nvfp4, ...): hidden is quantized
  // as their scheme says (the host quantizer's codes and scales), and code · scale rounded once
  // to hidden's type is what both GEMMs' 16-bit tensor cores take; the intermediate stays in
  // hidden's type (reference::moe_layer's definition). `topk_ids` device int32
  // [M · top_k], `topk_weights` device fp32 [M · top_k]. Plans on the first call of a shape (and
  // sizes the stream's workspace: capture later calls), then routes, gathers, runs both grouped
  // GEMMs, the activation and the weighted sum on `stream` with no synchronization.
  void moe(const DeviceMatrix& hidden, const std::int32_t* topk_ids, const float* topk_weights,
           int top_k, const QuantWeight& gate_up, const QuantWeight& down, const DeviceMatrix& out,
           void* stream, const MoeOptions& options = {});

  // For deployments (warm_up's for a layer): makes moe()'s plans for each token count in
  // `tokens` at `top_k`, their kernels compiled on a pool of threads (a progress bar on stderr
  // when `progress`), and loads the layer's other kernels for `hidden` (bf16/fp16) in and `out`
  // (bf16, fp16, fp32) out, so that a later call of such a count, or a CUDA-graph capture of
  // it, compiles nothing. `options` as the calls will pass them: what the plans depend on is
  // the activation (for a gate_up set with the fused GLU), whether each bias is given and the
  // candidate; the pointers are not read. Another count plans on its first call, from kernels
  // compiled here where it selects the same ones.
  void warm_up_moe(const QuantWeight& gate_up, const QuantWeight& down,
                   const std::vector<std::int64_t>& tokens, int top_k, const Format& hidden,
                   const Format& out, const MoeOptions& options = {}, bool progress = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qgemm
