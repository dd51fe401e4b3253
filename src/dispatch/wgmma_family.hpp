// The SM90 wgmma kernel family (kernels/gemm/sm90_wgmma.cuh) on the prepared wgmma order
// (kernels/gemm/wgmma_weight_layout.cuh): its configs, the rules that say which problems a
// config can serve, and the launch geometry and kernel spec of a config for a problem.
//
//   wgmma-8 .. wgmma-256   the token width (wgmma's N) of the config: one instantiation per
//                          width, each with the stage size and depth that suit it
//   wgmma-8-k256, ...      decode widths with 256-K stages (fewer, larger copies)
//   wgmma-8-c4             decode with four consumer warpgroups (256 rows a block)
//   wgmma-64-tx, ...       transform warps dequantize into shared memory; the consumers' wgmma
//                          read both operands there
//   wgmma-fp8-8 .. -128    FP8 tensor cores: e4m3 activation codes (per token or tensor) against
//                          the weight as e4m3 in registers (m64nNk32), scale groups promoted
//
// Threads and shared memory come from kernels/gemm/sm90_wgmma_shape.cuh, evaluated here on the
// same values the spec passes to the template. Which config a call uses is the selector's
// business (dispatch/select.hpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/gpu_limits.hpp"
#include "gemm/sm90_wgmma_shape.cuh"
#include "jit/kernel_spec.hpp"
#include "layout/mma_layout.hpp"

namespace qgemm::dispatch {

struct WgmmaConfig {
  std::string name;  // "wgmma-8", ..., "wgmma-256" (the tuning tables' key)
  kernels::WgmmaTile tile;  // tile.stages is the most the ring takes
  // Why the selector ranks this config only when it is forced (benches, the tuner, the GPU
  // tests); empty: ranked like the rest. A design that measured slower stays servable this way.
  std::string held_back = {};
  // An eight-bit tile's activation codes: int8 (the INT8 tensor cores, s8 wgmma); else e4m3.
  bool int8 = false;

  // The activation codes an eight-bit tile takes: int8 or e4m3.
  const Format& codes() const;

