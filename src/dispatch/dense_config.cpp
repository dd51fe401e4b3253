#include "dispatch/dense_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/log.hpp"
#include "jit/catalog.hpp"
#include "qgemm/error.hpp"

namespace qgemm::dispatch {

namespace {

// The residency target of `config` for `rows` A rows: the streamed kernel's 16-row
// instantiation holds twice the accumulators and fits 128 registers (4 blocks of 128 threads),
// not fewer.
int target_blocks(const DenseGemmConfig& config, int rows) {
  if (config.kernel == DenseKernel::Streamed && rows > 8) return std::min(config.blocks_per_sm, 4);
  return config.blocks_per_sm;
}

// Blocks of `config` resident per SM: its target, capped by shared memory (1 KB per block is
// the system's on SM80 and later).
int resident_blocks(const DenseGemmConfig& config, const layout::MmaWeight& weight, int rows,
                    const GpuLimits& gpu) {
  const int smem = config.shared_bytes(weight, rows);
  return std::max(1, std::min(target_blocks(config, rows), gpu.shared_per_sm / (smem + 1024)));
}

// The streamed kernel's A rows for M <= 16: a power of two (five instantiations serve every M).
int streamed_rows(std::int64_t m) {
  int rows = 1;
  while (rows < m) rows *= 2;
  return rows;
}

}  // namespace

int DenseGemmConfig::shared_bytes(const layout::MmaWeight& weight, int rows) const {
  if (kernel == DenseKernel::DequantCublas) return 0;
  const int bits = weight.format.bits, group_size = weight.group_size;
  const bool stored_zeros = weight.stores_zeros();
  if (kernel == DenseKernel::Streamed) {
    // = DecodeGemmShape::kSharedBytes in kernels/gemm/sm80_decode.cuh.
    const int stage_blocks = block_k / 16;
    const int scale_rows = (group_size == 0 || group_size >= block_k) ? 1 : block_k / group_size;
    const int w_bytes = stage_blocks * 32 * bits * 4;
    const int a_bytes = rows * (block_k * 2 + 16);
    const int s_bytes = scale_rows * 64 * 4 * (stored_zeros ? 2 : 1);
    const int zero_row = block_k * 2;
    const int pipeline = warps_k * (zero_row + stages * (w_bytes + a_bytes + s_bytes));
    const int reduce = (warps_k - 1) * (rows > 8 ? 32 : 16) * 32 * 4;
    return std::max(pipeline, reduce);
  }
  // = DenseGemmShape::kSharedBytes in kernels/gemm/sm80_dense.cuh.
  const int k_blocks = block_k / 16;
  const int scale_rows = (group_size == 0 || group_size >= block_k) ? 1 : block_k / group_size;
  const int a_bytes = block_m() * block_k * operand_bytes;
  const int b_bytes = warps_n * k_blocks * 32 * bits * 4;
  const int s_bytes = scale_rows * block_n() * 4 * (stored_zeros ? 2 : 1);
  const int pipeline = (a_bytes + b_bytes + s_bytes) * stages;
  const int reduce = (warps_k - 1) * warps_m * warps_n * 32 * m_tiles * 8 * 4 * 4;
  return std::max(pipeline, reduce);
}

std::optional<std::string> DenseGemmConfig::unsupported_reason(std::int64_t m,
                                                               const layout::MmaWeight& weight,
                                                               const Format& activation,
                                                               const GpuLimits& gpu) const {
  // bf16 tensor-core operands (mma.sync .bf16, cuBLAS bf16 GEMMs) start with SM80.
  if (activation == formats::bf16 && gpu.arch == jit::Arch::sm_75)
    return std::string("bf16 activations need SM80 or later (sm_75 serves fp16)");
  const bool byte_activation = activation.storage_bytes() == 1;
  if (byte_activation != (operand_bytes == 1))
    return fmt::format("{} activations need a config of {}-bit operands", activation.name(),
                       activation.storage_bytes() * 8);
  if (kernel == DenseKernel::DequantCublas) return std::nullopt;  // every M, every weight
  const int group_size = weight.group_size;
  if (operand_bytes == 1) {
    // Compiled for SM90 and SM100, mma.sync on e4m3 becomes a conversion to f16 in registers
    // and two f16 mma (SASS: HMMA.16816, no QMMA): no faster than the 16-bit operand, which
    // holds e4m3 exactly. Their fp8 tensor cores are wgmma's / tcgen05's (the Hopper path).
    if (activation == formats::e4m3 && gpu.arch != jit::Arch::sm_89 &&
        gpu.arch != jit::Arch::sm_120a)
      return fmt::format("e4m3 mma.sync is native on SM89 and SM120 only, not {}",
                         jit::arch_name(gpu.arch));
    if (gpu.arch < jit::Arch::sm_80) return std::string("8-bit mma.sync needs SM80 or later");
    if (group_size % 32 != 0)
      return fmt::format("weight groups of {} are not whole 32-wide mma steps", group_size);
    std::string why;
    if (!layout::byte_dequant(weight, activation, &why)) return why;
  }
  if (group_size != 0 && group_size % block_k != 0 && block_k % group_size != 0)
    return fmt::format("group {} neither divides nor is a multiple of BK {}", group_size, block_k);
  const int rows =
      kernel == DenseKernel::Streamed ? streamed_rows(std::min<std::int64_t>(m, 16)) : block_m();
  if (const int bytes = shared_bytes(weight, rows); bytes > gpu.shared_per_block)
    return fmt::format("needs {} bytes of shared memory (this GPU allows {} per block)", bytes,
                       gpu.shared_per_block);
  if (kernel == DenseKernel::Streamed) {
    if (m > 16) return fmt::format("M = {} exceeds the 16 rows of the streamed kernel", m);
    std::string why;
    if (!layout::unscaled_dequant(weight, activation, &why))
      return fmt::format("no unscaled dequantization: {}", why);
  }
  return std::nullopt;
}

const std::vector<DenseGemmConfig>& dense_gemm_configs() {
  using K = DenseKernel;
  static const std::vector<DenseGemmConfig> configs = {
      // M <= 16, streamed: 4 warps per block, each with 3 stages of 128 K (2 in flight).
      {"decode", K::Streamed, 1, 1, 1, 4, 128, 3, 4},
      // Candidates for the bench: shorter stages (finer K splits, more warps), a deeper ring,
      // 8-warp blocks.
      {"decode-k64", K::Streamed, 1, 1, 1, 4, 64, 4, 5},
      {"decode-s4", K::Streamed, 1, 1, 1, 4, 128, 4, 3},
      {"decode-w8", K::Streamed, 1, 1, 1, 8, 128, 3, 2},
      // M <= 16 on the tiled kernel (weights the streamed one cannot serve): one m16 tile, four
      // warps splitting K inside the block.
      {"decode-tiled", K::Tiled, 1, 1, 1, 4, 256, 4, 3},
      // Up to 128 rows: 64x128 tiles.
      {"medium", K::Tiled, 2, 2, 2, 1, 64, 4, 2},
      // Prefill: 128x128 tiles, 64x64 per warp (dequantized B reused over 4 m16 tiles).
      {"prefill", K::Tiled, 4, 2, 2, 1, 64, 4, 1},
      // Prefill candidates with 8 warps per SM (v2 ran 4: one 128-thread block, register
      // bound): 128x256 and 256x128 tiles.
      {"prefill-n256", K::Tiled, 4, 2, 4, 1, 64, 4, 1},
      {"prefill-m256", K::Tiled, 4, 4, 2, 1, 64, 3, 1},
      // 8-bit activations (int8, e4m3 codes; mma.m16n8k32), M > 16: 64x128 and 128x128 tiles
      // of 32x64 per warp, one K warp (the unscaled group sums double the accumulators: ~220
      // registers), and 32x128 tiles of 16x64 per warp for the bench and tuner (~150).
      {"medium-a8", K::Tiled, 2, 2, 2, 1, 128, 4, 2, 1},
      {"medium-a8-m32", K::Tiled, 1, 2, 2, 1, 128, 4, 2, 1},
      {"prefill-a8", K::Tiled, 2, 4, 2, 1, 128, 3, 1, 1},
      // Dequantize + cuBLAS: M > 256 (see plan_dense_gemm), and the last resort.
      {"dequant-cublas", K::DequantCublas, 1, 1, 1, 1, 0, 0, 1},
  };
  return configs;
}

namespace {

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

DensePlan plan_dense_gemm(std::int64_t m, const layout::MmaWeight& weight, const Format& activation,
                          const GpuLimits& gpu, std::string_view forced) {
  const auto& configs = dense_gemm_configs();
  const DenseGemmConfig* chosen = nullptr;
  if (!forced.empty()) {
    for (const auto& config : configs)
      if (config.name == forced) chosen = &config;
    if (!chosen)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("dense gemm: config '{}' is not a tile config", forced));
    if (auto reason = chosen->unsupported_reason(m, weight, activation, gpu))
      throw Error(ErrorCode::Unsupported,
                  fmt::format("dense gemm: config '{}' cannot serve: {}", forced, *reason));
  } else if (m <= 16) {
    // Decode: the streamed config with the most resident warps for this weight and M (stage
    // bytes grow with the code width and A rows), the first on ties; else the tiled one.
    int best_warps = 0;
    std::string refused;
    for (const auto& config : configs) {
      if (config.name.rfind("decode", 0) != 0) continue;
      if (auto reason = config.unsupported_reason(m, weight, activation, gpu)) {
        log(LogLevel::Debug, "dense gemm: config {} skipped: {}", config.name, *reason);
        if (refused.empty()) refused = config.name + ": " + *reason;
        continue;
      }
      const int rows = config.kernel == DenseKernel::Streamed ? streamed_rows(m) : 16;
      const int warps = config.kernel == DenseKernel::Streamed
                            ? resident_blocks(config, weight, rows, gpu) * config.warps_k
                            : 0;  // the tiled decode config only when nothing streams
      if (!chosen || warps > best_warps) chosen = &config, best_warps = warps;
    }
    if (chosen && chosen->kernel != DenseKernel::Streamed)
      log(LogLevel::Info, "dense gemm: M = {} falls back to the tiled kernel ({})", m, refused);
  } else {
    // Large M is bound by tensor cores, where the tiled mma.sync kernel reaches ~35 % of cuBLAS
    // BF16 on the H200 (M = 4096, 8192²: 2.06 ms against 0.67 ms; bench/NOTES.md), while
    // dequantizing the weight is one pass writing 2 bytes per weight (8192²: ~0.08 ms), so
    // dequant + cuBLAS runs at ~89 % of cuBLAS there. Measured crossover (8192²): M = 64 tiled
    // 80 µs vs 140 µs, M = 256 tiled 192 µs vs 157 µs; below it the weight read dominates and
    // the fused kernels, which read it once at its packed width, win.
    const bool bytes = activation.storage_bytes() == 1;
    const std::string wanted =
        bytes ? (m <= 128 ? "medium-a8" : "prefill-a8") : (m <= 128 ? "medium" : "dequant-cublas");
    for (const auto& config : configs)
      if (config.name == wanted && !config.unsupported_reason(m, weight, activation, gpu))
        chosen = &config;
  }
  // Any config that serves (dequant + cuBLAS, last, always does).
  for (const auto& config : configs) {
    if (chosen) break;
    if (!config.unsupported_reason(m, weight, activation, gpu)) {
      chosen = &config;
      log(LogLevel::Info, "dense gemm: M = {} with weight groups of {} falls back to config {}", m,
          weight.group_size, config.name);
    }
  }
  if (!chosen) {
    // Dequant + cuBLAS serves every weight; what refuses it refuses the call.
    const auto last_resort = configs.back().unsupported_reason(m, weight, activation, gpu);
    throw Error(ErrorCode::Unsupported,
                fmt::format("dense gemm: no config serves M = {} with weight groups of {}{}", m,
                            weight.group_size, last_resort ? ": " + *last_resort : ""));
  }
  DensePlan plan;
  plan.config = *chosen;
  const auto& c = plan.config;
  if (c.kernel == DenseKernel::DequantCublas) {
    // Chunks of whole 64-row slices that keep the 16-bit weight chunk under 64 MiB and, where
    // C needs fp32 sums first, those under 128 MiB: bounded scratch, and each cuBLAS call still
    // a large GEMM (8192 rows of a K = 4096 weight).
    constexpr std::int64_t kWeightBytes = std::int64_t{64} << 20,
                           kSumBytes = std::int64_t{128} << 20;
    const std::int64_t by_weight = kWeightBytes / (2 * weight.k);
    const std::int64_t by_sums = kSumBytes / (4 * m);
    plan.chunk_n =
        std::clamp<std::int64_t>(std::min(by_weight, by_sums) / 64 * 64, 64, weight.n_padded);
    plan.rows = 0;
    return plan;
  }
  const std::int64_t slices = weight.n_padded / 64;
  plan.rows = c.kernel == DenseKernel::Streamed ? streamed_rows(m) : c.block_m();
  const std::int64_t resident =
      static_cast<std::int64_t>(gpu.sm_count) * resident_blocks(c, weight, plan.rows, gpu);

