#include "dispatch/select.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "dispatch/cublaslt_family.hpp"
#include "dispatch/qdq_family.hpp"
#include "jit/catalog.hpp"
#include "qgemm/error.hpp"

namespace qgemm::dispatch {

const char* path_name(Path path) {
  switch (path) {
    case Path::MmaStreamed: return "mma.sync streamed";
    case Path::MmaTiled: return "mma.sync tiled";
    case Path::Wgmma: return "SM90 wgmma";
    case Path::Qdq: return "dequantize + cuBLAS";
    case Path::CublasLtFp8: return "cuBLASLt FP8";
  }
  return "?";
}

const std::vector<Candidate>& all_candidates() {
  static const std::vector<Candidate> candidates = [] {
    std::vector<Candidate> list;
    for (const MmaConfig& config : mma_configs())
      list.push_back({config.name,
                      config.kernel == MmaKernel::Streamed ? Path::MmaStreamed : Path::MmaTiled,
                      &config});
    for (const WgmmaConfig& config : wgmma_configs())
      list.push_back({config.name, Path::Wgmma, nullptr, &config});
    list.push_back({"qdq", Path::Qdq, nullptr});
    list.push_back({"cublaslt-fp8", Path::CublasLtFp8, nullptr});
    return list;
  }();
  return candidates;
}

const Candidate* find_candidate(std::string_view name) {
  for (const Candidate& candidate : all_candidates())
    if (candidate.name == name) return &candidate;
  return nullptr;
}

namespace {

// Whether every value of `scale` a weight's scales take is exact for packed16 in `type` (the
// scale format alone: what `qgemm explain` can know without the scales themselves). Weight
// scales lie in [2^-24, 2^8] (the weight's magnitude over the code's): values beyond, which only
// the widest formats hold, are not judged.
bool scale_format_exact(const Format& scale, const Format& type, int bits) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, int>, bool> verdicts;
  if (scale.bits > 16) return false;
  std::lock_guard lock(mutex);
  auto key = std::make_tuple(scale.name(), type.name(), bits);
  if (auto found = verdicts.find(key); found != verdicts.end()) return found->second;
  bool exact = true;
  for (std::uint32_t code = 0; code < scale.code_count() && exact; ++code) {
    if (!is_valid_code(scale, code)) continue;
    const double value = decode(scale, code);
    if (std::isfinite(value) && value >= std::ldexp(1.0, -24) && value <= 256.0)
      exact = layout::packed16_scale_exact(value, type, bits);
  }
  verdicts.emplace(std::move(key), exact);
  return exact;
}

}  // namespace

WeightFacts WeightFacts::of_scheme(const Scheme& scheme, std::int64_t n, std::int64_t k,
                                   jit::Arch arch) {
  const WeightQuant& quant = scheme.weight;
  WeightFacts facts;
  facts.quant = quant;
  facts.n = n;
  facts.k = k;
  if (auto reason = layout::mma_unsupported_reason(quant)) {
    facts.no_mma = *reason;
    facts.canonical = true;
  } else {
    layout::MmaWeight mma = layout::mma_shape(quant, n, k);
    mma.scales_exact_in_bf16 =
        scale_format_exact(quant.scale_format, formats::bf16, quant.format.bits);
    mma.scales_exact_in_fp16 =
        scale_format_exact(quant.scale_format, formats::fp16, quant.format.bits);
    facts.mma = mma;
    if (arch == jit::Arch::sm_90a) {
      layout::MmaWeight wgmma = layout::mma_shape(quant, n, k, 1.0, layout::FragmentOrder::Wgmma);
      wgmma.scales_exact_in_bf16 = mma.scales_exact_in_bf16;
      wgmma.scales_exact_in_fp16 = mma.scales_exact_in_fp16;
      facts.wgmma = wgmma;
    } else {
      facts.no_wgmma = fmt::format("the wgmma family runs on sm_90a ({} here)", jit::arch_name(arch));
    }
  }
  if (!facts.mma) facts.no_wgmma = facts.no_mma;
  if (const auto modes = cublaslt_modes(scheme)) {
    GemmProblem probe;
    probe.scheme = scheme;
    probe.n = n;
    probe.k = k;
    if (runtime::fp8_matmul_unsupported_reason(cublaslt_shape(probe, 16, *modes, arch)).empty()) {
      facts.canonical = true;
      facts.fp8_weight_mode = modes->weight;
    }
  }
  return facts;
}

