// The Engine's mixture-of-experts entries (include/qgemm/engine.hpp, include/qgemm/moe.hpp):
// expert weights with an expert dimension, routing, the grouped GEMM and the whole layer.
//
//   hidden [M, H] ─ route (top-k ids → indexed layout) ─ gather ─► rows [capacity, H]
//     (experts prepared for quantized activations: hidden is first quantized as their scheme
//     says, in M rows, and the codes times their scales rounded once to hidden's type are what
//     is gathered: the grouped GEMMs run on 16-bit rows)
//     ─ grouped GEMM gate_up (+ bias) ─► [capacity, 2I] ─ glu ─► [capacity, I] (hidden's type)
//     ─ grouped GEMM down (+ bias) ─► [capacity, H] fp32
//     ─ combine: out[t] = Σ_j w[t, j] · rows[slot_positions[t, j]] ─► out [M, H]
//
// Both GEMMs read the one routing, so they share its block: the gate_up plan picks its token
// tile, the down plan is made for that block (a config whose tile divides it). Every size that
// depends on the routing stays on the device: a layer captures into a CUDA graph once its
// shape has been planned.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "api/engine_impl.hpp"
#include "common/log.hpp"
#include "dispatch/tuned_config.hpp"
#include "dispatch/wgmma_family.hpp"
#include "jit/catalog.hpp"
#include "jit/prewarm.hpp"
#include "layout/mma_repack_gpu.hpp"
#include "quant/block_quant.hpp"
#include "quant/quantize_on_device.hpp"
#include "qgemm/moe.hpp"
#include "runtime/moe.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm {

using detail::aligned;
using detail::at;

namespace {

// 16-bit rows 16 bytes apart: TMA reads the grouped GEMMs' A rows (it zero-fills past K).
std::int64_t row_stride(std::int64_t columns) { return (columns + 7) / 8 * 8; }

// Whether the environment variable `name` is set to "0" (the switches below: read at each use,
// so that a test can set them).
bool switched_off(const char* name) {
  const char* value = std::getenv(name);
  return value && std::string_view(value) == "0";
}

// QGEMM_GROUPED_IN_PLACE=0 (read at each call) turns the in-place path off: moe_gemm_grouped
// then gathers the rows and puts the results back everywhere. On by default since its GPU run
// (H100, twelfth session, bench/NOTES.md) passed the grouped tests and recipe after the fix of
// what its first run found (the table's workspace was sized for two ints an entry).
bool grouped_in_place_allowed() { return !switched_off("QGEMM_GROUPED_IN_PLACE"); }

// QGEMM_FUSED_GLU=0 (read when a set is prepared) prepares gate_up sets (ExpertRole::GateUp)
// as plain ones: Engine::moe then runs the GLU as a pass of its own (the A/B of the fusion).
bool fused_glu_enabled() { return !switched_off("QGEMM_FUSED_GLU"); }

// Why moe_gemm_grouped cannot read the caller's rows and write its output in place (null: it
// can), the kernels reading and writing them through a table of token blocks (no gather, no
// put-back). It needs rows TMA and 16-byte copies can read, an output that does not overlap
// them, and, for quantized activations, contiguous rows with row-local scales: the quantizer then
// passes over every row, and a masked layout's are mostly unused capacity (whatever the caller
// left there, which a tensor absmax must not see either): those are quantized after a gather.
const char* why_not_in_place(const MoeGroupedRows& groups, const DeviceMatrix& rows_in,
                             const DeviceMatrix& rows_out, const ActivationQuant& quant,
                             dispatch::Path path, int experts, int tile) {
  const std::int64_t rows = rows_in.rows;
  const auto in_first = reinterpret_cast<std::uintptr_t>(rows_in.data);
  const auto out_first = reinterpret_cast<std::uintptr_t>(rows_out.data);
  const bool overlap =
      in_first < out_first + static_cast<std::uintptr_t>(rows * rows_out.stride) *
                                 rows_out.dtype.storage_bytes() &&
      out_first < in_first + static_cast<std::uintptr_t>(rows * rows_in.stride) *
                                 rows_in.dtype.storage_bytes();
  const std::int64_t blocks = runtime::moe_row_blocks_max(rows, experts, tile);
  if (!grouped_in_place_allowed()) return "the in-place path is off (QGEMM_GROUPED_IN_PLACE=0)";
  if (overlap) return "rows_out overlaps rows_in (a block would overwrite rows another reads)";
  if (quant.is_quantized() && runtime::needs_tensor_absmax(quant, 0.0))
    return "its activation scale is the routed rows' absmax";
  if (quant.is_quantized() && groups.grouping == MoeRowGrouping::Masked)
    return "masked rows are quantized once routed (the capacity is mostly unused)";
  if (!quant.is_quantized() && (in_first % 16 != 0 || rows_in.stride % 8 != 0))
    return "rows_in's rows are not 16-byte aligned";
  if (blocks * tile > std::numeric_limits<std::int32_t>::max())
    return "its token blocks would pass 2^31 rows";
  if (path != dispatch::Path::Wgmma && blocks > 65535)
    return "the decode kernel's grid takes at most 65535 token blocks";
  if (path != dispatch::Path::Wgmma && rows < tile)
    return "the decode kernel reads whole token blocks, more rows than rows_in has";
  return nullptr;
}

// A call's workspace carved into consecutive 256-byte aligned regions: take(bytes) is the next
// one's offset, `used` the bytes they need in all.
struct WorkspaceRegions {
  std::size_t used = 0;
  std::size_t take(std::size_t bytes) {
    const std::size_t offset = used;
    used += aligned(std::max<std::size_t>(bytes, 1));
    return offset;
  }
};

// gate_up and down as one layer's experts (Engine::moe, warm_up_moe): from prepare_experts, as
// many of each, the same activation quantization, gate_up [2·I, H] against down [H, I].
void check_moe_pair(const detail::PreparedWeight& up_w, const detail::PreparedWeight& down_w,
                    const char* what) {
  require(up_w.experts > 0 && down_w.experts == up_w.experts,
          "{}: gate_up has {} experts, down {} (rule: both from prepare_experts, equal counts)",
          what, up_w.experts, down_w.experts);
  require(up_w.k == down_w.n,
          "{}: gate_up's K is {}, down's N is {} (rule: equal, the hidden size)", what, up_w.k,
          down_w.n);
  require(up_w.activation == down_w.activation,
          "{}: gate_up was prepared for {} activations, down for {} (rule: the same "
          "activation quantization for both)",
          what, to_string(Scheme{"", up_w.quant, up_w.activation, formats::bf16}),
          to_string(Scheme{"", down_w.quant, down_w.activation, formats::bf16}));
  require(up_w.n == 2 * down_w.k,
          "{}: gate_up's N is {}, down's K is {} (rule: gate_up N = 2 x down K: gate rows, then "
          "up rows)",
          what, up_w.n, down_w.k);
}

}  // namespace

