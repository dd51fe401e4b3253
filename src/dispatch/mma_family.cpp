#include "dispatch/mma_family.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "dispatch/wgmma_family.hpp"
#include "qgemm/error.hpp"

namespace qgemm::dispatch {

namespace {

// The streamed kernel's A rows for M ≤ 16: a power of two (five instantiations serve every M).
int streamed_rows(std::int64_t m) {
  int rows = 1;
  while (rows < m && rows < 16) rows *= 2;
  return rows;
}

// The residency target for `rows` A rows: the streamed kernel's 16-row instantiation holds
// twice the accumulators and fits 128 registers (4 blocks of 128 threads), not fewer.
int target_blocks(const MmaConfig& config, int rows) {
  if (config.kernel == MmaKernel::Streamed && rows > 8) return std::min(config.blocks_per_sm, 4);
  return config.blocks_per_sm;
}

// Blocks of `config` resident per SM: its target, capped by shared memory (1 KB per block is
// the system's on SM80 and later).
int resident_blocks(const MmaConfig& config, const layout::MmaWeight& weight, int rows,
                    const GpuLimits& gpu) {
  const int smem = config.shared_bytes(weight, rows);
  return std::max(1, std::min(target_blocks(config, rows), gpu.shared_per_sm / (smem + 1024)));
}

kernels::DecodeTile decode_tile(const MmaConfig& config, int rows) {
  kernels::DecodeTile tile = config.decode;
  tile.rows = rows;
  return tile;
}

// Split factor that fills whole waves of resident blocks: a grid of 1.13 waves runs as long as
// 2 (the SMs idle through the second). `blocks_for(s)` is the grid for s splits (0: s is not
// allowed); the first s reaching 90 % wave efficiency wins, else the best.
template <typename BlocksFor>
int wave_filling_splits(std::int64_t resident, int max_splits, BlocksFor blocks_for) {
  int splits = 1;
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const std::int64_t blocks = blocks_for(s);
    if (blocks == 0) continue;
    const double waves = static_cast<double>(blocks) / static_cast<double>(resident);
    const double efficiency = waves / std::ceil(waves);
    if (efficiency > best + 1e-9) {
      best = efficiency;
      splits = s;
    }
    if (efficiency >= 0.9) break;
  }
  return splits;
}

}  // namespace

int MmaConfig::threads() const {
  return kernel == MmaKernel::Streamed ? 32 * decode.warps
                                       : kernels::dense_shape(tile, 4, 0, false, 2).threads;
}

int MmaConfig::block_m() const {
  return kernel == MmaKernel::Streamed ? 16 : 16 * tile.m_tiles * tile.warps_m;
}

int MmaConfig::block_n() const { return kernel == MmaKernel::Streamed ? 64 : 64 * tile.warps_n; }

int MmaConfig::shared_bytes(const layout::MmaWeight& weight, int rows) const {
  const int bits = weight.format.bits;
  if (kernel == MmaKernel::Streamed)
    return kernels::decode_shape(decode_tile(*this, rows), bits, weight.group_size,
                                 weight.stores_zeros())
        .shared_bytes;
  return kernels::dense_shape(tile, bits, weight.group_size, weight.stores_zeros(), operand_bytes)
      .shared_bytes;
}

std::optional<std::string> MmaConfig::unsupported_reason(std::int64_t m,
                                                         const layout::MmaWeight& weight,
                                                         const Format& operand,
                                                         const GpuLimits& gpu) const {
  // bf16 tensor-core operands (mma.sync .bf16) start with SM80.
  if (operand == formats::bf16 && gpu.arch == jit::Arch::sm_75)
    return std::string("bf16 activations need SM80 or later (sm_75 serves fp16)");
  const bool byte_operand = operand.storage_bytes() == 1;
  if (byte_operand != (operand_bytes == 1))
    return fmt::format("{} operands need a config of {}-bit operands", operand.name(),
                       operand.storage_bytes() * 8);
  const int group_size = weight.group_size;
  if (operand_bytes == 1) {
    // Compiled for SM90 and SM100, mma.sync on e4m3 becomes a conversion to f16 in registers
    // and two f16 mma (SASS: HMMA.16816, no QMMA): no faster than the 16-bit operand, which
    // holds e4m3 exactly. Their fp8 tensor cores are wgmma's / tcgen05's.
    if (operand == formats::e4m3 && gpu.arch != jit::Arch::sm_89 && gpu.arch != jit::Arch::sm_120a)
      return fmt::format("e4m3 mma.sync is native on SM89 and SM120 only, not {}",
                         jit::arch_name(gpu.arch));
    if (gpu.arch < jit::Arch::sm_80) return std::string("8-bit mma.sync needs SM80 or later");
    if (group_size % 32 != 0)
      return fmt::format("weight groups of {} are not whole 32-wide mma steps", group_size);
    std::string why;
    if (!layout::byte_dequant(weight, operand, &why)) return why;
  }
  int rows = 16;
  if (kernel == MmaKernel::Streamed) {
    if (m > 16) return fmt::format("M = {} exceeds the 16 rows of the streamed kernel", m);
    rows = streamed_rows(m);
    if (const char* error = kernels::decode_tile_error(decode_tile(*this, rows), group_size))
      return fmt::format("{} (group {}, stage K {})", error, group_size,
                         decode.stage_blocks * 16);
    std::string why;
    if (!layout::unscaled_dequant(weight, operand, &why))
      return fmt::format("no unscaled dequantization: {}", why);
  } else if (weight.order != layout::FragmentOrder::Mma) {
    return fmt::format("the tiled kernel reads the mma layout, not the {} order",
                       layout::fragment_order_name(weight.order));
  } else if (const char* error = kernels::dense_tile_error(tile, group_size, operand_bytes)) {
    return fmt::format("{} (group {}, BK {})", error, group_size, tile.block_k);
  }
  if (const int bytes = shared_bytes(weight, rows); bytes > gpu.shared_per_block)
    return fmt::format("needs {} bytes of shared memory (this GPU allows {} per block)", bytes,
                       gpu.shared_per_block);
  return std::nullopt;
}