KeptLayouts kept_layouts(const GemmProblem& probe_problem, const WeightFacts& facts,
                         std::int64_t max_rows, const SelectionContext& context) {
  KeptLayouts kept;
  kept.mma = facts.mma.has_value();
  kept.canonical = !facts.mma;
  if (!facts.mma || !(facts.canonical || facts.wgmma)) return kept;  // one layout can serve
  if (every_layout_on_every_weight()) return {true, facts.wgmma.has_value(), facts.canonical};
  kept.mma = false;
  bool qdq = false, streamed = false;
  GemmProblem probe = probe_problem;
  std::vector<std::int64_t> probed_rows;
  for (std::int64_t rows = 1; rows < max_rows; rows *= 2) probed_rows.push_back(rows);
  probed_rows.push_back(max_rows);
  for (const std::int64_t rows : probed_rows) {
    probe.m = rows;  // gemm()'s plans are of one exact M
    probe.m_max = 0;
    switch (select(probe, rows, facts, context).chosen().candidate->path) {
      case Path::CublasLtFp8: kept.canonical = true; break;
      case Path::MmaStreamed: streamed = true; break;
      case Path::MmaTiled: kept.mma = true; break;
      case Path::Wgmma: kept.wgmma = true; break;
      case Path::Qdq: qdq = true; break;
    }
  }
  // The streamed decode kernel and qdq's dequantization read either order: where the wgmma
  // order is kept anyway they take it (unless switched off: wgmma_order_readers_ranked).
  const bool readers = kept.wgmma && wgmma_order_readers_ranked();
  if (streamed && !readers) kept.mma = true;
  if (qdq && !kept.canonical && !readers) kept.mma = true;
  if (!kept.mma && !kept.canonical && !kept.wgmma) kept.mma = true;  // qdq alone
  return kept;
}

WeightFacts keep_layouts(WeightFacts facts, const KeptLayouts& kept) {
  if (!kept.canonical) facts.fp8_weight_mode.reset();
  facts.canonical = kept.canonical;
  if (!kept.mma && facts.mma) {
    facts.no_mma =
        "prepared without it (no M would run on it; the decode kernel and qdq read the wgmma "
        "order; QGEMM_WGMMA=1 at prepare_weight keeps every layout)";
    facts.mma.reset();
  }
  if (!kept.wgmma && facts.wgmma) {
    facts.no_wgmma =
        "prepared without it (no M would run on it; QGEMM_WGMMA=1 at prepare_weight keeps every "
        "layout)";
    facts.wgmma.reset();
  }
  return facts;
}

WeightFacts expert_facts(WeightFacts facts, layout::FragmentOrder order,
                         std::optional<layout::MmaWeight> meta, std::string why) {
  const bool wgmma = order == layout::FragmentOrder::Wgmma;
  std::optional<layout::MmaWeight>& kept = wgmma ? facts.wgmma : facts.mma;
  std::optional<layout::MmaWeight>& dropped = wgmma ? facts.mma : facts.wgmma;
  if (meta) kept = std::move(meta);
  dropped.reset();
  (wgmma ? facts.no_mma : facts.no_wgmma) = std::move(why);
  facts.canonical = false;
  facts.fp8_weight_mode.reset();
  return facts;
}

GroupedView grouped_view(const GemmProblem& problem, const WeightFacts& weight,
                         std::int64_t slots) {
  GroupedView view{problem, weight, grouped_rows_per_expert(slots, problem.experts)};
  const std::int64_t active = grouped_active_experts(slots, problem.experts);
  view.problem.n = problem.n * active;
  view.weight.n = view.problem.n;
  if (weight.wgmma) view.weight.wgmma = grouped_equivalent_weight(*weight.wgmma, active);
  if (weight.mma) view.weight.mma = grouped_equivalent_weight(*weight.mma, active);
  return view;
}

std::vector<std::pair<std::int64_t, std::int64_t>> m_buckets(const GemmProblem& problem) {
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets;
  const std::int64_t last = problem.max_rows();
  std::int64_t low = problem.m;
  while (low <= last) {
    const std::int64_t high = std::min(last, m_bucket(low));
    buckets.emplace_back(low, high);
    low = high + 1;
  }
  return buckets;
}