const char* glu_kind_name(GluKind kind) {
  switch (kind) {
    case GluKind::Silu: return "silu";
    case GluKind::Gelu: return "gelu";
    case GluKind::ClampedSwiglu: return "clamped-swiglu";
  }
  return "?";
}

const char* expert_layout_name(ExpertLayout layout) {
  switch (layout) {
    case ExpertLayout::Auto: return "auto";
    case ExpertLayout::Wgmma: return "wgmma";
    case ExpertLayout::Mma: return "mma";
  }
  return "?";
}

const char* expert_role_name(ExpertRole role) {
  return role == ExpertRole::GateUp ? "gate_up" : "plain";
}

QuantWeight Engine::prepare_experts(const std::vector<PackedWeight>& experts,
                                    const ActivationQuant& activation, ExpertLayout layout,
                                    ExpertRole role) {
  impl_->make_current();
  require(!experts.empty() && experts.size() <= 4096,
          "prepare_experts: {} experts (rule: 1 .. 4096)", experts.size());
  const PackedWeight& first = experts.front();
  for (std::size_t e = 0; e < experts.size(); ++e) {
    check_packed_weight(experts[e], "prepare_experts");
    const PackedWeight& w = experts[e];
    require(w.quant == first.quant && w.n == first.n && w.k == first.k,
            "prepare_experts: expert {} is {}x{} ({}) but expert 0 is {}x{} ({}) (rule: one "
            "quantization and shape for every expert)",
            e, w.n, w.k, to_string(Scheme{"", w.quant, {}, formats::bf16}), first.n, first.k,
            to_string(Scheme{"", first.quant, {}, formats::bf16}));
  }
  return impl_->prepare_expert_set(
      first, experts.size(), activation, layout, role,
      [&](std::size_t e, layout::FragmentOrder order, std::int64_t glu_inter) {
        return Impl::RepackedExpert{
            layout::repack_for_mma_on_device(experts[e], impl_->arch, nullptr, order, glu_inter),
            experts[e].global_scale};
      });
}

QuantWeight Engine::Impl::quantize_expert_set(const std::vector<DeviceMatrix>& experts,
                                              const WeightQuant& quant,
                                              const ActivationQuant& activation,
                                              ExpertLayout layout, ExpertRole role, void* stream,
                                              std::vector<PackedWeight>* packed,
                                              const char* function) {
  make_current();
  require(!experts.empty() && experts.size() <= 4096, "{}: {} experts (rule: 1 .. 4096)", function,
          experts.size());
  const DeviceMatrix& first = experts.front();
  for (std::size_t e = 0; e < experts.size(); ++e)
    require(experts[e].rows == first.rows && experts[e].cols == first.cols,
            "{}: expert {} is {}x{} but expert 0 is {}x{} (rule: one shape for every expert)",
            function, e, experts[e].rows, experts[e].cols, first.rows, first.cols);
  quant_detail::validate_weight(quant, first.rows, first.cols);
  PackedWeight shape;
  shape.quant = quant;
  shape.n = first.rows;
  shape.k = first.cols;
  if (packed) packed->reserve(experts.size());
  const quant_detail::HostScales host_scales =
      packed ? quant_detail::HostScales::Copy : quant_detail::HostScales::Leave;
  return prepare_expert_set(
      shape, experts.size(), activation, layout, role,
      [&](std::size_t e, layout::FragmentOrder order, std::int64_t glu_inter) {
        quant_detail::DeviceQuantizedWeight canonical;
        try {
          canonical = quant_detail::quantize_weight_on_device(
              experts[e], quant, arch, static_cast<CUstream>(stream), host_scales);
        } catch (const Error& error) {  // which expert, beside the element it names
          throw Error(error.code(), fmt::format("{}: expert {}: {}", function, e, error.what()));
        }
        if (packed) packed->push_back(quant_detail::downloaded(canonical));
        // The repack reads the device arrays; of the packed form only the metadata.
        const PackedWeight& meta = packed ? packed->back() : canonical.meta;
        const layout::CanonicalOnDevice source{
            canonical.codes.address(), canonical.scales.address(), canonical.zeros.address()};
        return RepackedExpert{
            layout::repack_for_mma_on_device(meta, source, arch, nullptr, order, glu_inter),
            meta.global_scale};
      });
}

Engine::QuantizedExperts Engine::quantize_and_prepare_experts(
    const std::vector<DeviceMatrix>& experts, const WeightQuant& quant,
    const ActivationQuant& activation, ExpertLayout layout, ExpertRole role, void* stream) {
  QuantizedExperts out;
  out.prepared = impl_->quantize_expert_set(experts, quant, activation, layout, role, stream,
                                            &out.packed, "quantize_and_prepare_experts");
  return out;
}

QuantWeight Engine::prepare_experts(const std::vector<DeviceMatrix>& experts,
                                    const WeightQuant& quant, const ActivationQuant& activation,
                                    ExpertLayout layout, ExpertRole role, void* stream) {
  return impl_->quantize_expert_set(experts, quant, activation, layout, role, stream, nullptr,
                                    "prepare_experts");
}