const std::vector<MmaConfig>& mma_configs() {
  using K = MmaKernel;
  // {name, kernel, tile {m_tiles, warps_m, warps_n, warps_k, block_k, stages},
  //  decode {rows, warps, stage_blocks, stages}, blocks_per_sm, operand_bytes}
  static const std::vector<MmaConfig> configs = {
      // M ≤ 16, streamed: 4 warps per block, each with 3 stages of 128 K (2 in flight); shorter
      // stages (finer K splits, more warps), a deeper ring, 8-warp blocks.
      {"decode", K::Streamed, {}, {1, 4, 8, 3}, 4, 2},
      {"decode-k64", K::Streamed, {}, {1, 4, 4, 4}, 5, 2},
      {"decode-s4", K::Streamed, {}, {1, 4, 8, 4}, 3, 2},
      {"decode-w8", K::Streamed, {}, {1, 8, 8, 3}, 2, 2},
      // 2 warps a block, each streaming half of K through 4 stages (4 blocks an SM): for grouped
      // GEMMs of short K, where 4 warps get little more than their ring's first stages (Qwen3's
      // down, K 768: 42 -> 34 µs on the H100). Held back until the sweep's MoE case that ran it
      // (bench/NOTES.md, sixteenth session) is explained.
      {"decode-w2",
       K::Streamed,
       {},
       {1, 2, 8, 4},
       4,
       2,
       "held back: a sweep failure on a layer that ran it is not yet explained"},
      // M ≤ 16 on the tiled kernel (weights the streamed one cannot serve): one m16 tile, four
      // warps splitting K inside the block.
      {"decode-tiled", K::Tiled, {1, 1, 1, 4, 256, 4}, {}, 3, 2},
      // Up to ~128 rows: 64x128 tiles.
      {"medium", K::Tiled, {2, 2, 2, 1, 64, 4}, {}, 2, 2},
      // 128x128 tiles, 64x64 per warp (dequantized B reused over 4 m16 tiles), and 8-warp
      // candidates: 128x256 and 256x128.
      {"prefill", K::Tiled, {4, 2, 2, 1, 64, 4}, {}, 1, 2},
      {"prefill-n256", K::Tiled, {4, 2, 4, 1, 64, 4}, {}, 1, 2},
      {"prefill-m256", K::Tiled, {4, 4, 2, 1, 64, 3}, {}, 1, 2},
      // 8-bit activations (int8, e4m3 codes; mma.m16n8k32): 64x128 and 128x128 tiles of 32x64
      // per warp, one K warp (the unscaled group sums double the accumulators: ~220
      // registers), and 32x128 tiles of 16x64 per warp (~150).
      {"medium-a8", K::Tiled, {2, 2, 2, 1, 128, 4}, {}, 2, 1},
      {"medium-a8-m32", K::Tiled, {1, 2, 2, 1, 128, 4}, {}, 2, 1},
      {"prefill-a8", K::Tiled, {2, 4, 2, 1, 128, 3}, {}, 1, 1},
  };
  return configs;
}

const MmaConfig* find_mma_config(std::string_view name) {
  for (const MmaConfig& config : mma_configs())
    if (config.name == name) return &config;
  return nullptr;
}

std::int64_t MmaLaunch::blocks(const MmaConfig& config, std::int64_t m) const {
  return static_cast<std::int64_t>(grid_x) * grid_y(config, m) * splits;
}

