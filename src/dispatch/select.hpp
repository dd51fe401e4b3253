// The selector: problem → every candidate → filter (one stated reason per rejection) → rank
// (cost model, or the measured tuning table) → the winner.
//
//   candidate       path          serves
//   decode, ...     mma streamed  M ≤ 16, weights in the mma layout (dispatch/mma_family.hpp)
//   medium, ...     mma tiled     any M, weights in the mma layout, 16-bit or 8-bit operands
//   wgmma-8, ...    SM90 wgmma    any M on sm_90a, weights in the wgmma order, 16-bit operands
//                                 (dispatch/wgmma_family.hpp)
//   qdq             dequantize    every weight: dequantized to 16 bits chunk by chunk of N, then
//                   + cuBLAS      cuBLAS BF16/FP16 (dispatch/qdq_family.hpp)
//   cublaslt-fp8    cuBLASLt FP8  e4m3/e5m2 weights against e4m3/e5m2 activations, with the
//                                 scheme's scales as cuBLASLt scale modes
//
// A selection is pure: it reads the problem, what the weight was prepared as, the GPU's limits
// and measured rates, and the tuning table; it compiles and launches nothing, so `qgemm explain`
// runs it without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/cost_model.hpp"
#include "dispatch/gpu_limits.hpp"
#include "dispatch/mma_family.hpp"
#include "dispatch/tuning_table.hpp"
#include "dispatch/wgmma_family.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/plan.hpp"
#include "runtime/cublaslt.hpp"