QuantWeight Engine::Impl::prepare_expert_set(const PackedWeight& first, std::size_t count,
                                             const ActivationQuant& activation, ExpertLayout layout,
                                             ExpertRole role, const RepackExpert& repack_expert) {
  require(role == ExpertRole::Plain || first.n % 2 == 0,
          "prepare_experts: role = gate_up with N = {} (rule: an even N, gate rows then up rows)",
          first.n);
  if (activation.is_quantized()) {
    // Engine::moe quantizes the hidden states so, then runs the 16-bit grouped GEMMs on them.
    const Scheme quantized{"", first.quant, activation, formats::bf16};
    validate(quantized);  // names the activation field and rule
    validate_shape(quantized, 1, first.n, first.k);
  }
  Scheme scheme;  // the kernels' view: the weight, with 16-bit activations
  scheme.weight = first.quant;
  dispatch::WeightFacts facts = dispatch::WeightFacts::of_scheme(scheme, first.n, first.k, arch);
  // One layout per expert set (moe.hpp, ExpertLayout): the wgmma order where the SM90 family
  // can take the weight and the caller did not ask for the mma layout, else the mma layout.
  const bool on_sm90 = arch == jit::Arch::sm_90a;
  if (layout == ExpertLayout::Wgmma && !facts.wgmma)
    throw Error(ErrorCode::Unsupported,
                fmt::format("prepare_experts: layout = wgmma, but the SM90 wgmma family cannot "
                            "take this weight on {}: {} (rule: wgmma on sm_90a only; auto or mma "
                            "elsewhere)",
                            jit::arch_name(arch), facts.no_wgmma));
  const bool use_wgmma =
      layout == ExpertLayout::Wgmma || (layout == ExpertLayout::Auto && on_sm90 && facts.wgmma);
  if (!use_wgmma && !facts.mma)
    throw Error(ErrorCode::Unsupported,
                fmt::format("prepare_experts: layout = {}: the mma layout cannot hold this weight "
                            "({}), and {}",
                            expert_layout_name(layout), facts.no_mma,
                            on_sm90 ? "the wgmma order was not asked for"
                                    : "the wgmma family runs on sm_90a only"));
  const layout::FragmentOrder order =
      use_wgmma ? layout::FragmentOrder::Wgmma : layout::FragmentOrder::Mma;
  // A gate_up set for the fused GLU: its rows interleaved by the repack.
  const bool fuse_glu = role == ExpertRole::GateUp && fused_glu_enabled();
  if (role == ExpertRole::GateUp && !fuse_glu)
    log(LogLevel::Info,
        "prepare_experts: role gate_up prepared as plain (QGEMM_FUSED_GLU=0): "
        "Engine::moe runs its GLU as a pass of its own");
  const std::int64_t glu_inter = fuse_glu ? first.n / 2 : 0;

  // Each expert into the layout on the device, then copied there into one buffer per array
  // with the experts back to back (the repacked sizes are equal: one shape and quantization).
  auto prepared = new_prepared(first);
  prepared->experts = static_cast<int>(count);
  prepared->glu_inter = glu_inter;
  prepared->activation = activation.is_quantized() ? activation : ActivationQuant{};
  // The whole weight's words and scale rows are addressed in 32-bit tile (slice) and row counts.
  require(static_cast<double>(count) * static_cast<double>(first.n + 64) < 2147483647.0 / 64,
          "prepare_experts: {} experts of {} rows (rule: fewer than 2^31 / 64 rows of tiles)",
          count, first.n);
  runtime::DeviceBuffer words, scales, zeros;  // sized at expert 0
  std::optional<layout::MmaWeight> meta_of_one;
  // Experts with global scales of their own (NVFP4 checkpoints keep one per expert): the
  // kernels multiply by expert 0's, so each expert's fp32 group scales take the ratio of its
  // own to that one (once, here; zeros are in code units and stay). The products are no longer
  // exact in 16 bits: the packed16 shortcuts that rely on it are turned off.
  bool scales_refolded = false;
  double global_scale = first.global_scale;  // expert 0's, which the kernels multiply by
  for (std::size_t e = 0; e < count; ++e) {
    RepackedExpert expert = repack_expert(e, order, glu_inter);
    layout::MmaDeviceWeight& device = expert.device;
    if (e == 0) global_scale = expert.global_scale;
    // The scale-exactness flags must hold for every expert (packed16 relies on them).
    if (meta_of_one) {
      const bool bf16 = meta_of_one->scales_exact_in_bf16 && device.meta.scales_exact_in_bf16;
      const bool fp16 = meta_of_one->scales_exact_in_fp16 && device.meta.scales_exact_in_fp16;
      meta_of_one = device.meta;
      meta_of_one->scales_exact_in_bf16 = bf16;
      meta_of_one->scales_exact_in_fp16 = fp16;
    } else {
      meta_of_one = device.meta;
    }
    // The grouped kernels address expert e's codes and scale rows as rows of the whole:
    //   wgmma order  tile e · n_tiles + t, a tile = k_blocks / 4 chunks × 128 × bits words
    //   mma layout   slice e · slices + s, a slice = k_blocks × 32 lanes × bits words
    //   both         scale (zero) row e · groups + g of [E · groups][n_padded] floats
    // so an expert's arrays must be exactly whole tiles (slices) and scale rows.
    const layout::MmaWeight& meta = device.meta;
    const std::size_t tile_words = use_wgmma ? static_cast<std::size_t>(meta.k_blocks / 4) * 128 *
                                                   static_cast<std::size_t>(meta.format.bits)
                                             : static_cast<std::size_t>(meta.k_blocks) * 32 *
                                                   static_cast<std::size_t>(meta.format.bits);
    const std::size_t scale_floats = static_cast<std::size_t>(meta.groups) *
                                     static_cast<std::size_t>(meta.n_padded);
    if (device.words.bytes() != static_cast<std::size_t>(meta.n_padded / 64) * tile_words * 4 ||
        device.scales.bytes() != scale_floats * 4 ||
        (device.zeros.bytes() != 0 && device.zeros.bytes() != scale_floats * 4))
      throw Error(ErrorCode::Internal,
                  fmt::format("prepare_experts: the {} of an expert is {} + {} + {} bytes, not "
                              "whole tiles and scale rows (the grouped kernel's addressing)",
                              use_wgmma ? "wgmma order" : "mma layout", device.words.bytes(),
                              device.scales.bytes(), device.zeros.bytes()));
    if (e == 0) {
      words = runtime::DeviceBuffer(count * device.words.bytes());
      scales = runtime::DeviceBuffer(count * device.scales.bytes());
      if (device.zeros.bytes()) zeros = runtime::DeviceBuffer(count * device.zeros.bytes());
    }
    if (expert.global_scale != global_scale) {  // few floats: refolded on the host
      std::vector<float> refolded(scale_floats);
      device.scales.download(refolded.data(), device.scales.bytes());
      const double ratio = expert.global_scale / global_scale;
      for (float& scale : refolded) scale = static_cast<float>(scale * ratio);
      device.scales.upload(refolded.data(), device.scales.bytes());
      scales_refolded = true;
    }
    words.copy_in(device.words, e * device.words.bytes());
    scales.copy_in(device.scales, e * device.scales.bytes());
    if (zeros.bytes()) zeros.copy_in(device.zeros, e * device.zeros.bytes());
  }
  meta_of_one->global_scale = global_scale;  // what the kernels multiply by
  prepared->global_scale = global_scale;
  if (scales_refolded) {
    meta_of_one->scales_exact_in_bf16 = false;
    meta_of_one->scales_exact_in_fp16 = false;
  }
  if (use_wgmma) {
    prepared->wgmma_words = std::move(words);
    prepared->wgmma_scales = std::move(scales);
    prepared->wgmma_zeros = std::move(zeros);
  } else {
    prepared->words = std::move(words);
    prepared->scales = std::move(scales);
    prepared->zeros = std::move(zeros);
  }
  prepared->facts = dispatch::expert_facts(
      std::move(facts), order, meta_of_one,
      use_wgmma ? "expert weights keep the wgmma order only (ExpertLayout::Wgmma)"
                : "expert weights keep the mma layout only (ExpertLayout::Mma)");
  log(LogLevel::Info, "prepare_experts {} x {}x{} {}: {}{}, {} bytes", count, first.n, first.k,
      first.quant.format.name(), use_wgmma ? "wgmma order" : "mma layout",
      fuse_glu ? ", gate and up rows interleaved for the fused GLU" : "", prepared->bytes());
  QuantWeight out;
  out.impl_ = std::move(prepared);
  return out;
}