namespace {

double gbps_us(double bytes, double gbps) { return bytes / (gbps * 1e3); }  // µs
double tflops_us(double flops, double tflops) { return flops / (tflops * 1e6); }

// The activation step before the GEMM: what a call must do to A before the candidate's GEMM
// can read it (nothing, quantize on the GPU, expand pre-quantized codes), as bytes moved.
struct ActivationStep {
  bool pass = false;
  double bytes = 0;
};

ActivationStep activation_step(const GemmProblem& p, std::int64_t m, const Format& operand,
                               bool codes_as_they_are) {
  const ActivationQuant& quant = p.scheme.activation;
  if (!quant.is_quantized()) return {};
  const double elements = static_cast<double>(m) * p.k;
  if (codes_as_they_are) {
    // cuBLASLt reads pre-quantized codes as they are; bf16/fp16 input is quantized into codes.
    if (p.prequantized) return {};
    return {true, elements * (p.input.storage_bytes() + 1)};
  }
  const double in = p.prequantized ? quant.format.bits / 8.0 : p.input.storage_bytes();
  return {true, elements * (in + operand.storage_bytes())};
}

double pass_us(const GpuRates& r, double bytes) {
  return r.launch_us + gbps_us(bytes, r.copy_gbps * r.pass_stream);
}

// Bytes of the prepared mma weight: codes, fp32 scales (and zeros) per group row.
double mma_weight_bytes(const layout::MmaWeight& w) {
  const double codes = static_cast<double>(w.n_padded) * w.k_blocks * 16 * w.format.bits / 8.0;
  const double scales = static_cast<double>(w.groups) * w.n_padded * 4 * (w.stores_zeros() ? 2 : 1);
  return codes + scales;
}

// Bytes of the canonical weight (codes at their width, scales in their format).
double canonical_weight_bytes(const WeightQuant& q, std::int64_t n, std::int64_t k) {
  const ScaleGrid grid = weight_scale_grid(q, n, k);
  const double codes = static_cast<double>(n) * ((k * q.format.bits + 7) / 8);
  const double scales = static_cast<double>(grid.count()) * q.scale_format.storage_bytes();
  const double zeros = q.zero_point == ZeroPoint::Integer || q.zero_point == ZeroPoint::Float
                           ? scales
                           : 0.0;
  return codes + scales + zeros;
}

Cost streamed_cost(const GemmProblem& p, std::int64_t m, const MmaLaunch& launch,
                   const layout::MmaWeight& w, const Format& operand, const GpuRates& r) {
  Cost cost;
  cost.fixed_us = r.decode_fixed_us;
  const double bytes = mma_weight_bytes(w) + static_cast<double>(m) * p.k * operand.storage_bytes() +
                       static_cast<double>(m) * p.n * p.scheme.output.storage_bytes();
  cost.memory_us = gbps_us(bytes, r.copy_gbps * r.decode_stream);
  // The kernel multiplies batch tiles of 8 rows (16 from 9 rows on); the rate is the 16-row one.
  const double rows = launch.rows > 8 ? 16 : 8;
  cost.compute_us = tflops_us(2.0 * rows * p.n * p.k, r.decode_tflops_16);
  cost.note = fmt::format("{} rows, {} splits", launch.rows, launch.splits);
  return cost;
}

// The grouped decode kernel judged on the grouped view (the active experts side by side, m
// rows each): a token block of `rows` streams its expert's slice once, so an expert expected to
// get more rows than one block holds is streamed once per block (L2 may serve the repeats; not
// counted); each warp's share of an expert's K streams behind an unhidden first load
// (GpuRates::grouped_decode_ramp_k).
Cost grouped_streamed_cost(const GemmProblem& p, std::int64_t m, const MmaConfig& config,
                           const MmaLaunch& launch, const layout::MmaWeight& w,
                           const Format& operand, const GpuRates& r) {
  Cost cost = streamed_cost(p, m, launch, w, operand, r);
  cost.fixed_us = r.grouped_decode_fixed_us;
  const double blocks_per_expert =
      std::ceil(static_cast<double>(m) / static_cast<double>(launch.rows));
  const double warp_k = 16.0 * static_cast<double>(w.k_blocks) / config.decode.warps;
  const double ramp = (warp_k + r.grouped_decode_ramp_k) / warp_k;
  cost.memory_us *= blocks_per_expert * ramp;
  cost.compute_us *= blocks_per_expert * ramp;
  cost.note = fmt::format(
      "grouped: {} rows a token block, {:.0f} block{} an expert, 1 split, K {:.0f} a warp",
      launch.rows, blocks_per_expert, blocks_per_expert > 1 ? "s" : "", warp_k);
  return cost;
}

Cost tiled_cost(const GemmProblem& p, std::int64_t m, const MmaConfig& config,
                const MmaLaunch& launch, const layout::MmaWeight& w, const Format& operand,
                const GpuRates& r, const GpuLimits& gpu) {
  Cost cost;
  cost.fixed_us = r.tiled_fixed_us;
  const double blocks = static_cast<double>(launch.blocks(config, m));
  const double resident = static_cast<double>(gpu.sm_count) * launch.resident_per_sm;
  // A grid of several waves runs as long as its whole waves (1.1 waves as long as 2); a grid
  // smaller than a wave leaves slots empty, but its blocks run faster for having their SM's
  // issue slots to themselves, so it costs less than its share (the square root, fitted to the
  // N = 640, 2880 and 5760 cases of bench/NOTES.md).
  const double occupancy = blocks >= resident ? blocks / (std::ceil(blocks / resident) * resident)
                                              : std::sqrt(blocks / resident);
  // The pipeline's ramp and the split's epilogue cost about `tiled_ramp_tiles` K tiles per block:
  // short splits pay them often.
  const double tiles = launch.tiles_per_split;
  const double k_efficiency = tiles / (tiles + r.tiled_ramp_tiles);
  // Larger warp tiles reuse each dequantized B fragment over more m16 tiles.
  double rate = r.tiled_tflops_base + r.tiled_tflops_per_m_tile * config.tile.m_tiles;
  if (config.operand_bytes == 1) {
    rate *= r.tiled_bytes_factor;
  } else if (!layout::packed16_dequant_applies(w, operand)) {
    rate *= r.tiled_fp32_factor;
  }
  const double rows = std::ceil(static_cast<double>(m) / config.block_m()) * config.block_m();
  cost.compute_us = tflops_us(2.0 * rows * p.n * p.k, rate * k_efficiency * occupancy);
  double bytes = mma_weight_bytes(w) + static_cast<double>(m) * p.k * operand.storage_bytes() +
                 static_cast<double>(m) * p.n * p.scheme.output.storage_bytes();
  // The tiled kernel's partial sums are [M][N] (gemm/epilogue.cuh).
  bytes += split_partial_bytes(launch.splits, static_cast<double>(m), static_cast<double>(p.n));
  cost.memory_us = gbps_us(bytes, r.copy_gbps * r.tiled_stream * std::min(1.0, blocks / gpu.sm_count));
  cost.note = fmt::format("{:.0f} blocks ({:.0f} % of a wave), {} splits of {} K tiles", blocks,
                          100 * blocks / resident, launch.splits, launch.tiles_per_split);
  return cost;
}

Cost wgmma_cost(const GemmProblem& p, std::int64_t m, const WgmmaConfig& config,
                const WgmmaLaunch& launch, const layout::MmaWeight& w, const Format& operand,
                const GpuRates& r, const GpuLimits& gpu) {
  Cost cost;
  cost.fixed_us = r.wgmma_fixed_us;
  const double units = static_cast<double>(launch.units());
  const double occupancy = units / (std::ceil(units / gpu.sm_count) * gpu.sm_count);
  const double rows = static_cast<double>(launch.m_blocks) * config.block_m();
  // Tensor work on the padded token blocks, and the dequantization (every token block
  // dequantizes the whole weight): measured to add up in the consumers (GpuRates); the stream
  // overlaps them in part (GpuRates::wgmma_unhidden); with transform warps the slower one
  // bounds (predicted).
  const bool transform = config.tile.transform;
  cost.unhidden = transform ? 0.0 : r.wgmma_unhidden;
  // The INT8 tensor cores run at the FP8 rate on Hopper.
  const double tensor_rate = config.tile.eight_bit ? r.wgmma_fp8_tflops : r.wgmma_tflops;
  const double tensor_us = tflops_us(2.0 * rows * p.n * p.k, tensor_rate * occupancy);
  const std::string dequant = wgmma_dequant(w, operand);
  // Promoted scales save the multiply: a quarter of packed16's work per pair.
  const double promoted = wgmma_promotes_scales(config, w, operand) ? 4.0 / 3.0 : 1.0;
  // e4m3 / s8 (eight-bit configs, promoted): 4-bit codes through the PRMT tables about as fast
  // as promoted packed16 (13 against ~14 instructions per 8 codes) with half the wgmma
  // instructions; 8-bit codes pass through one PRMT per 4 (and a LOP3 for int8; predicted;
  // kernels/dequant/wgmma_codes8.cuh).
  const double codes8_factor = w.format.bits == 8 ? r.wgmma_e4m3_bytes_factor : 1.0;
  const double dequant_rate = (transform ? r.wgmma_transform_gelems : r.wgmma_dequant_gelems) *
                              promoted *
                              (dequant == "packed16"  ? 1.0
                               : dequant == "e4m3" || dequant == "s8" ? codes8_factor
                               : dequant == "float16" ? 0.7
                                                      : 0.4);
  const double dequant_us =
      static_cast<double>(launch.m_blocks) * p.n * p.k / (dequant_rate * 1e3 * occupancy);
  cost.compute_us = transform ? std::max(tensor_us, dequant_us) : tensor_us + dequant_us;
  double bytes = mma_weight_bytes(w) + static_cast<double>(m) * p.k * operand.storage_bytes() +
                 static_cast<double>(m) * p.n * p.scheme.output.storage_bytes();
  // The wgmma kernel's partial sums cover the padded tiles (gemm/sm90_wgmma.cuh).
  bytes += split_partial_bytes(launch.splits, rows, static_cast<double>(w.n_padded));
  cost.memory_us = gbps_us(bytes, r.copy_gbps * r.wgmma_stream * std::min(1.0, units / gpu.sm_count));
  cost.note = fmt::format("{:.0f} units on {} SMs ({:.0f} % of the last round), {} splits, {}{}",
                          units, launch.grid, 100 * occupancy, launch.splits, dequant,
                          transform ? " by transform warps" : "");
  return cost;
}

// cuBLAS's tensor-core efficiency at M rows (measured on the H200: ~0.8 of the 8192³ rate at
// M = 256, the full rate from M ≈ 1024).
double cublas_efficiency(std::int64_t m) {
  return std::min(1.0, static_cast<double>(m) / (static_cast<double>(m) + 64.0) + 0.06);
}

// Whether QGEMM_WGMMA_ORDER_READERS=0 keeps `candidate` (the streamed decode kernel, or qdq's
// dequantization) from reading `prepared` because it is the wgmma order; a forced run still
// reads it.
bool wgmma_order_switched_off(const layout::MmaWeight* prepared, const Candidate& candidate,
                              const SelectionContext& context) {
  return prepared && prepared->order == layout::FragmentOrder::Wgmma &&
         !wgmma_order_readers_ranked() && context.forced != candidate.name;
}

}  // namespace