namespace qgemm::dispatch {

enum class Path { MmaStreamed, MmaTiled, Wgmma, Qdq, CublasLtFp8 };
const char* path_name(Path path);  // "mma.sync streamed", ..., "cuBLASLt FP8"

struct Candidate {
  std::string name;
  Path path = Path::Qdq;
  const MmaConfig* config = nullptr;         // the mma paths
  const WgmmaConfig* wgmma = nullptr;         // the wgmma path
};
// Every candidate in catalog order: the mma configs, the wgmma configs, then qdq, then
// cublaslt-fp8.
const std::vector<Candidate>& all_candidates();
const Candidate* find_candidate(std::string_view name);  // null when there is none

// What the weight was prepared as (the Engine's prepared weight, or for `qgemm explain` what
// prepare_weight would make of the scheme).
struct WeightFacts {
  WeightQuant quant;
  std::int64_t n = 0, k = 0;
  std::optional<layout::MmaWeight> mma;  // metadata of the mma layout, when prepared
  std::string no_mma;                    // why there is none
  std::optional<layout::MmaWeight> wgmma;  // metadata of the wgmma order, when prepared
  std::string no_wgmma;                    // why there is none
  bool canonical = false;                // the canonical codes and scales are on the device
  // The mode the weight's scales were laid out in for cuBLASLt FP8, when they were.
  std::optional<runtime::Fp8ScaleMode> fp8_weight_mode;
  // Of a scheme alone (`qgemm explain`, and what prepare_weight starts from): the mma layout's
  // metadata with the scale-exactness flags the scale format implies, and the canonical codes
  // with cuBLASLt's scales where cuBLASLt FP8 can multiply the scheme on `arch`.
  static WeightFacts of_scheme(const Scheme& scheme, std::int64_t n, std::int64_t k,
                               jit::Arch arch);
  // The prepared weight in either fragment order, the mma layout first: what the streamed
  // decode GEMM (kernels/gemm/sm80_decode.cuh) reads; nullptr with neither.
  const layout::MmaWeight* either_order() const {
    return mma ? &*mma : (wgmma ? &*wgmma : nullptr);
  }
  // The prepared weight the mma.sync kernel of `path` reads: the streamed one either order
  // (either_order), the tiled one the mma layout; nullptr when it is not prepared.
  const layout::MmaWeight* for_mma_sync(Path path) const {
    return path == Path::MmaStreamed ? either_order() : in_order(layout::FragmentOrder::Mma);
  }
  // The prepared weight in `order` (what an MmaLaunch reads); nullptr when not prepared.
  const layout::MmaWeight* in_order(layout::FragmentOrder order) const {
    const auto& prepared = order == layout::FragmentOrder::Wgmma ? wgmma : mma;
    return prepared ? &*prepared : nullptr;
  }
};

struct Verdict {
  const Candidate* candidate = nullptr;
  std::string rejected;  // empty: the candidate serves
  Format operand;        // the A operand its GEMM takes (16-bit, or 8-bit codes)
  Cost cost;             // predicted, when it serves
};

struct Selection {
  std::int64_t m = 0;  // the M the verdicts were judged at
  std::vector<Verdict> verdicts;  // every candidate, catalog order
  int winner = -1;                // index into verdicts
  double winner_us = 0;           // predicted, or measured when the table chose
  std::string reason;             // why the winner won
  const Verdict& chosen() const { return verdicts.at(static_cast<std::size_t>(winner)); }
};

struct SelectionContext {
  GpuLimits gpu;
  GpuRates rates;
  const TuningTable* table = nullptr;  // an applicable table (this machine's), or null
  std::string forced;                  // a candidate name (benches, the tuner); empty: choose
  // Candidates found unable to serve after selection (cuBLASLt's heuristic had no algorithm),
  // by name, with the reason: rejected with it.
  std::map<std::string, std::string> refused;
};

// The choice for `m` rows of `problem` (m within its range). Error(Unsupported) naming every
// candidate's reason when none serves; Error(InvalidArgument) for a forced name that is not a
// candidate, Error(Unsupported) for one that cannot serve.
Selection select(const GemmProblem& problem, std::int64_t m, const WeightFacts& weight,
                 const SelectionContext& context);

// The M buckets of a problem's range: powers of two (1, 2, 4, ...), each as [low, high]
// clipped to the range.
std::vector<std::pair<std::int64_t, std::int64_t>> m_buckets(const GemmProblem& problem);

// The layouts Engine::prepare_weight keeps for calls of up to `max_rows` rows of `probe` (its
// scheme, N and K; facts: WeightFacts::of_scheme): the mma layout and the wgmma order where the
// selector runs some M on their families (the streamed decode kernel and qdq's dequantization
// read the wgmma order where it is kept: SM90 then holds the weight once, issue #15), the
// canonical codes where the mma layout cannot hold the weight or cuBLASLt FP8 serves some M.
// The selector is asked at the powers of two below max_rows and at max_rows.
struct KeptLayouts {
  bool mma = false, wgmma = false, canonical = false;
};
KeptLayouts kept_layouts(const GemmProblem& probe, const WeightFacts& facts,
                         std::int64_t max_rows, const SelectionContext& context);
// `facts` with only the kept layouts' metadata (each dropped one says why).
WeightFacts keep_layouts(WeightFacts facts, const KeptLayouts& kept);

// Expert weights keep one prepared order (Engine::prepare_experts): `facts` with only `order`'s
// metadata (`meta`: the prepared one's, with the flags of the actual scales; nullopt: the
// scheme's), no canonical codes. `why` says why the other order is absent.
WeightFacts expert_facts(WeightFacts facts, layout::FragmentOrder order,
                         std::optional<layout::MmaWeight> meta, std::string why);

// A grouped (MoE) GEMM of `slots` routed rows as the dense GEMM whose cost it has, which the
// selector ranks: the experts expected to get rows side by side (N times their count, the
// wgmma order's metadata likewise) against the rows one of them is expected to get (m). The
// rules that hold for the grouped GEMM alone still apply (the problem keeps its experts).
struct GroupedView {
  GemmProblem problem;
  WeightFacts weight;
  std::int64_t m = 1;
};
GroupedView grouped_view(const GemmProblem& problem, const WeightFacts& weight, std::int64_t slots);

// {"m": M, "candidates": [{"name", "path", "operand", "rejected" | "predicted_us", "cost":
// {...}}], "winner": {"name", "kernel"?, "predicted_us", "reason"}} (kernel: when the caller
// adds it).
std::string selection_json(const Selection& selection);
// A table: one line per candidate (its verdict), then the winner.
std::string selection_text(const Selection& selection);

}  // namespace qgemm::dispatch