void Engine::moe_gemm(const GemmPlan& plan, const MoeIndexedRouting& routing,
                      const DeviceMatrix& rows_in, const QuantWeight& experts,
                      const DeviceMatrix& rows_out, void* stream, const float* bias) {
  const GemmProblem& p = plan.problem();
  if (p.experts == 0)
    throw Error(ErrorCode::InvalidArgument,
                "moe_gemm: the plan is a dense GEMM's (rule: plan with problem.experts = the "
                "weight's experts())");
  const detail::PreparedWeight& w = impl_->prepared(experts);
  if (w.activation.is_quantized())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("moe_gemm: the experts were prepared for {} activations (rule: the "
                            "grouped GEMM on routed rows multiplies the 16-bit rows it is given: "
                            "prepare the experts with 16-bit activations, or call "
                            "moe_gemm_grouped or Engine::moe, which quantize their rows as the "
                            "experts' scheme says)",
                            to_string(Scheme{"", w.quant, w.activation, formats::bf16})));
  if ((bias != nullptr) != p.bias)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("moe_gemm: {} (rule: as the plan's problem.bias = {})",
                            bias ? "a bias was given" : "no bias was given", p.bias));
  Impl::StreamSlot slot = impl_->stream_workspace(stream, plan.data_->scratch_bytes,
                                                  plan.data_->zeroed_bytes);
  const runtime::MoeGroupedBlocks blocks = runtime::MoeGroupedBlocks::of(routing);
  impl_->run_in(*plan.data_, w, &rows_in, nullptr, rows_out, stream, bias,
                {slot.scratch, slot.zeroed}, &blocks);
}