unsigned MmaLaunch::grid_y(const MmaConfig& config, std::int64_t m) const {
  if (config.kernel == MmaKernel::Streamed)
    return grouped ? static_cast<unsigned>((m + rows - 1) / rows) : 1u;
  return static_cast<unsigned>((m + config.block_m() - 1) / config.block_m());
}

MmaLaunch mma_launch(const MmaConfig& c, std::int64_t m, const layout::MmaWeight& weight,
                     const GpuLimits& gpu) {
  MmaLaunch launch;
  launch.order = weight.order;
  const std::int64_t slices = weight.n_padded / 64;
  launch.rows = c.kernel == MmaKernel::Streamed ? streamed_rows(m) : c.block_m();
  launch.resident_per_sm = resident_blocks(c, weight, launch.rows, gpu);
  const std::int64_t resident = static_cast<std::int64_t>(gpu.sm_count) * launch.resident_per_sm;

  if (c.kernel == MmaKernel::Streamed) {
    // Each warp takes a whole number of stages; a split is a block of `warps` warps per slice.
    const int stage_blocks = c.decode.stage_blocks, warps = c.decode.warps;
    const auto k_blocks = weight.k_blocks;
    auto per_warp = [&](int s) {
      const std::int64_t all = static_cast<std::int64_t>(s) * warps;
      const std::int64_t blocks = (k_blocks + all - 1) / all;
      return (blocks + stage_blocks - 1) / stage_blocks * stage_blocks;
    };
    auto real_splits = [&](int s) {
      return (k_blocks + per_warp(s) * warps - 1) / (per_warp(s) * warps);
    };
    // The finest split whose warps still stream ≥ 512 of K each, within 4 waves. Measured on
    // the H200 (bench/NOTES.md, third session; w4a16 M = 1, splits 1-8 of both configs): wave
    // fill matters little, since a block is short; what costs is a warp's pipeline ramp and
    // drain when its range is short (≤ 256 of K: +2-4 µs), and too few warps in flight (a
    // split of 1 on 28672×8192, 0.85 waves: 51 µs against 44).
    int splits = 1;
    for (int s = 2; s <= 32; ++s) {
      if (per_warp(s) * 16 < 512) break;
      if (slices * real_splits(s) > 4 * resident) break;
      splits = s;
    }
    launch.blocks_per_warp = static_cast<int>(per_warp(splits));
    launch.splits = static_cast<int>(real_splits(splits));
    launch.grid_x = static_cast<unsigned>(slices);
    launch.k_tiles = static_cast<int>(k_blocks);
    launch.tiles_per_split = launch.blocks_per_warp * warps;
    return launch;
  }

  launch.grid_x = static_cast<unsigned>((slices + c.tile.warps_n - 1) / c.tile.warps_n);
  launch.k_tiles =
      static_cast<int>((weight.k_blocks * 16 + c.tile.block_k - 1) / c.tile.block_k);
  // Keep at least two K tiles per split so that each one still pipelines.
  const std::int64_t tiles = static_cast<std::int64_t>(launch.grid_x) * launch.grid_y(c, m);
  const int splits = wave_filling_splits(resident, 8, [&](int s) -> std::int64_t {
    if (s > 1 && launch.k_tiles / s < 2) return 0;
    return tiles * s;
  });
  launch.tiles_per_split = (launch.k_tiles + splits - 1) / splits;
  launch.splits = (launch.k_tiles + launch.tiles_per_split - 1) / launch.tiles_per_split;
  return launch;
}

int grouped_decode_rows(std::int64_t rows_per_expert, int route_block) {
  const int preferred = rows_per_expert > 8 ? 16 : 8;
  if (route_block <= 0 || route_block % preferred == 0) return preferred;
  return route_block % 8 == 0 ? 8 : 0;
}

MmaLaunch grouped_mma_launch(const MmaConfig& c, std::int64_t slots, int experts, int route_block,
                             const layout::MmaWeight& weight, const GpuLimits& gpu) {
  if (c.kernel != MmaKernel::Streamed)
    throw Error(ErrorCode::Internal,
                fmt::format("grouped_mma_launch: '{}' is a tiled config (rule: the streamed "
                            "decode kernel serves grouped GEMMs)",
                            c.name));
  MmaLaunch launch;
  launch.grouped = true;
  launch.order = weight.order;
  launch.rows = grouped_decode_rows(grouped_rows_per_expert(slots, experts), route_block);
  if (launch.rows == 0)
    throw Error(ErrorCode::Unsupported,
                fmt::format("grouped decode: routing block {} (rule: a multiple of 8, the "
                            "kernel's token block of 8 or 16 rows divides it)",
                            route_block));
  launch.resident_per_sm = resident_blocks(c, weight, launch.rows, gpu);
  // One split: each warp streams a quarter (an eighth) of K, in whole stages.
  const int stage_blocks = c.decode.stage_blocks, warps = c.decode.warps;
  const std::int64_t per_warp = (weight.k_blocks + warps - 1) / warps;
  launch.blocks_per_warp =
      static_cast<int>((per_warp + stage_blocks - 1) / stage_blocks * stage_blocks);
  launch.splits = 1;
  launch.grid_x = static_cast<unsigned>(weight.n_padded / 64);
  launch.k_tiles = static_cast<int>(weight.k_blocks);
  launch.tiles_per_split = launch.blocks_per_warp * warps;
  return launch;
}