Selection select(const GemmProblem& p, std::int64_t m, const WeightFacts& weight,
                 const SelectionContext& context) {
  const GpuLimits& gpu = context.gpu;
  const GpuRates& r = context.rates;
  const ActivationQuant& quant = p.scheme.activation;
  const bool quantized = quant.is_quantized();
  // The 16-bit operand: A itself, or the value type quantized activations expand into.
  const Format operand16 = quantized ? jit::activation_operand_format(quant) : p.input;

  Selection selection;
  selection.m = m;
  for (const Candidate& candidate : all_candidates()) {
    Verdict v;
    v.candidate = &candidate;
    v.operand = operand16;
    auto reject = [&](std::string why) { v.rejected = std::move(why); };
    if (auto refused = context.refused.find(candidate.name); refused != context.refused.end()) {
      reject(refused->second);
      selection.verdicts.push_back(std::move(v));
      continue;
    }
    if (p.experts > 0 && candidate.path != Path::Wgmma && candidate.path != Path::MmaStreamed) {
      reject(
          "a grouped (MoE) GEMM runs on the wgmma family or the streamed decode kernel (the "
          "others do not read the routing)");
      selection.verdicts.push_back(std::move(v));
      continue;
    }
    switch (candidate.path) {
      case Path::MmaStreamed:
      case Path::MmaTiled: {
        const MmaConfig& config = *candidate.config;
        if (!config.held_back.empty() && context.forced != candidate.name) {
          reject(config.held_back + " (a forced run takes it)");
          break;
        }
        if (config.operand_bytes == 1) {
          if (!quantized || !jit::codes_are_operand8(quant)) {
            reject("8-bit operands are int8/e4m3 activation codes with one scale per row");
            break;
          }
          v.operand = quant.format;
        }
        const layout::MmaWeight* prepared = weight.for_mma_sync(candidate.path);
        if (!prepared) {
          reject("the weight has no mma layout: " + weight.no_mma);
          break;
        }
        if (wgmma_order_switched_off(prepared, candidate, context)) {
          reject(std::string("the weight has no mma layout, and ") + kWgmmaOrderReadersSwitchedOff);
          break;
        }
        if (!quantized && p.a_alignment < 16) {
          reject(fmt::format("A rows are {}-byte aligned; the kernel copies 16-byte pieces",
                             p.a_alignment));
          break;
        }
        if (p.experts > 0) {
          // Grouped: judged on the grouped view (p, m and the weight are the active experts side
          // by side against one expert's rows), at the kernel's token block of 8 or 16 rows.
          if (quantized) {
            reject("the grouped decode kernel takes bf16/fp16 activations");
            break;
          }
          const int rows = grouped_decode_rows(m, p.route_block);
          if (rows == 0) {
            reject(
                fmt::format("the routing block {} is not a multiple of 8 (the grouped decode "
                            "kernel's token block is 8 or 16 rows)",
                            p.route_block));
            break;
          }
          if (auto why = config.unsupported_reason(rows, *prepared, v.operand, gpu)) {
            reject(*why);
            break;
          }
          MmaLaunch launch = mma_launch(config, rows, *prepared, gpu);
          launch.rows = rows;
          launch.splits = 1;
          launch.grouped = true;
          v.cost = grouped_streamed_cost(p, m, config, launch, *prepared, v.operand, r);
          break;
        }
        if (auto why = config.unsupported_reason(m, *prepared, v.operand, gpu)) {
          reject(*why);
          break;
        }
        const MmaLaunch launch = mma_launch(config, m, *prepared, gpu);
        v.cost = candidate.path == Path::MmaStreamed
                     ? streamed_cost(p, m, launch, *prepared, v.operand, r)
                     : tiled_cost(p, m, config, launch, *prepared, v.operand, r, gpu);
        const ActivationStep step = activation_step(p, m, v.operand, false);
        if (step.pass) v.cost.passes_us += pass_us(r, step.bytes);
        break;
      }
      case Path::Wgmma: {
        const WgmmaConfig& config = *candidate.wgmma;
        if (!wgmma_ranked_by_default() && context.forced != candidate.name) {
          reject(kWgmmaSwitchedOff);
          break;
        }
        if (!config.held_back.empty() && context.forced != candidate.name &&
            !(config.tile.eight_bit && wgmma_fp8_ranked())) {
          reject(config.held_back + " (a forced run takes it)");
          break;
        }
        if (!weight.wgmma) {
          reject("the weight has no wgmma order: " + weight.no_wgmma);
          break;
        }
        if (config.tile.eight_bit) {
          if (p.experts > 0) {
            // Grouped: the routed rows are quantized after the gather (run_in's prep), which
            // gives each row the codes of its token only for scales of a row's own (per token,
            // per 1x128 group): a tensor absmax would see the capacity's unrouted rows.
            if (quant.scaling != ActivationScaling::DynamicToken &&
                quant.scaling != ActivationScaling::DynamicGroup) {
              reject(
                  "grouped (MoE) 8-bit tiles take activations scaled per token or per group "
                  "(their rows are quantized after the gather)");
              break;
            }
            if (context.forced != candidate.name) {
              reject(
                  "the grouped 8-bit tiles are not yet measured on a GPU (issue #17; a "
                  "forced run takes them)");
              break;
            }
          }
          // The activation quantizer's codes are the operand as they are (in the 8-bit mma's K
          // order): e4m3 or int8 with one scale per row, applied in the epilogue, or e4m3 per
          // 1x128 group, promoted in the loop (wgmma_codes8_activation_unsupported).
          if (auto why =
                  wgmma_codes8_activation_unsupported(quant, *weight.wgmma, config.codes())) {
            reject(*why);
            break;
          }
          v.operand = quant.format;
        }
        if (!quantized && p.a_alignment < 16) {
          reject(fmt::format("A rows are {}-byte aligned; TMA needs 16 bytes", p.a_alignment));
          break;
        }
        if (auto why = config.unsupported_reason(m, *weight.wgmma, v.operand, gpu)) {
          reject(*why);
          break;
        }
        if (p.route_block > 0 && p.route_block % config.block_m() != 0) {
          reject(fmt::format("the routing block {} is not a multiple of its {}-token tile",
                             p.route_block, config.block_m()));
          break;
        }
        const WgmmaLaunch launch = wgmma_launch(config, m, *weight.wgmma, v.operand, gpu);
        v.cost = wgmma_cost(p, m, config, launch, *weight.wgmma, v.operand, r, gpu);
        const ActivationStep step = activation_step(p, m, v.operand, false);
        if (step.pass) v.cost.passes_us += pass_us(r, step.bytes);
        break;
      }
      case Path::Qdq: {
        v.operand = qdq_operand(p);
        if (v.operand == formats::bf16 && gpu.arch < jit::Arch::sm_80) {
          reject("bf16 GEMMs need SM80 or later");
          break;
        }
        // The mma layout, the canonical codes, or the wgmma order (qdq_prepared_weight).
        const layout::MmaWeight* prepared = qdq_prepared_weight(weight);
        if (!prepared && !weight.canonical) {
          reject("the weight has neither a prepared layout nor its canonical codes on the device");
          break;
        }
        if (wgmma_order_switched_off(prepared, candidate, context)) {
          reject(std::string("the weight has neither the mma layout nor its canonical codes, "
                             "and ") +
                 kWgmmaOrderReadersSwitchedOff);
          break;
        }
        const QdqLaunch launch = qdq_launch(p, m, weight);
        const double stored = prepared ? mma_weight_bytes(*prepared)
                                       : canonical_weight_bytes(weight.quant, p.n, p.k);
        const double wide = 2.0 * p.n * p.k;  // the 16-bit weight
        v.cost.passes_us = launch.chunks * r.launch_us +
                           gbps_us(stored + wide, r.copy_gbps * r.dequant_stream);
        v.cost.fixed_us = launch.chunks * r.cublas_fixed_us;
        v.cost.memory_us = gbps_us(wide, r.copy_gbps * r.cublas_stream);
        v.cost.compute_us =
            tflops_us(2.0 * m * p.n * p.k, r.bf16_tflops * cublas_efficiency(m));
        if (launch.finish)
          v.cost.passes_us +=
              pass_us(r, static_cast<double>(m) * p.n * (8 + p.scheme.output.storage_bytes()));
        const ActivationStep step = activation_step(p, m, v.operand, false);
        if (step.pass) v.cost.passes_us += pass_us(r, step.bytes);
        v.cost.note = fmt::format("{} chunk{} of {} rows{}", launch.chunks,
                                  launch.chunks > 1 ? "s" : "", launch.chunk_n,
                                  launch.finish ? ", fp32 sums + finish" : "");
        break;
      }
      case Path::CublasLtFp8: {
        const std::string why = cublaslt_unsupported_reason(p, m, weight, gpu.arch);
        if (!why.empty()) {
          reject(why);
          break;
        }
        v.operand = quant.format;
        const runtime::Fp8ScaleModes modes = *cublaslt_modes(p.scheme);
        v.cost.fixed_us = r.fp8_fixed_us;
        const double bytes = static_cast<double>(p.n) * p.k + static_cast<double>(m) * p.k +
                             static_cast<double>(m) * p.n * p.scheme.output.storage_bytes();
        v.cost.memory_us = gbps_us(bytes, r.copy_gbps * r.fp8_stream);
        v.cost.compute_us = tflops_us(2.0 * m * p.n * p.k, r.fp8_tflops);
        double slowdown = 1.0;
        if (modes.activation == runtime::Fp8ScaleMode::OuterVector && m <= 64)
          slowdown = r.fp8_outer_small_m;
        if (modes.activation == runtime::Fp8ScaleMode::Block1x128) slowdown = r.fp8_block;
        v.cost.memory_us *= slowdown;
        v.cost.compute_us *= slowdown;
        const ActivationStep step = activation_step(p, m, v.operand, true);
        if (step.pass) v.cost.passes_us += pass_us(r, step.bytes);
        v.cost.note = fmt::format("scales {} x {}", runtime::fp8_scale_mode_name(modes.activation),
                                  runtime::fp8_scale_mode_name(modes.weight));
        break;
      }
    }
    if (v.rejected.empty())
      v.cost.total_us = v.cost.fixed_us + std::max(v.cost.memory_us, v.cost.compute_us) +
                        v.cost.unhidden * std::min(v.cost.memory_us, v.cost.compute_us) +
                        v.cost.passes_us;
    selection.verdicts.push_back(std::move(v));
  }

  auto index_of = [&](std::string_view name) {
    for (std::size_t i = 0; i < selection.verdicts.size(); ++i)
      if (selection.verdicts[i].candidate->name == name) return static_cast<int>(i);
    return -1;
  };
  if (!context.forced.empty()) {
    const int forced = index_of(context.forced);
    if (forced < 0) {
      std::string names;
      for (const Candidate& c : all_candidates()) names += (names.empty() ? "" : ", ") + c.name;
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("gemm: '{}' is not a candidate (candidates: {})", context.forced,
                              names));
    }
    const Verdict& v = selection.verdicts[static_cast<std::size_t>(forced)];
    if (!v.rejected.empty())
      throw Error(ErrorCode::Unsupported, fmt::format("gemm: candidate '{}' cannot serve M = {}: {}",
                                                      context.forced, m, v.rejected));
    selection.winner = forced;
    selection.winner_us = v.cost.total_us;
    selection.reason = "forced by the caller";
    return selection;
  }

  // The model's ranking: the lowest predicted time.
  int best = -1, second = -1;
  for (std::size_t i = 0; i < selection.verdicts.size(); ++i) {
    const Verdict& v = selection.verdicts[i];
    if (!v.rejected.empty()) continue;
    const int index = static_cast<int>(i);
    if (best < 0 || v.cost.total_us < selection.verdicts[static_cast<std::size_t>(best)].cost.total_us) {
      second = best;
      best = index;
    } else if (second < 0 ||
               v.cost.total_us < selection.verdicts[static_cast<std::size_t>(second)].cost.total_us) {
      second = index;
    }
  }
  if (best < 0) {
    std::string reasons;
    for (const Verdict& v : selection.verdicts)
      reasons += fmt::format("\n  {}: {}", v.candidate->name, v.rejected);
    throw Error(ErrorCode::Unsupported,
                fmt::format("gemm: nothing serves M = {} N = {} K = {} of scheme {}:{}", m, p.n,
                            p.k, to_string(p.scheme), reasons));
  }
  selection.winner = best;
  selection.winner_us = selection.verdicts[static_cast<std::size_t>(best)].cost.total_us;
  selection.reason =
      second < 0 ? fmt::format("the only candidate that serves ({:.1f} µs predicted)",
                               selection.winner_us)
                 : fmt::format("lowest predicted time, {:.1f} µs (next: {} {:.1f} µs)",
                               selection.winner_us,
                               selection.verdicts[static_cast<std::size_t>(second)].candidate->name,
                               selection.verdicts[static_cast<std::size_t>(second)].cost.total_us);

  // A measured table overrides the model where it has an entry whose winner serves.
  if (context.table) {
    Scheme key_scheme = p.scheme;
    key_scheme.name.clear();
    if (const TuningEntry* entry = context.table->find(to_string(key_scheme), p.n, p.k, m)) {
      const int tuned = index_of(entry->config);
      if (tuned < 0) {
        log(LogLevel::Info, "tuning table: '{}' (N={} K={} M bucket {}) is not a candidate of this "
            "build; the cost model chooses", entry->config, p.n, p.k, entry->key.m_bucket);
      } else if (const Verdict& v = selection.verdicts[static_cast<std::size_t>(tuned)];
                 !v.rejected.empty()) {
        log(LogLevel::Info, "tuning table: '{}' cannot serve M = {}: {}; the cost model chooses",
            entry->config, m, v.rejected);
      } else {
        selection.winner = tuned;
        selection.winner_us = entry->microseconds;
        selection.reason = fmt::format("tuning table: measured {:.1f} µs at M bucket {}",
                                       entry->microseconds, entry->key.m_bucket);
      }
    }
  }
  return selection;
}