void Engine::moe_gemm_grouped(const GemmPlan& plan, const MoeGroupedRows& groups,
                              const DeviceMatrix& rows_in, const QuantWeight& experts,
                              const DeviceMatrix& rows_out, void* stream, const float* bias) {
  const GemmProblem& p = plan.problem();
  require(p.experts > 0,
          "moe_gemm_grouped: the plan is a dense GEMM's (rule: plan with problem.experts = the "
          "weight's experts())");
  const detail::PreparedWeight& w = impl_->prepared(experts);
  require(!p.scheme.activation.is_quantized(),
          "moe_gemm_grouped: the plan's activations are {} (rule: the plan of "
          "gemm_problem(experts, ...): the grouped kernels take 16-bit rows, quantized here as "
          "the experts say)",
          p.scheme.activation.format.name());
  require((bias != nullptr) == p.bias,
          "moe_gemm_grouped: {} (rule: as the plan's problem.bias = {})",
          bias ? "a bias was given" : "no bias was given", p.bias);
  const std::int64_t rows = rows_in.rows;
  require(rows >= 0 && (rows == 0 || rows_in.data) && rows_in.cols == p.k &&
              rows_in.stride >= p.k && rows_in.dtype == p.input,
          "moe_gemm_grouped: rows_in is {}x{} {} at {} with stride {} (rule: non-null, K = {} "
          "columns, stride >= K, {} as the plan's input)",
          rows, rows_in.cols, rows_in.dtype.name(), rows_in.data, rows_in.stride, p.k,
          p.input.name());
  require(rows_out.rows == rows && (rows == 0 || rows_out.data) && rows_out.cols == p.n &&
              rows_out.stride >= p.n && rows_out.dtype == p.scheme.output,
          "moe_gemm_grouped: rows_out is {}x{} {} at {} with stride {} (rule: non-null, {}x{}, "
          "stride >= N, {} as the plan's output)",
          rows_out.rows, rows_out.cols, rows_out.dtype.name(), rows_out.data, rows_out.stride,
          rows, p.n, p.scheme.output.name());
  require(groups.grouping != MoeRowGrouping::Masked || rows == groups.capacity * w.experts,
          "moe_gemm_grouped: masked rows_in has {} rows (rule: experts x capacity = {} x {})",
          rows, w.experts, groups.capacity);
  if (rows == 0) return;
  const int route_block = plan.choice_for(rows).route_block;  // names an M outside the plan
  const ActivationQuant& quant = w.activation;
  const auto cu_stream = static_cast<CUstream>(stream);

  const detail::PlanStep& step = plan.data_->step_for(rows);
  const int tile = step.grouped_tile();
  const char* gather_because =
      why_not_in_place(groups, rows_in, rows_out, quant, step.launch.path, w.experts, tile);
  if (gather_because == nullptr) {
    WorkspaceRegions regions;
    const std::size_t table_bytes = runtime::moe_row_blocks_bytes(rows, w.experts, tile);
    const std::size_t table_at = regions.take(table_bytes);
    const std::int64_t ld_in = row_stride(p.k);
    const std::size_t operand_at =
        quant.is_quantized()
            ? regions.take(static_cast<std::size_t>(rows * ld_in) * rows_in.dtype.storage_bytes())
            : 0;
    const std::size_t factors_at =
        quant.is_quantized() ? regions.take(static_cast<std::size_t>(rows) * sizeof(float)) : 0;
    const std::size_t gemm_scratch_at = regions.take(plan.data_->scratch_bytes);
    impl_->ensure_workspace(stream, regions.used, plan.data_->zeroed_bytes);
    Impl::StreamSlot slot = impl_->stream_workspace(stream, regions.used, plan.data_->zeroed_bytes);
    void* base = slot.scratch;
    impl_->make_current();
    const runtime::MoeGroupedBlocks blocks = runtime::launch_moe_row_blocks(
        impl_->kernel(jit::moe_row_blocks_spec(impl_->arch)), groups, rows, w.experts, tile,
        at<void>(base, table_at), table_bytes,
        groups.zero_rows_of_no_expert ? rows_out.data : nullptr,
        rows_out.stride, p.n, static_cast<int>(rows_out.dtype.storage_bytes()), cu_stream);
    DeviceMatrix operand = rows_in;
    if (quant.is_quantized()) {
      // Every row, routed or not (row-local scales: a row of no expert changes no other row).
      operand = {at<void>(base, operand_at), rows, p.k, ld_in, rows_in.dtype};
      impl_->quantize_to_operand(quant, rows_in, operand.data, ld_in, at<float>(base, factors_at),
                                 nullptr, cu_stream);
    }
    impl_->run_in(*plan.data_, w, &operand, nullptr, rows_out, stream, bias,
                  {at<void>(base, gemm_scratch_at), slot.zeroed}, &blocks);
    return;
  }
  log(LogLevel::Info,
      "moe_gemm_grouped: {} rows gathered by expert and put back, not read in "
      "place: {}",
      rows, gather_because);

  // Each row a top-1 slot: ids from the grouping, expert `experts` (no expert's rows) mapped
  // to -1 as another rank's. Workspace: ids, map, the routing, the gathered rows, (experts
  // prepared for quantized activations) their quantized operand with its scratch, the GEMM's
  // rows, its scratch.
  MoeRoutingShape shape;
  shape.tokens = rows;
  shape.top_k = 1;
  shape.global_experts = w.experts + 1;
  shape.local_experts = w.experts;
  shape.block = route_block;
  const std::int64_t capacity = moe_routing_capacity(shape);
  const std::int64_t ld_in = row_stride(p.k), ld_out = row_stride(p.n);
  WorkspaceRegions regions;
  const std::size_t ids_at = regions.take(static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  const std::size_t map_at =
      regions.take(static_cast<std::size_t>(w.experts + 1) * sizeof(std::int32_t));
  const std::size_t routing_at = regions.take(moe_routing_workspace_bytes(shape));
  const std::size_t gathered_bytes =
      static_cast<std::size_t>(capacity * ld_in) * rows_in.dtype.storage_bytes();
  const std::size_t gathered_at = regions.take(gathered_bytes);
  const std::size_t operand_at = quant.is_quantized() ? regions.take(gathered_bytes) : 0;
  const std::size_t factors_at =
      quant.is_quantized() ? regions.take(static_cast<std::size_t>(capacity) * sizeof(float)) : 0;
  const std::size_t absmax_at = quant.is_quantized() ? regions.take(sizeof(float)) : 0;
  const std::size_t gemm_rows_at =
      regions.take(static_cast<std::size_t>(capacity * ld_out) * rows_out.dtype.storage_bytes());
  const std::size_t gemm_scratch_at = regions.take(plan.data_->scratch_bytes);
  impl_->ensure_workspace(stream, regions.used, plan.data_->zeroed_bytes);
  Impl::StreamSlot slot = impl_->stream_workspace(stream, regions.used, plan.data_->zeroed_bytes);
  void* base = slot.scratch;

  impl_->make_current();
  runtime::launch_moe_group_ids(impl_->kernel(jit::moe_group_ids_spec(impl_->arch)), groups, rows,
                                w.experts, at<std::int32_t>(base, ids_at),
                                at<std::int32_t>(base, map_at), cu_stream);
  const MoeIndexedRouting routing = runtime::launch_moe_routing(
      impl_->moe_routing_kernels(), shape, at<std::int32_t>(base, ids_at),
      at<std::int32_t>(base, map_at), at<void>(base, routing_at),
      moe_routing_workspace_bytes(shape), cu_stream);
  const DeviceMatrix gathered{at<void>(base, gathered_at), capacity, p.k, ld_in, rows_in.dtype};
  // Quantized activations are quantized after the gather, over the routed rows only (a tensor
  // absmax must not see rows of no expert, which a masked layout leaves undefined): the
  // positions past the routed total, which the gather does not write, are zeroed first for the
  // scalings that take the tensor's absmax.
  if (quant.is_quantized() && runtime::needs_tensor_absmax(quant, 0.0)) {
    const runtime::Driver& driver = runtime::Driver::get();
    driver.check(driver.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(gathered.data), 0u,
                                         gathered_bytes / 4, cu_stream),
                 "cuMemsetD32Async (moe_gemm_grouped rows)");
  }
  runtime::launch_moe_gather(impl_->kernel(jit::moe_gather_spec(rows_in.dtype, impl_->arch)),
                             routing, rows_in.data, rows_in.stride, p.k, gathered.data, ld_in,
                             cu_stream);
  DeviceMatrix operand = gathered;
  if (quant.is_quantized()) {
    operand.data = at<void>(base, operand_at);
    impl_->quantize_to_operand(quant, gathered, operand.data, ld_in, at<float>(base, factors_at),
                               at<float>(base, absmax_at), cu_stream);
  }
  const DeviceMatrix gemm_rows{at<void>(base, gemm_rows_at), capacity, p.n, ld_out,
                               rows_out.dtype};
  const runtime::MoeGroupedBlocks blocks = runtime::MoeGroupedBlocks::of(routing);
  impl_->run_in(*plan.data_, w, &operand, nullptr, gemm_rows, stream, bias,
                {at<void>(base, gemm_scratch_at), slot.zeroed}, &blocks);
  // Back into the caller's rows (weights null: each row's one choice times 1, exact).
  runtime::launch_moe_combine(
      impl_->kernel(jit::moe_combine_spec(rows_out.dtype, rows_out.dtype, impl_->arch)), routing,
      gemm_rows.data, ld_out, nullptr, p.n, rows_out.data, rows_out.stride, cu_stream);
  if (groups.invalid_rows != nullptr) {
    const runtime::Driver& driver = runtime::Driver::get();
    driver.check(driver.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(groups.invalid_rows),
                                          reinterpret_cast<CUdeviceptr>(routing.invalid_ids),
                                          sizeof(std::int32_t), cu_stream),
                 "cuMemcpyDtoDAsync (moe_gemm_grouped invalid_rows)");
  }
}

