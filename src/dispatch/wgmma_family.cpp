#include "dispatch/wgmma_family.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "dispatch/cost_model.hpp"
#include "dequant/wgmma_codes8.cuh"
#include "jit/catalog.hpp"
#include "jit/kernel_spec.hpp"
#include "qgemm/error.hpp"
#include "qgemm/moe.hpp"

namespace qgemm::dispatch {
namespace {

kernels::WgmmaShape shape_of(const kernels::WgmmaTile& tile, const layout::MmaWeight& w) {
  return kernels::wgmma_shape(tile, w.format.bits, w.group_size, w.stores_zeros());
}

// The tensor cores an eight-bit tile's activation codes run on, as messages name them.
const char* tensor_cores_of(const Format& codes) {
  return codes == formats::int8 ? "INT8" : "FP8";
}

}  // namespace

bool wgmma_ranked_by_default() {
  const char* value = std::getenv("QGEMM_WGMMA");
  return !(value && std::string_view(value) == "0");
}

bool wgmma_fp8_ranked() {
  const char* value = std::getenv("QGEMM_WGMMA_FP8");
  return value && std::string_view(value) == "1";
}

bool wgmma_order_readers_ranked() {
  const char* value = std::getenv("QGEMM_WGMMA_ORDER_READERS");
  return !(value && std::string_view(value) == "0");
}

bool every_layout_on_every_weight() {
  const char* value = std::getenv("QGEMM_WGMMA");
  return value && std::string_view(value) == "1";
}

// The designs that measured no better (bench/NOTES.md, SM90 wgmma, second session; H100).
constexpr const char* kFourConsumersHeldBack =
    "four consumers measured no faster than two at decode (H100: 21.2 / 74.3 us against "
    "22.0 / 73.4 on 8192x8192 / 28672x8192 at M = 1)";
constexpr const char* kTransformHeldBack =
    "the transform warps measured 1.25-1.85x slower than dequantizing in the consumers (H100, "
    "M 64-4096: the three warps cannot keep up with the tensor cores)";

// Issue #16's 8-bit tiles (FP8 and INT8): correct on the H100
// (WgmmaGemmGpu.EightBitConfigsMatchReference). The 128-token ones are ranked: the cost model
// fits their times (GpuRates::wgmma_fp8_tflops), and they win at M = 256 on 8192² (w8a8-int8
// 65.8 µs against 80.8, int4 × int8 75.0 against 82.5, w4a8-fp8 75.5 against 83.8: bench/NOTES.md,
// twelfth session) and lose to qdq at 4096, as predicted. The narrower ones stay held back: they
// measured slower than the model predicts for them.
constexpr const char* kEightBitHeldBack =
    "the 8-bit tiles below 128 tokens measured slower than predicted (H100: wgmma-fp8-16 39.1 "
    "µs against the decode kernel's 31.8 at w4a8-fp8 8192² M = 16, predicted 22.6; the 64-token "
    "tiles 3-20 % over their predictions; issue #16)";

const std::vector<WgmmaConfig>& wgmma_configs() {
  // {consumers, tokens, stage_chunks, most stages}; the ring takes as many stages as fit the
  // block's shared memory, up to the most (tile_for). Small token widths stream the weight:
  // bytes in flight per SM must cover the loaded DRAM latency (~100 KB on the H200, NOTES,
  // fifth session), and the copy engine takes ~12 bulk copies per µs and SM, so their stages
  // are large (128 or 256 K: 4 or 8 KB of 4-bit codes per weight tile and copy). Wide ones are
  // tensor-bound: 64-K stages, as many as fit.
  static const std::vector<WgmmaConfig> configs = {
      {"wgmma-8", {2, 8, 2, 10}},          {"wgmma-16", {2, 16, 2, 10}},
      {"wgmma-32", {2, 32, 2, 8}},         {"wgmma-64", {2, 64, 2, 6}},
      {"wgmma-128", {2, 128, 1, 7}},       {"wgmma-256", {2, 256, 1, 5}},
      {"wgmma-8-k256", {2, 8, 4, 16}},     {"wgmma-16-k256", {2, 16, 4, 16}},
      // Decode with four consumer warpgroups (256 weight rows a block): twice the warps to
      // hide the consumers' load → dequantize → wgmma chain, which bounds decode at two
      // (bench/NOTES.md, SM90 wgmma, first run). Four consumers get 104 registers a thread: 16
      // tokens with stored zero points would spill.
      {"wgmma-8-c4", {4, 8, 2, 10}, kFourConsumersHeldBack},
      // Transform warps dequantize into shared memory and the consumers' wgmma read both
      // operands there: the dequantization leaves the wgmma warps, which measured to add its
      // time to the tensor work instead of overlapping it (NOTES, SM90 wgmma, first run).
      {"wgmma-64-tx", {2, 64, 2, 6, true}, kTransformHeldBack},
      {"wgmma-128-tx", {2, 128, 1, 7, true}, kTransformHeldBack},
      {"wgmma-256-tx", {2, 256, 1, 5, true}, kTransformHeldBack},
      // FP8 tensor cores (issue #16): e4m3 activation codes against the weight turned into
      // e4m3 in registers, m64nNk32; stages of whole 128-K activation boxes; at most 128 tokens
      // (a group accumulator beside the result).
      {"wgmma-fp8-8", {2, 8, 2, 10, false, true}, kEightBitHeldBack},
      {"wgmma-fp8-16", {2, 16, 2, 10, false, true}, kEightBitHeldBack},
      {"wgmma-fp8-32", {2, 32, 2, 8, false, true}, kEightBitHeldBack},
      {"wgmma-fp8-64", {2, 64, 2, 6, false, true}, kEightBitHeldBack},
      {"wgmma-fp8-128", {2, 128, 2, 6, false, true}},
      {"wgmma-fp8-8-k256", {2, 8, 4, 16, false, true}, kEightBitHeldBack},
      {"wgmma-fp8-16-k256", {2, 16, 4, 16, false, true}, kEightBitHeldBack},
      // INT8 tensor cores (issue #16): the same tiles on int8 activation codes against the
      // weight as s8 codes in registers (exact s32 sums, promoted per group).
      {"wgmma-int8-8", {2, 8, 2, 10, false, true}, kEightBitHeldBack, true},
      {"wgmma-int8-16", {2, 16, 2, 10, false, true}, kEightBitHeldBack, true},
      {"wgmma-int8-32", {2, 32, 2, 8, false, true}, kEightBitHeldBack, true},
      {"wgmma-int8-64", {2, 64, 2, 6, false, true}, kEightBitHeldBack, true},
      {"wgmma-int8-128", {2, 128, 2, 6, false, true}, "", true},
      {"wgmma-int8-8-k256", {2, 8, 4, 16, false, true}, kEightBitHeldBack, true},
      {"wgmma-int8-16-k256", {2, 16, 4, 16, false, true}, kEightBitHeldBack, true},
  };
  return configs;
}

const WgmmaConfig* find_wgmma_config(std::string_view name) {
  for (const WgmmaConfig& config : wgmma_configs())
    if (config.name == name) return &config;
  return nullptr;
}

int WgmmaConfig::threads() const { return 128 * (1 + tile.consumers); }

const Format& WgmmaConfig::codes() const { return int8 ? formats::int8 : formats::e4m3; }

kernels::WgmmaTile WgmmaConfig::tile_for(const layout::MmaWeight& weight,
                                         const GpuLimits& gpu) const {
  kernels::WgmmaTile fitted = tile;
  while (fitted.stages > 2 && shape_of(fitted, weight).shared_bytes > gpu.shared_per_block)
    --fitted.stages;
  return fitted;
}

int WgmmaConfig::shared_bytes(const layout::MmaWeight& weight, const GpuLimits& gpu) const {
  return shape_of(tile_for(weight, gpu), weight).shared_bytes;
}

std::optional<std::string> WgmmaConfig::unsupported_reason(std::int64_t m,
                                                           const layout::MmaWeight& weight,
                                                           const Format& operand,
                                                           const GpuLimits& gpu) const {
  if (gpu.arch != jit::Arch::sm_90a)
    return fmt::format("wgmma runs on sm_90a only (this is {})", jit::arch_name(gpu.arch));
  if (weight.order != layout::FragmentOrder::Wgmma)
    return std::string("the weight is not in the wgmma order");
  if (tile.eight_bit) {
    if (operand != codes())
      return fmt::format("the {} wgmma configs take {} activation codes ({} given)",
                         tensor_cores_of(codes()), codes().name(), operand.name());
    if (auto why = wgmma_codes8_weight_unsupported(weight, codes())) return why;
  } else if (operand != formats::bf16 && operand != formats::fp16) {
    return fmt::format("the wgmma configs take bf16/fp16 operands ({} given)", operand.name());
  }
  if (const char* why = kernels::wgmma_tile_error(tile, weight.group_size))
    return fmt::format("group {}: {}", weight.group_size, why);
  if (shared_bytes(weight, gpu) > gpu.shared_per_block)
    return fmt::format("needs {} bytes of shared memory at two stages (the block limit is {})",
                       shared_bytes(weight, gpu), gpu.shared_per_block);
  // A token block at most twice the rows it serves (M = 1 takes wgmma-8, ...).
  if (tile.tokens > 8 && m <= tile.tokens / 2)
    return fmt::format("M = {} fills less than half of its {}-token blocks", m, tile.tokens);
  return std::nullopt;
}

std::optional<std::string> wgmma_codes8_weight_unsupported(const layout::MmaWeight& weight,
                                                           const Format& codes) {
  const Format& f = weight.format;
  const bool s8 = codes == formats::int8;
  const bool constant_zero = weight.zero_mode == layout::MmaZeroMode::Constant;
  if (!s8 && f == formats::e4m3) {
    if (weight.zero_mode != layout::MmaZeroMode::None)
      return std::string("e4m3 weights with a zero point");
    return std::nullopt;
  }
  if (s8 && f.is_float())
    return fmt::format("the INT8 wgmma takes integer weights ({} given)", f.name());
  if (!(f.bits == 2 || f.bits == 4 || (s8 && f.bits == 8)))
    return fmt::format("the {} wgmma takes {} weights ({} is {} bits)", tensor_cores_of(codes),
                       s8 ? "2-, 4- or 8-bit integer" : "e4m3, 2- or 4-bit", f.name(), f.bits);
  if (weight.zero_mode != layout::MmaZeroMode::None && !constant_zero)
    return fmt::format("stored zero points ({}) make u − zero a per-group value, not one {} "
                       "table",
                       layout::mma_zero_mode_name(weight.zero_mode), codes.name());
  if (!kernels::wgmma_codes8_exact(jit::packed_format_code(f), constant_zero,
                                   s8 ? kernels::kCodes8S8 : kernels::kCodes8E4m3))
    return fmt::format("a value of {} is not exact in {}", f.name(), s8 ? "s8" : "e4m3");
  return std::nullopt;
}

std::string wgmma_dequant(const layout::MmaWeight& weight, const Format& operand) {
  if (operand == formats::e4m3) return "e4m3";
  if (operand == formats::int8) return "s8";
  if (layout::packed16_dequant_applies(weight, operand)) return "packed16";
  const bool exact =
      operand == formats::bf16 ? weight.scales_exact_in_bf16 : weight.scales_exact_in_fp16;
  if (weight.format.is_float() && exact &&
      layout::unscaled_dequant(weight, operand) == std::optional<std::string>("float16"))
    return "float16";
  return "fp32";
}

int wgmma_dequant_mode(const layout::MmaWeight& weight, const Format& operand) {
  const std::string mode = wgmma_dequant(weight, operand);
  return mode == "packed16" ? kernels::kWgmmaPacked16
         : mode == "float16" ? kernels::kWgmmaFloat16
         : mode == "e4m3"    ? kernels::kWgmmaE4m3
         : mode == "s8"      ? kernels::kWgmmaS8
                             : kernels::kWgmmaFp32;
}

bool wgmma_promotes_scales(const WgmmaConfig& config, const layout::MmaWeight& weight,
                           const Format& operand) {
  return kernels::wgmma_promotes_scales(config.tile, weight.group_size,
                                        wgmma_dequant_mode(weight, operand));
}

WgmmaLaunch wgmma_launch(const WgmmaConfig& c, std::int64_t m, const layout::MmaWeight& weight,
                         const Format& operand, const GpuLimits& gpu) {
  WgmmaLaunch launch;
  launch.stages = c.tile_for(weight, gpu).stages;
  const std::int64_t tiles = weight.n_padded / 64;
  launch.n_blocks = static_cast<int>((tiles + c.tile.consumers - 1) / c.tile.consumers);
  launch.m_blocks = static_cast<int>((m + c.block_m() - 1) / c.block_m());
  const std::int64_t k_chunks = weight.k_blocks / 4;
  const std::int64_t blocks = static_cast<std::int64_t>(launch.n_blocks) * launch.m_blocks;
  // Splits fill the SMs where the (weight block, token block) units alone would leave them
  // idle, at ≥ 4 stages of K each (a unit shorter than that is mostly pipeline ramp), and
  // cost the traffic of their partial sums: every split reduces its fp32 tile into the
  // workspace and the last reads it back. The split with the best share of busy SMs in the
  // last round, discounted by that traffic against the weight's bytes, wins (measured on an
  // H100: M = 256 on 28672×8192 took 2.7–4× as long with 2–4 splits through per-element
  // atomics; bench/NOTES.md, SM90 wgmma). A split holds whole stages, and whole groups where
  // the kernel promotes the scales.
  const int chunk_step =
      kernels::wgmma_split_step(c.tile, weight.group_size, wgmma_dequant_mode(weight, operand));
  const double weight_bytes = static_cast<double>(weight.n_padded) * weight.k_blocks * 16 *
                              weight.format.bits / 8.0;
  const double rows = static_cast<double>(launch.m_blocks) * c.block_m();
  int best_splits = 1;
  double best = 0.0;
  for (int s = 1; s <= 16; ++s) {
    const std::int64_t per = (k_chunks + s - 1) / s;
    if (s > 1 && per < 4 * c.tile.stage_chunks) break;
    const std::int64_t units = blocks * s;
    const double rounds = std::ceil(static_cast<double>(units) / gpu.sm_count);
    const double efficiency = static_cast<double>(units) / (rounds * gpu.sm_count);
    const double split_bytes =
        split_partial_bytes(s, rows, static_cast<double>(weight.n_padded));
    const double score = efficiency / (1.0 + split_bytes / weight_bytes);
    if (score > best * 1.05) {
      best = score;
      best_splits = s;
    }
  }
  std::int64_t per = (k_chunks + best_splits - 1) / best_splits;
  per = (per + chunk_step - 1) / chunk_step * chunk_step;
  launch.chunks_per_split = static_cast<int>(per);
  launch.splits = static_cast<int>((k_chunks + per - 1) / per);
  launch.grid = static_cast<unsigned>(std::min<std::int64_t>(launch.units(), gpu.sm_count));
  return launch;
}

namespace {
double expected_active(std::int64_t slots, int experts) {
  const double e = experts;
  return std::max(1.0, e * (1.0 - std::pow(1.0 - 1.0 / e, static_cast<double>(slots))));
}
}  // namespace

std::int64_t grouped_active_experts(std::int64_t slots, int experts) {
  if (slots <= 0) return 1;
  return std::max<std::int64_t>(1, std::llround(expected_active(slots, experts)));
}

std::int64_t grouped_rows_per_expert(std::int64_t slots, int experts) {
  if (slots <= 0) return 1;
  return std::max<std::int64_t>(
      1, std::llround(static_cast<double>(slots) / expected_active(slots, experts)));
}

layout::MmaWeight grouped_equivalent_weight(const layout::MmaWeight& weight,
                                            std::int64_t active) {
  layout::MmaWeight equivalent;
  equivalent.order = weight.order;
  equivalent.format = weight.format;
  equivalent.n = weight.n_padded * (active - 1) + weight.n;
  equivalent.k = weight.k;
  equivalent.n_padded = weight.n_padded * active;
  equivalent.k_blocks = weight.k_blocks;
  equivalent.groups = weight.groups;
  equivalent.group_size = weight.group_size;
  equivalent.zero_mode = weight.zero_mode;
  equivalent.global_scale = weight.global_scale;
  equivalent.scales_exact_in_bf16 = weight.scales_exact_in_bf16;
  equivalent.scales_exact_in_fp16 = weight.scales_exact_in_fp16;
  return equivalent;
}

WgmmaLaunch grouped_wgmma_launch(const WgmmaConfig& c, std::int64_t slots, int experts,
                                 int route_block, const layout::MmaWeight& weight,
                                 const Format& operand, const GpuLimits& gpu) {
  // Splits as for the experts side by side against one expert's rows; then the real weight's
  // blocks, and token blocks for the routing's capacity.
  const std::int64_t active = grouped_active_experts(slots, experts);
  WgmmaLaunch launch =
      wgmma_launch(c, grouped_rows_per_expert(slots, experts),
                   grouped_equivalent_weight(weight, active), operand, gpu);
  const std::int64_t tiles = weight.n_padded / 64;
  launch.n_blocks = static_cast<int>((tiles + c.tile.consumers - 1) / c.tile.consumers);
  MoeRoutingShape shape;
  shape.tokens = slots;
  shape.global_experts = shape.local_experts = std::min(experts, 512);
  shape.block = route_block > 0 ? route_block : c.block_m();
  launch.m_blocks = static_cast<int>(moe_routing_capacity(shape) / c.block_m());
  // One split: measured on an H100, Qwen3-30B-A3B's gate_up at M = 1 (8 experts of 1536 x
  // 2048) took 18.9 µs with the 4 splits the dense rule gives and 14.3 with one (and the split-K
  // sums would cover every token block of the capacity).
  if (launch.splits > 1) {
    launch.splits = 1;
    launch.chunks_per_split = static_cast<int>(weight.k_blocks / 4);
  }
  launch.grid = static_cast<unsigned>(std::min<std::int64_t>(launch.units(), gpu.sm_count));
  return launch;
}

std::size_t wgmma_counters_offset(const WgmmaConfig& config, std::int64_t m_blocks,
                                  const layout::MmaWeight& weight) {
  const std::size_t sums = static_cast<std::size_t>(m_blocks) * config.block_m() *
                           static_cast<std::size_t>(weight.n_padded) * sizeof(float);
  return (sums + 255) / 256 * 256;
}

std::size_t wgmma_zeroed_bytes(const WgmmaConfig& config, const WgmmaLaunch& launch,
                               const layout::MmaWeight& weight) {
  if (launch.splits <= 1) return 0;
  const std::size_t counters =
      static_cast<std::size_t>(launch.m_blocks) * (weight.n_padded / 64) * sizeof(unsigned);
  return wgmma_counters_offset(config, launch.m_blocks, weight) + counters;
}

std::optional<std::string> wgmma_codes8_activation_unsupported(const ActivationQuant& quant,
                                                               const layout::MmaWeight& weight,
                                                               const Format& codes) {
  const char* tiles = tensor_cores_of(codes);
  if (!quant.is_quantized() || quant.format != codes)
    return fmt::format("the {} configs take {} activation codes ({} given)", tiles, codes.name(),
                       quant.format.name());
  if (jit::codes_are_operand8(quant)) return std::nullopt;
  if (codes == formats::e4m3 && quant.scaling == ActivationScaling::DynamicGroup &&
      quant.group == 128 && quant.scale_format == formats::fp32) {
    if (weight.group_size != 0 && weight.group_size != 128)
      return fmt::format("1x128 activation groups are promoted with the weight's groups, which "
                         "must be 128 too or one per row ({} given)",
                         weight.group_size);
    return std::nullopt;
  }
  return fmt::format("the {} configs take {} activation codes with one scale per row (per token "
                     "or per tensor){}",
                     tiles, codes.name(),
                     codes == formats::e4m3 ? " or fp32 scales per group of 128" : "");
}

bool wgmma_fp8_activation_groups(const ActivationQuant& quant) {
  return quant.scaling == ActivationScaling::DynamicGroup;
}

jit::KernelSpec wgmma_spec(const WgmmaConfig& c, const WgmmaLaunch& launch,
                           const layout::MmaWeight& weight, const Format& operand,
                           const Format& output, jit::Arch arch, bool activation_group_scales,
                           bool grouped, const std::optional<GluKind>& glu) {
  if (glu && !grouped)
    throw Error(ErrorCode::Internal, "wgmma family: a fused GLU without a grouped launch");
  jit::KernelSpec spec;
  spec.arch = arch;
  spec.family = "wgmma_gemm_sm90";
  spec.params = {
      jit::SpecParam::integer("consumers", c.tile.consumers),
      jit::SpecParam::integer("tokens", c.tile.tokens),
      jit::SpecParam::integer("stage_chunks", c.tile.stage_chunks),
      jit::SpecParam::integer("stages", launch.stages),
      jit::SpecParam::boolean("transform", c.tile.transform),
      jit::SpecParam::number_format("weight", weight.format),
      jit::SpecParam::chosen("zero", layout::mma_zero_mode_name(weight.zero_mode)),
      jit::SpecParam::integer("group", weight.group_size),
      jit::SpecParam::chosen("act", activation_group_scales ? "e4m3_g128" : operand.name()),
      jit::SpecParam::chosen("out", output.name()),
      jit::SpecParam::boolean("split_k", launch.splits > 1),
      jit::SpecParam::chosen("dequant", wgmma_dequant(weight, operand)),
      jit::SpecParam::boolean("grouped", grouped),
      jit::fused_glu_param(glu),
  };
  spec.launch.threads_per_block = c.threads();
  kernels::WgmmaTile tile = c.tile;
  tile.stages = launch.stages;
  spec.launch.dynamic_smem_bytes = shape_of(tile, weight).shared_bytes;
  return spec;
}

}  // namespace qgemm::dispatch