std::size_t mma_zeroed_bytes(const MmaConfig& config, const MmaLaunch& launch, std::int64_t m,
                             const layout::MmaWeight& weight) {
  if (launch.splits <= 1) return 0;
  const std::size_t sums = static_cast<std::size_t>(m) * weight.n * sizeof(float);
  const std::size_t counters =
      static_cast<std::size_t>(launch.grid_x) * launch.grid_y(config, m) * sizeof(unsigned);
  return (sums + 255) / 256 * 256 + counters;
}

jit::KernelSpec mma_spec(const MmaConfig& c, const MmaLaunch& launch,
                         const layout::MmaWeight& weight, const Format& operand,
                         const Format& output, jit::Arch arch, const std::optional<GluKind>& glu) {
  if (glu && !launch.grouped)
    throw Error(ErrorCode::Internal, "mma family: a fused GLU without a grouped launch");
  jit::KernelSpec spec;
  spec.arch = arch;
  if (c.kernel == MmaKernel::Streamed) {
    const auto dequant = layout::unscaled_dequant(weight, operand);
    if (!dequant)
      throw Error(ErrorCode::Internal, "mma family: streamed config without an unscaled dequant");
    spec.family = "dense_decode_sm80";
    spec.params = {
        jit::SpecParam::integer("rows", launch.rows),
        jit::SpecParam::integer("warps", c.decode.warps),
        jit::SpecParam::integer("stage_blocks", c.decode.stage_blocks),
        jit::SpecParam::integer("stages", c.decode.stages),
        jit::SpecParam::number_format("weight", weight.format),
        jit::SpecParam::chosen("zero", layout::mma_zero_mode_name(weight.zero_mode)),
        jit::SpecParam::integer("group", weight.group_size),
        jit::SpecParam::chosen("act", operand.name()),
        jit::SpecParam::chosen("out", output.name()),
        jit::SpecParam::boolean("split_k", launch.splits > 1),
        jit::SpecParam::chosen("dequant", *dequant),
        jit::SpecParam::integer("min_blocks", target_blocks(c, launch.rows)),
        jit::SpecParam::boolean("grouped", launch.grouped),
        jit::SpecParam::chosen("order", layout::fragment_order_name(weight.order)),
        jit::fused_glu_param(glu),
    };
  } else {
    std::string dequant;
    if (c.operand_bytes == 1) {
      const auto bytes = layout::byte_dequant(weight, operand);
      if (!bytes)
        throw Error(ErrorCode::Internal, "mma family: 8-bit config without a byte dequant");
      dequant = *bytes;
    } else {
      dequant = layout::packed16_dequant_applies(weight, operand) ? "packed16" : "fp32";
    }
    spec.family = "dense_gemm_sm80";
    spec.params = {
        jit::SpecParam::integer("m_tiles", c.tile.m_tiles),
        jit::SpecParam::integer("warps_m", c.tile.warps_m),
        jit::SpecParam::integer("warps_n", c.tile.warps_n),
        jit::SpecParam::integer("warps_k", c.tile.warps_k),
        jit::SpecParam::integer("block_k", c.tile.block_k),
        jit::SpecParam::integer("stages", c.tile.stages),
        jit::SpecParam::number_format("weight", weight.format),
        jit::SpecParam::chosen("zero", layout::mma_zero_mode_name(weight.zero_mode)),
        jit::SpecParam::integer("group", weight.group_size),
        jit::SpecParam::chosen("act", operand.name()),
        jit::SpecParam::chosen("out", output.name()),
        jit::SpecParam::boolean("split_k", launch.splits > 1),
        jit::SpecParam::chosen("dequant", dequant),
        jit::SpecParam::integer("min_blocks", c.blocks_per_sm),
    };
  }
  spec.launch.threads_per_block = c.threads();
  spec.launch.dynamic_smem_bytes = c.shared_bytes(weight, launch.rows);
  return spec;
}

}  // namespace qgemm::dispatch