void Engine::moe_gemm_grouped(const MoeGroupedRows& groups, const DeviceMatrix& rows_in,
                              const QuantWeight& experts, const DeviceMatrix& rows_out,
                              void* stream, const float* bias) {
  const detail::PreparedWeight& w = impl_->prepared(experts);
  require(w.experts > 0, "moe_gemm_grouped: a dense weight (rule: experts from prepare_experts)");
  if (rows_in.rows <= 0) {
    require(rows_in.rows == 0 && rows_out.rows == 0,
            "moe_gemm_grouped: rows_in has {} rows, rows_out {} (rule: equal, >= 0)",
            rows_in.rows, rows_out.rows);
    return;  // nothing to plan or compute
  }
  const detail::PreparedWeight::PlanKey key{
      rows_in.rows, rows_in.dtype.name(), rows_out.dtype.name(), "grouped rows", bias != nullptr,
      0, 0, 0, dispatch::tuning_table_generation()};
  const GemmPlan plan = w.plan_for(key, [&] {
    GemmProblem problem = gemm_problem(experts, rows_in.rows, rows_in.dtype, rows_out.dtype);
    problem.bias = bias != nullptr;
    return impl_->make_plan(problem, w);
  });
  moe_gemm_grouped(plan, groups, rows_in, experts, rows_out, stream, bias);
}