std::string selection_json(const Selection& selection) {
  nlohmann::ordered_json out;
  out["m"] = selection.m;
  nlohmann::ordered_json candidates = nlohmann::ordered_json::array();
  for (const Verdict& v : selection.verdicts) {
    nlohmann::ordered_json c;
    c["name"] = v.candidate->name;
    c["path"] = path_name(v.candidate->path);
    if (!v.rejected.empty()) {
      c["rejected"] = v.rejected;
    } else {
      c["operand"] = v.operand.name();
      c["predicted_us"] = v.cost.total_us;
      c["cost"] = {{"fixed_us", v.cost.fixed_us},
                   {"memory_us", v.cost.memory_us},
                   {"compute_us", v.cost.compute_us},
                   {"unhidden", v.cost.unhidden},
                   {"passes_us", v.cost.passes_us},
                   {"note", v.cost.note}};
    }
    candidates.push_back(std::move(c));
  }
  out["candidates"] = std::move(candidates);
  const Verdict& winner = selection.chosen();
  out["winner"] = {{"name", winner.candidate->name},
                   {"path", path_name(winner.candidate->path)},
                   {"predicted_us", selection.winner_us},
                   {"reason", selection.reason}};
  return out.dump(2);
}

std::string selection_text(const Selection& selection) {
  std::string text = fmt::format("M = {}\n", selection.m);
  for (std::size_t i = 0; i < selection.verdicts.size(); ++i) {
    const Verdict& v = selection.verdicts[i];
    const char* mark = static_cast<int>(i) == selection.winner ? "*" : " ";
    if (v.rejected.empty()) {
      const std::string overlap =
          v.cost.unhidden == 0 ? "max" : fmt::format("max+{:.2f}min", v.cost.unhidden);
      text += fmt::format(" {} {:<14} {:>9.1f} µs  {} operand; fixed {:.1f} + {}(memory {:.1f}, "
                          "compute {:.1f}) + passes {:.1f}; {}\n",
                          mark, v.candidate->name, v.cost.total_us, v.operand.name(),
                          v.cost.fixed_us, overlap, v.cost.memory_us, v.cost.compute_us,
                          v.cost.passes_us, v.cost.note);
    } else {
      text += fmt::format(" {} {:<14} rejected: {}\n", mark, v.candidate->name, v.rejected);
    }
  }
  text += fmt::format("winner: {} ({})\n", selection.chosen().candidate->name, selection.reason);
  return text;
}

}  // namespace qgemm::dispatch
