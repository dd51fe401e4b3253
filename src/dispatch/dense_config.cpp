#include "dispatch/dense_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/log.hpp"
#include "qgemm/error.hpp"

namespace qgemm::dispatch {

int DenseGemmConfig::shared_bytes(const layout::MmaWeight& weight) const {
  // = DenseGemmShape::kSharedBytes in kernels/gemm/sm80_dense.cuh.
  const int bits = weight.format.bits, group_size = weight.group_size;
  const bool stored_zeros = weight.stores_zeros();
  const int k_blocks = block_k / 16;
  const int scale_rows = (group_size == 0 || group_size >= block_k) ? 1 : block_k / group_size;
  const int a_bytes = block_m() * block_k * 2;
  const int b_bytes = warps_n * k_blocks * 32 * bits * 4;
  const int s_bytes = scale_rows * block_n() * 4 * (stored_zeros ? 2 : 1);
  const int pipeline = (a_bytes + b_bytes + s_bytes) * stages;
  const int reduce = (warps_k - 1) * warps_m * warps_n * 32 * m_tiles * 8 * 4 * 4;
  return std::max(pipeline, reduce);
}

std::optional<std::string> DenseGemmConfig::unsupported_reason(int group_size) const {
  if (group_size != 0 && group_size % block_k != 0 && block_k % group_size != 0)
    return fmt::format("group {} neither divides nor is a multiple of BK {}", group_size, block_k);
  return std::nullopt;
}

const std::vector<DenseGemmConfig>& dense_gemm_configs() {
  static const std::vector<DenseGemmConfig> configs = {
      // M <= 16: one m16 tile, four warps splitting K inside the block, deep stages of weight.
      {"decode", 1, 1, 1, 4, 256, 4, 3},
      {"decode-bk128", 1, 1, 1, 4, 128, 6, 3},
      // Occupancy candidates for decode (bench/NOTES.md v2: the default is limited to 12 warps
      // per SM by shared memory): fewer stages (16 warps per SM), or 8 K warps per block.
      {"decode-s3", 1, 1, 1, 4, 256, 3, 4},
      {"decode-w8", 1, 1, 1, 8, 256, 3, 2},
      // Up to 128 rows: 64x128 tiles.
      {"medium", 2, 2, 2, 1, 64, 4, 2},
      // Prefill: 128x128 tiles, 64x64 per warp (dequantized B reused over 4 m16 tiles).
      {"prefill", 4, 2, 2, 1, 64, 4, 1},
  };
  return configs;
}

DensePlan plan_dense_gemm(std::int64_t m, const layout::MmaWeight& weight, int sm_count,
                          std::string_view forced) {
  std::string wanted = m <= 16 ? "decode" : m <= 128 ? "medium" : "prefill";
  const DenseGemmConfig* chosen = nullptr;
  if (!forced.empty()) {
    for (const auto& config : dense_gemm_configs())
      if (config.name == forced) chosen = &config;
    if (!chosen)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("dense gemm: config '{}' is not a tile config", forced));
    if (auto reason = chosen->unsupported_reason(weight.group_size))
      throw Error(ErrorCode::Unsupported,
                  fmt::format("dense gemm: config '{}' cannot serve: {}", forced, *reason));
  }
  for (const auto& config : dense_gemm_configs()) {
    if (chosen) break;
    if (config.name.rfind(wanted, 0) != 0) continue;
    if (auto reason = config.unsupported_reason(weight.group_size)) {
      log(LogLevel::Debug, "dense gemm: config {} skipped: {}", config.name, *reason);
      continue;
    }
    chosen = &config;
    break;
  }
  if (!chosen) {
    for (const auto& config : dense_gemm_configs())
      if (!config.unsupported_reason(weight.group_size)) {
        chosen = &config;
        break;
      }
  }
  if (!chosen)
    throw Error(
        ErrorCode::Unsupported,
        fmt::format("dense gemm: no tile config serves weight groups of {}", weight.group_size));
  DensePlan plan;
  plan.config = *chosen;
  const auto& c = plan.config;
  plan.grid_x = static_cast<unsigned>((weight.n_padded / 64 + c.warps_n - 1) / c.warps_n);
  plan.grid_y = static_cast<unsigned>((m + c.block_m() - 1) / c.block_m());
  plan.k_tiles = static_cast<int>((weight.k_blocks * 16 + c.block_k - 1) / c.block_k);
  // Split K so that the blocks fill whole waves of resident blocks: a grid of 1.13 waves runs
  // as long as 2 (the SMs idle through the second). Try 1..8 splits, keeping at least two K
  // tiles per split so that each one still pipelines; take the first that reaches 90 % wave
  // efficiency, else the best. Residency: the config's expectation, capped by shared memory.
  const int smem = c.shared_bytes(weight);
  const int per_sm = std::max(1, std::min(c.blocks_per_sm, (227 * 1024) / (smem + 1024)));
  const std::int64_t blocks = static_cast<std::int64_t>(plan.grid_x) * plan.grid_y;
  const std::int64_t resident = static_cast<std::int64_t>(sm_count) * per_sm;
  int splits = 1;
  double best = 0.0;
  for (int s = 1; s <= 8 && (s == 1 || plan.k_tiles / s >= 2); ++s) {
    const double waves = static_cast<double>(blocks * s) / static_cast<double>(resident);
    const double efficiency = waves / std::ceil(waves);
    if (efficiency > best + 1e-9) {
      best = efficiency;
      splits = s;
    }
    if (efficiency >= 0.9) break;
  }
  plan.tiles_per_split = (plan.k_tiles + splits - 1) / splits;
  plan.splits = (plan.k_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split;
  return plan;
}

jit::KernelSpec dense_gemm_spec(const DensePlan& plan, const layout::MmaWeight& weight,
                                const Format& activation, const Format& output, jit::Arch arch) {
  const auto& c = plan.config;
  jit::KernelSpec spec;
  spec.family = "dense_gemm_sm80";
  spec.arch = arch;
  spec.params = {
      jit::SpecParam::integer("m_tiles", c.m_tiles),
      jit::SpecParam::integer("warps_m", c.warps_m),
      jit::SpecParam::integer("warps_n", c.warps_n),
      jit::SpecParam::integer("warps_k", c.warps_k),
      jit::SpecParam::integer("block_k", c.block_k),
      jit::SpecParam::integer("stages", c.stages),
      jit::SpecParam::number_format("weight", weight.format),
      jit::SpecParam::chosen("zero", layout::mma_zero_mode_name(weight.zero_mode)),
      jit::SpecParam::integer("group", weight.group_size),
      jit::SpecParam::chosen("act", activation.name()),
      jit::SpecParam::chosen("out", output.name()),
      jit::SpecParam::boolean("split_k", plan.splits > 1),
      jit::SpecParam::chosen(
          "dequant", layout::packed16_dequant_applies(weight, activation) ? "packed16" : "fp32"),
      jit::SpecParam::integer("min_blocks", c.blocks_per_sm),
  };
  spec.launch.threads_per_block = c.threads();
  spec.launch.dynamic_smem_bytes = c.shared_bytes(weight);
  return spec;
}

}  // namespace qgemm::dispatch