void Engine::moe(const DeviceMatrix& hidden, const std::int32_t* topk_ids,
                 const float* topk_weights, int top_k, const QuantWeight& gate_up,
                 const QuantWeight& down, const DeviceMatrix& out, void* stream,
                 const MoeOptions& options) {
  const detail::PreparedWeight& up_w = impl_->prepared(gate_up);
  const detail::PreparedWeight& down_w = impl_->prepared(down);
  check_moe_pair(up_w, down_w, "moe");
  const int experts = up_w.experts;
  const std::int64_t tokens = hidden.rows, h = hidden.cols, inter = down_w.k;
  require(up_w.k == h, "moe: hidden has {} columns (rule: the experts' hidden size, {})", h,
          up_w.k);
  require(tokens >= 0 && (tokens == 0 || hidden.data) && hidden.stride >= h,
          "moe: hidden is {}x{} at {} with stride {} (rule: rows >= 0, non-null, stride >= "
          "columns)",
          tokens, h, hidden.data, hidden.stride);
  require(hidden.dtype == formats::bf16 || hidden.dtype == formats::fp16,
          "moe: hidden is {} (rule: bf16 or fp16)", hidden.dtype.name());
  require((out.data || tokens == 0) && out.rows == tokens && out.cols == h && out.stride >= h,
          "moe: out is {}x{} at {} with stride {} (rule: non-null, {}x{}, stride >= columns)",
          out.rows, out.cols, out.data, out.stride, tokens, h);
  require(out.dtype == formats::bf16 || out.dtype == formats::fp16 || out.dtype == formats::fp32,
          "moe: out is {} (rule: bf16, fp16 or fp32)", out.dtype.name());
  require(top_k >= 1 && top_k <= 32, "moe: top_k = {} (rule: 1 .. 32)", top_k);
  require(topk_ids && topk_weights, "moe: topk_ids = {}, topk_weights = {} (rule: non-null)",
          fmt::ptr(topk_ids), fmt::ptr(topk_weights));
  const int global_experts = options.global_experts > 0 ? options.global_experts : experts;
  require(options.expert_map != nullptr || global_experts == experts,
          "moe: global_experts = {} with {} local experts and no expert_map (rule: a map from "
          "global to local ids when they differ)",
          global_experts, experts);
  const std::int64_t slots = tokens * top_k;
  if (tokens == 0) return;  // an empty batch: nothing to route or compute

  const bool fused_glu = up_w.glu_inter > 0;
  const Impl::MoeLayerPlans plans =
      impl_->moe_layer_plans(up_w, down_w, gate_up, down, slots, hidden.dtype, options);
  const GemmPlan& up_plan = plans.up;
  const GemmPlan& down_plan = plans.down;
  const bool eight_bit_up = plans.eight_bit_up;
  const ActivationQuant& quant = up_w.activation;
  const int route_block = up_plan.choice_for(slots).route_block;

  // Workspace: the routing, the gathered rows, gate_up's rows (none with the fused GLU), the
  // activation's rows and the down rows, then the larger of the GEMMs' scratch; their split-K
  // regions share one.
  MoeRoutingShape shape;
  shape.tokens = tokens;
  shape.top_k = top_k;
  shape.global_experts = global_experts;
  shape.local_experts = experts;
  shape.block = route_block;
  const std::int64_t capacity = moe_routing_capacity(shape);
  const std::size_t half = hidden.dtype.storage_bytes();
  const std::int64_t ld_h = row_stride(h), ld_up = row_stride(2 * inter), ld_act = row_stride(inter);
  WorkspaceRegions regions;
  const std::size_t routing_at = regions.take(moe_routing_workspace_bytes(shape));
  // Hidden states quantized ahead of the gather: their 16-bit operand [M, H], the row factors
  // the quantizer writes (1: folded into the operand) and the tensor absmax some scalings take.
  const bool quantize_first = quant.is_quantized() && !eight_bit_up;
  const std::size_t operand_at =
      quantize_first ? regions.take(static_cast<std::size_t>(tokens * ld_h) * half) : 0;
  const std::size_t factors_at =
      quantize_first ? regions.take(static_cast<std::size_t>(tokens) * sizeof(float)) : 0;
  const std::size_t absmax_at = quantize_first ? regions.take(sizeof(float)) : 0;
  const std::size_t gathered_at = regions.take(static_cast<std::size_t>(capacity * ld_h) * half);
  const std::size_t up_rows_at =
      fused_glu ? 0 : regions.take(static_cast<std::size_t>(capacity * ld_up) * half);
  const std::size_t act_rows_at = regions.take(static_cast<std::size_t>(capacity * ld_act) * half);
  const std::size_t down_rows_at =
      regions.take(static_cast<std::size_t>(capacity * h) * sizeof(float));
  const std::size_t gemm_scratch_at =
      regions.take(std::max(up_plan.data_->scratch_bytes, down_plan.data_->scratch_bytes));
  const std::size_t zeroed_bytes =
      std::max(up_plan.data_->zeroed_bytes, down_plan.data_->zeroed_bytes);
  impl_->ensure_workspace(stream, regions.used, zeroed_bytes);
  Impl::StreamSlot slot = impl_->stream_workspace(stream, regions.used, zeroed_bytes);
  void* base = slot.scratch;

  impl_->make_current();
  const auto cu_stream = static_cast<CUstream>(stream);
  const MoeIndexedRouting routing = runtime::launch_moe_routing(
      impl_->moe_routing_kernels(), shape, topk_ids, options.expert_map, at<void>(base, routing_at),
      moe_routing_workspace_bytes(shape), cu_stream);

  // What the gather reads: hidden, or its quantized values (code · scale, the row's factor
  // folded in, rounded once to hidden's type: the reference's dequantized activations to
  // within that rounding).
  const void* gather_from = hidden.data;
  std::int64_t gather_stride = hidden.stride;
  if (quantize_first) {
    impl_->quantize_to_operand(quant, hidden, at<void>(base, operand_at), ld_h,
                               at<float>(base, factors_at), at<float>(base, absmax_at), cu_stream);
    gather_from = at<void>(base, operand_at);
    gather_stride = ld_h;
  }
  const DeviceMatrix gathered{at<void>(base, gathered_at), capacity, h, ld_h, hidden.dtype};
  runtime::launch_moe_gather(impl_->kernel(jit::moe_gather_spec(hidden.dtype, impl_->arch)),
                             routing, gather_from, gather_stride, h, gathered.data, ld_h,
                             cu_stream);
  const Impl::RunMemory memory{at<void>(base, gemm_scratch_at), slot.zeroed};
  runtime::MoeGroupedBlocks blocks = runtime::MoeGroupedBlocks::of(routing);
  blocks.glu = options.activation;
  const DeviceMatrix act_rows{at<void>(base, act_rows_at), capacity, inter, ld_act,
                              hidden.dtype};
  if (fused_glu) {
    impl_->run_in(*up_plan.data_, up_w, &gathered, nullptr, act_rows, stream, options.gate_up_bias,
                  memory, &blocks);
  } else {
    const DeviceMatrix up_rows{at<void>(base, up_rows_at), capacity, 2 * inter, ld_up,
                               hidden.dtype};
    impl_->run_in(*up_plan.data_, up_w, &gathered, nullptr, up_rows, stream, options.gate_up_bias,
                  memory, &blocks);
    runtime::launch_moe_glu(
        impl_->kernel(jit::moe_glu_spec(hidden.dtype, hidden.dtype, impl_->arch)), routing,
        options.activation, up_rows.data, up_rows.stride, inter, act_rows.data, ld_act, cu_stream);
  }
  const DeviceMatrix down_rows{at<void>(base, down_rows_at), capacity, h, h, formats::fp32};
  impl_->run_in(*down_plan.data_, down_w, &act_rows, nullptr, down_rows, stream, options.down_bias,
                memory, &blocks);
  runtime::launch_moe_combine(
      impl_->kernel(jit::moe_combine_spec(formats::fp32, out.dtype, impl_->arch)), routing,
      down_rows.data, h, topk_weights, h, out.data, out.stride, cu_stream);
}

Engine::Impl::MoeLayerPlans Engine::Impl::moe_layer_plans(const detail::PreparedWeight& up_w,
                                                          const detail::PreparedWeight& down_w,
                                                          const QuantWeight& gate_up,
                                                          const QuantWeight& down,
                                                          std::int64_t slots, const Format& hidden,
                                                          const MoeOptions& options) {
  // Kept with the gate_up weight, keyed by everything they depend on. A gate_up set prepared for
  // the fused GLU (ExpertRole::GateUp): its GEMM writes the activation rows [capacity, I]
  // itself, with the GLU kind in its plan (and so in the key).
  const bool fused_glu = up_w.glu_inter > 0;
  const std::string key_text = fmt::format(
      "moe {} {} {} {} {} '{}' {}", slots, hidden.name(), down_w.id,
      options.gate_up_bias != nullptr, options.down_bias != nullptr, options.gemm_candidate,
      fused_glu ? glu_kind_name(options.activation.kind) : "unfused");
  // The tuning table's generation too: a table loaded later re-plans the layer, as dense calls.
  detail::PreparedWeight::PlanKey key{
      slots, key_text, "", "", false, 0, 0, 0, dispatch::tuning_table_generation()};
  // Both GEMMs take 16-bit rows (gemm_problem of an expert set; quantized hidden states are
  // expanded before the gather) — except a gate_up GEMM forced onto an 8-bit wgmma config (held
  // back from the selector until measured, issue #17): its rows are gathered as they are and
  // quantized after the gather by the GEMM's own step, per token or 1x128 group as the experts'
  // scheme says (a row's scales are its own, so each routed row gets its token's codes), and
  // multiplied as codes on FP8 / INT8 tensor cores; down then runs as the selector chooses.
  const ActivationQuant& quant = up_w.activation;
  // (Unforced, the common call, scans no configs.)
  const dispatch::WgmmaConfig* forced = options.gemm_candidate.empty()
                                            ? nullptr
                                            : dispatch::find_wgmma_config(options.gemm_candidate);
  MoeLayerPlans plans;
  plans.eight_bit_up = quant.is_quantized() && forced && forced->tile.eight_bit;
  plans.up = up_w.plan_for(key, [&] {
    GemmProblem problem = gemm_problem(gate_up, slots, hidden, hidden);
    if (plans.eight_bit_up) problem.scheme.activation = quant;
    problem.bias = options.gate_up_bias != nullptr;
    if (fused_glu) problem.glu = options.activation.kind;
    problem.candidate = options.gemm_candidate;
    return make_plan(problem, up_w);
  });
  // The gate_up plan picks the routing block; the down plan is made for it.
  key.candidate = "down";
  plans.down = up_w.plan_for(key, [&] {
    GemmProblem problem = gemm_problem(down, slots, hidden, formats::fp32);
    problem.bias = options.down_bias != nullptr;
    problem.route_block = plans.up.choice_for(slots).route_block;
    problem.candidate = plans.eight_bit_up ? "" : options.gemm_candidate;
    return make_plan(problem, down_w);
  });
  return plans;
}