  int block_m() const { return tile.tokens; }
  int block_n() const { return 64 * tile.consumers; }
  int threads() const;
  // The tile for `weight` on `gpu`: the deepest ring up to tile.stages that fits the block's
  // shared memory (wider codes make larger stages), at least two stages.
  kernels::WgmmaTile tile_for(const layout::MmaWeight& weight, const GpuLimits& gpu) const;
  int shared_bytes(const layout::MmaWeight& weight, const GpuLimits& gpu) const;
  // Why this config cannot serve M rows of `operand` (16-bit; the codes() of an eight-bit tile)
  // against `weight` (in the wgmma order) on `gpu`; nullopt when it can.
  std::optional<std::string> unsupported_reason(std::int64_t m, const layout::MmaWeight& weight,
                                                const Format& operand,
                                                const GpuLimits& gpu) const;
};

const std::vector<WgmmaConfig>& wgmma_configs();
const WgmmaConfig* find_wgmma_config(std::string_view name);  // null when there is none

// QGEMM_WGMMA, read at each call (so a test can set it):
//   unset  the selector ranks the family; a weight keeps the wgmma order where it wins some M
//   0      the selector leaves the family out (a switch for bisecting a deployment)
//   1      ranked, and every weight keeps every layout it can hold (the wgmma order, the mma
//          layout, cuBLASLt's canonical codes), so that any config can be forced on it (benches,
//          the tuner, the GPU tests)
// A forced config is served whenever the weight has its layout.
bool wgmma_ranked_by_default();
bool every_layout_on_every_weight();
// QGEMM_WGMMA_FP8=1 (read at each call): the held-back eight-bit configs (FP8 and INT8 below
// 128 tokens) are ranked like the rest (WgmmaConfig::held_back), for the gates and benches that
// judge them before the hold is lifted.
bool wgmma_fp8_ranked();
// The streamed decode kernel and qdq's dequantization read the wgmma order unforced, so that
// prepare_weight keeps one layout on SM90 (dispatch::kept_layouts); QGEMM_WGMMA_ORDER_READERS=0
// (read at each call) turns that off: both layouts are kept, and a weight in the wgmma order
// alone reaches those two paths only when forced.
bool wgmma_order_readers_ranked();
inline constexpr const char* kWgmmaOrderReadersSwitchedOff =
    "QGEMM_WGMMA_ORDER_READERS=0 keeps the wgmma order from its readers (a forced run takes it)";
inline constexpr const char* kWgmmaSwitchedOff =
    "QGEMM_WGMMA=0 keeps the SM90 wgmma family out of the ranking (a forced config still runs)";

// Why the eight-bit configs cannot turn `weight` into `codes` (e4m3 or int8) in registers
// (kernels/dequant/wgmma_codes8.cuh): e4m3 takes e4m3 codes and 2- and 4-bit codes (integers
// with at most a constant zero point, e2m1) whose every value e4m3 holds; int8 takes 2-, 4- and
// 8-bit integers (ternary included) with at most a constant zero point whose every value s8
// holds; nullopt when they can.
std::optional<std::string> wgmma_codes8_weight_unsupported(const layout::MmaWeight& weight,
                                                           const Format& codes);

// How the kernel dequantizes `weight` against `operand`: "packed16", "float16" or "fp32"
// (kernels/dequant/wgmma_dequant.cuh), "e4m3" / "s8" against e4m3 / int8 codes (the eight-bit
// configs, kernels/dequant/wgmma_codes8.cuh), and that mode's code (its WgmmaDequant value).
std::string wgmma_dequant(const layout::MmaWeight& weight, const Format& operand);
int wgmma_dequant_mode(const layout::MmaWeight& weight, const Format& operand);

// Whether the config's kernel scales fp32 group sums instead of the weights
// (kernels/gemm/sm90_wgmma_shape.cuh, wgmma_promotes_scales).
bool wgmma_promotes_scales(const WgmmaConfig& config, const layout::MmaWeight& weight,
                           const Format& operand);

// One config's launch for a problem at M rows (a plan fixes it per M bucket at its largest M).
struct WgmmaLaunch {
  int stages = 2;  // the ring depth that fits (WgmmaConfig::tile_for)
  int n_blocks = 1, m_blocks = 1, splits = 1, chunks_per_split = 1;
  unsigned grid = 1;  // persistent blocks: min(units, SMs)
  std::int64_t units() const { return static_cast<std::int64_t>(n_blocks) * m_blocks * splits; }
};

WgmmaLaunch wgmma_launch(const WgmmaConfig& config, std::int64_t m,
                         const layout::MmaWeight& weight, const Format& operand,
                         const GpuLimits& gpu);

// The grouped (MoE) GEMM over `slots` routed rows of `experts` experts, routed in blocks of
// `route_block` (0: the config's token tile): token blocks for the routing's capacity (every
// routing of the shape fits; the kernel skips blocks past the routed total), splits as for
// the token blocks uniform routing is expected to fill.
WgmmaLaunch grouped_wgmma_launch(const WgmmaConfig& config, std::int64_t slots, int experts,
                                 int route_block, const layout::MmaWeight& weight,
                                 const Format& operand, const GpuLimits& gpu);
// Uniform routing of `slots` rows over `experts`: how many experts are expected to get any, and
// how many rows each of those gets (what a grouped GEMM's config is chosen at).
std::int64_t grouped_active_experts(std::int64_t slots, int experts);
std::int64_t grouped_rows_per_expert(std::int64_t slots, int experts);
// The experts that get rows, side by side, as one weight: `active` times the rows of `weight`
// (a grouped GEMM costs what the dense GEMM of that weight against one expert's rows costs:
// the same units, waves and weight bytes).
layout::MmaWeight grouped_equivalent_weight(const layout::MmaWeight& weight, std::int64_t active);

// Split-K scratch: an fp32 slot per accumulator of every (token block, weight tile), then one
// counter per (token block, weight tile); the kernel leaves both zero (0 without split-K).
std::size_t wgmma_zeroed_bytes(const WgmmaConfig& config, const WgmmaLaunch& launch,
                               const layout::MmaWeight& weight);
// Where the counters start in that scratch, for `m_blocks` token blocks.
std::size_t wgmma_counters_offset(const WgmmaConfig& config, std::int64_t m_blocks,
                                  const layout::MmaWeight& weight);

// `activation_group_scales`: e4m3 codes with 1x128 group scales (fp8-block's activations), which
// the FP8 tiles promote with the weight's scales (wgmma_codes8_activation_unsupported).
jit::KernelSpec wgmma_spec(const WgmmaConfig& config, const WgmmaLaunch& launch,
                           const layout::MmaWeight& weight, const Format& operand,
                           const Format& output, jit::Arch arch,
                           bool activation_group_scales = false, bool grouped = false,
                           const std::optional<GluKind>& glu = std::nullopt);

// Why the eight-bit configs of `codes` (e4m3 or int8) cannot take `quant`'s activation codes
// against `weight` (nullopt when they can): codes of that format with one scale per row (per
// token or tensor, applied in the epilogue), or e4m3 in groups of 128 along K with fp32 scales
// (promoted per group, DeepGEMM's way) where the weight's groups are 128 too or one per row.
std::optional<std::string> wgmma_codes8_activation_unsupported(const ActivationQuant& quant,
                                                               const layout::MmaWeight& weight,
                                                               const Format& codes);
// Whether those codes come with group scales (the kernel's act=e4m3_g128).
bool wgmma_fp8_activation_groups(const ActivationQuant& quant);

}  // namespace qgemm::dispatch