  if (c.kernel == DenseKernel::Streamed) {
    // Each warp takes a whole number of stages; a split is a block of warps_k warps per slice.
    const int stage_blocks = c.block_k / 16;
    const auto k_blocks = weight.k_blocks;
    auto per_warp = [&](int s) {
      const std::int64_t warps = static_cast<std::int64_t>(s) * c.warps_k;
      const std::int64_t blocks = (k_blocks + warps - 1) / warps;
      return (blocks + stage_blocks - 1) / stage_blocks * stage_blocks;
    };
    auto real_splits = [&](int s) {
      return (k_blocks + per_warp(s) * c.warps_k - 1) / (per_warp(s) * c.warps_k);
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
    plan.blocks_per_warp = static_cast<int>(per_warp(splits));
    plan.splits = static_cast<int>(real_splits(splits));
    plan.grid_x = static_cast<unsigned>(slices);
    plan.grid_y = 1;
    plan.k_tiles = static_cast<int>(k_blocks);
    plan.tiles_per_split = plan.blocks_per_warp * c.warps_k;
    return plan;
  }

  plan.grid_x = static_cast<unsigned>((slices + c.warps_n - 1) / c.warps_n);
  plan.grid_y = static_cast<unsigned>((m + c.block_m() - 1) / c.block_m());
  plan.k_tiles = static_cast<int>((weight.k_blocks * 16 + c.block_k - 1) / c.block_k);
  // Keep at least two K tiles per split so that each one still pipelines.
  const std::int64_t tiles = static_cast<std::int64_t>(plan.grid_x) * plan.grid_y;
  const int splits = wave_filling_splits(resident, 8, [&](int s) -> std::int64_t {
    if (s > 1 && plan.k_tiles / s < 2) return 0;
    return tiles * s;
  });
  plan.tiles_per_split = (plan.k_tiles + splits - 1) / splits;
  plan.splits = (plan.k_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split;
  return plan;
}

jit::KernelSpec dense_gemm_spec(const DensePlan& plan, const layout::MmaWeight& weight,
                                const Format& activation, const Format& output, jit::Arch arch) {
  const auto& c = plan.config;
  jit::KernelSpec spec;
  spec.arch = arch;
  if (c.kernel == DenseKernel::DequantCublas) return jit::mma_dequantize_spec(weight, activation, arch);
  if (c.kernel == DenseKernel::Streamed) {
    const auto dequant = layout::unscaled_dequant(weight, activation);
    if (!dequant)
      throw Error(ErrorCode::Internal, "dense gemm: streamed config without an unscaled dequant");
    spec.family = "dense_decode_sm80";
    spec.params = {
        jit::SpecParam::integer("rows", plan.rows),
        jit::SpecParam::integer("warps", c.warps_k),
        jit::SpecParam::integer("stage_blocks", c.block_k / 16),
        jit::SpecParam::integer("stages", c.stages),
        jit::SpecParam::number_format("weight", weight.format),
        jit::SpecParam::chosen("zero", layout::mma_zero_mode_name(weight.zero_mode)),
        jit::SpecParam::integer("group", weight.group_size),
        jit::SpecParam::chosen("act", activation.name()),
        jit::SpecParam::chosen("out", output.name()),
        jit::SpecParam::boolean("split_k", plan.splits > 1),
        jit::SpecParam::chosen("dequant", *dequant),
        jit::SpecParam::integer("min_blocks", target_blocks(c, plan.rows)),
    };
  } else {
    std::string dequant;
    if (c.operand_bytes == 1) {
      const auto bytes = layout::byte_dequant(weight, activation);
      if (!bytes)
        throw Error(ErrorCode::Internal, "dense gemm: 8-bit config without a byte dequant");
      dequant = *bytes;
    } else {
      dequant = layout::packed16_dequant_applies(weight, activation) ? "packed16" : "fp32";
    }
    spec.family = "dense_gemm_sm80";
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
        jit::SpecParam::chosen("dequant", dequant),
        jit::SpecParam::integer("min_blocks", c.blocks_per_sm),
    };
  }
  spec.launch.threads_per_block = c.threads();
  spec.launch.dynamic_smem_bytes = c.shared_bytes(weight, plan.rows);
  return spec;
}

Format dense_operand(std::int64_t m, const layout::MmaWeight& weight, const ActivationQuant& quant,
                     const Format& operand16, const GpuLimits& gpu, std::string_view forced) {
  const bool byte_codes = jit::codes_are_operand8(quant);
  if (!forced.empty()) {
    for (const auto& config : dense_gemm_configs())
      if (config.name == forced && config.operand_bytes == 1 && byte_codes) return quant.format;
    return operand16;  // plan_dense_gemm refuses a forced 8-bit config here, by name
  }
  if (!byte_codes) return operand16;
  // M <= 16 streams the weight (the decode kernel), where the operand's width does not matter.
  // Measured on the H200 (w8a8-int8 8192², µs; bench/NOTES.md): M = 64 medium-a8 75 against 110
  // for the 16-bit medium and 160 for dequant + cuBLAS; M = 256 prefill-a8 121 against 183 for
  // dequant + cuBLAS; M = 1024 dequant + cuBLAS 328 against 458.
  if (m <= 16 || m > 256) return operand16;
  const std::string wanted = m <= 128 ? "medium-a8" : "prefill-a8";
  for (const auto& config : dense_gemm_configs()) {
    if (config.name != wanted) continue;
    if (auto reason = config.unsupported_reason(m, weight, quant.format, gpu)) {
      log(LogLevel::Info, "dense gemm: {} activations take the {} operand ({} cannot serve: {})",
          quant.format.name(), operand16.name(), config.name, *reason);
      return operand16;
    }
  }
  return quant.format;
}

jit::KernelSpec finish_gemm_spec(const Format& output, jit::Arch arch) {
  jit::KernelSpec spec;
  spec.family = "finish_gemm";
  spec.arch = arch;
  spec.params = {jit::SpecParam::chosen("out", output.name())};
  spec.launch.threads_per_block = 256;
  spec.launch.dynamic_smem_bytes = 0;
  return spec;
}

}  // namespace qgemm::dispatch