void Engine::warm_up_moe(const QuantWeight& gate_up, const QuantWeight& down,
                         const std::vector<std::int64_t>& tokens, int top_k, const Format& hidden,
                         const Format& out, const MoeOptions& options, bool progress) {
  const detail::PreparedWeight& up_w = impl_->prepared(gate_up);
  const detail::PreparedWeight& down_w = impl_->prepared(down);
  check_moe_pair(up_w, down_w, "warm_up_moe");
  require(hidden == formats::bf16 || hidden == formats::fp16,
          "warm_up_moe: hidden is {} (rule: bf16 or fp16)", hidden.name());
  require(out == formats::bf16 || out == formats::fp16 || out == formats::fp32,
          "warm_up_moe: out is {} (rule: bf16, fp16 or fp32)", out.name());
  require(top_k >= 1 && top_k <= 32, "warm_up_moe: top_k = {} (rule: 1 .. 32)", top_k);
  for (const std::int64_t t : tokens)
    require(t >= 1 && t <= std::numeric_limits<std::int32_t>::max() / top_k,
            "warm_up_moe: a token count of {} (rule: 1 .. 2^31 / top_k, as Engine::moe takes)", t);
  // The layer's own kernels, whatever the count: the routing, the gather, the separate GLU
  // pass, the weighted sum into `out`, the hidden states' quantizer.
  impl_->make_current();
  impl_->moe_routing_kernels();
  impl_->kernel(jit::moe_gather_spec(hidden, impl_->arch));
  impl_->kernel(jit::moe_glu_spec(hidden, hidden, impl_->arch));
  impl_->kernel(jit::moe_combine_spec(formats::fp32, out, impl_->arch));
  if (up_w.activation.is_quantized()) impl_->operand_quantizer(up_w.activation, hidden);
  // Each count's two plans (Engine::moe's, kept with the weights) on a pool of threads: the
  // kernel cache compiles a spec once, and a plan that needs one being compiled waits for it.
  std::size_t done = 0;
  std::mutex progress_mutex;
  jit::for_each_on_threads(tokens.size(), 0, [&](std::size_t i) {
    impl_->make_current();  // the thread's, for the kernels it loads
    impl_->moe_layer_plans(up_w, down_w, gate_up, down, tokens[i] * top_k, hidden, options);
    std::lock_guard lock(progress_mutex);
    ++done;
    if (progress) jit::print_progress_bar(done, tokens.size());
  });
}

void Engine::Impl::quantize_to_operand(const ActivationQuant& quant, const DeviceMatrix& rows,
                                       void* operand, std::int64_t ld_operand, float* factors,
                                       float* absmax, CUstream stream) {
  kernels::QuantizeActivationArgs args = runtime::quantize_activation_args(
      quant, rows.rows, rows.cols, reinterpret_cast<CUdeviceptr>(rows.data), rows.stride, 0.0);
  args.operand = static_cast<unsigned short*>(operand);
  args.ldo = ld_operand;
  args.row_factors = factors;
  args.fold_row_factors = 1;
  const OperandQuantizer kernels = operand_quantizer(quant, rows.dtype);
  if (kernels.absmax) runtime::launch_tensor_absmax_for(*kernels.absmax, args, absmax, stream);
  runtime::launch_quantize_activation(kernels.quantize, args, stream);
}

Engine::Impl::OperandQuantizer Engine::Impl::operand_quantizer(const ActivationQuant& quant,
                                                               const Format& rows) {
  OperandQuantizer kernels{
      kernel(jit::quantize_activation_spec(quant, rows, jit::ActivationEmit::Operand, rows, arch)),
      std::nullopt};
  if (runtime::needs_tensor_absmax(quant, 0.0))
    kernels.absmax = kernel(jit::tensor_absmax_spec(rows, arch));
  return kernels;
}

runtime::MoeRoutingKernels Engine::Impl::moe_routing_kernels() {
  runtime::MoeRoutingKernels kernels;
  kernels.count = kernel(jit::moe_routing_spec("count", arch));
  kernels.offsets = kernel(jit::moe_routing_spec("offsets", arch));
  kernels.scatter = kernel(jit::moe_routing_spec("scatter", arch));
  kernels.small = kernel(jit::moe_routing_spec("small", arch));
  return kernels;
}

MoeIndexedRouting Engine::route_moe(const MoeRoutingShape& shape, const std::int32_t* expert_ids,
                                   const std::int32_t* expert_map, void* workspace,
                                   std::size_t workspace_bytes, void* stream) {
  runtime::check_moe_routing_shape(shape);  // before compiling its kernels
  impl_->make_current();
  return runtime::launch_moe_routing(impl_->moe_routing_kernels(), shape, expert_ids, expert_map, workspace,
                                     workspace_bytes, static_cast<CUstream>(stream));
}

}  // namespace qgemm
