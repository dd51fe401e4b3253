// The result document of `qgemm bench`: what was measured, on which machine and versions, and
// the figures derived from the measurements. The CLI fills it from GPU timings, the tests from
// synthetic ones; both write it through the functions here, so the schema the tests check is the
// one the CLI writes, and bench/plot.py reads.
//
// JSON (to_json_text):
//   {"format": "qgemm-bench", "format_version": 1,
//    "recipe": {"name", "source", "timing", "repeats", "warmup", "backends": [...]},
//    "seed": u64, "tuning_table": path or null, "started_at": "YYYY-MM-DDTHH:MM:SSZ",
//    "elapsed_s": x,
//    "machine": {"gpu", "compute_capability", "sm_count", "sm_clock_mhz", "memory_clock_mhz",
//                "memory_bus_bits", "l2_bytes", "memory_bytes", "cuda_runtime", "cuda_driver",
//                "driver", "nvrtc", "cublas", "qgemm", "host_cpu"},
//    "peaks": {"copy_gbps", "copy_bytes", "bf16_tflops", "fp8_tflops", "gemm_size",
//              "problems": [text, ...]},                        (a peak that failed is null)
//    "runs": [{"case", "label", "scheme" (as written), "scheme_text" (canonical), "kind",
//              "m", "n", "k", "experts", "top_k" (MoE; null for dense), "backend", "status": ok|unsupported|failed|skipped, "reason",
//              "kernel", "us": {"median", "min", "max", "samples"}, "tflops", "weight_gbps",
//              "memory_gbps", "flops", "min_bytes", "arithmetic_intensity",
//              "share": {"copy_bandwidth", "bf16_peak", "fp8_peak"},
//              "speedup_vs_cublas_bf16", "vs_alternative", "alternative",
//              "dequant_us", "dequant_tbps", "paired_ratios": {backend: ratio},
//              "error": {"rel_frobenius", "tolerance", "rows", "cols"},
//              "first_call_ms", "warm_call_ms", "weight_bytes", "weight_device_bytes",
//              "activation_seed"}, ...]}
// Figures that do not exist for a run (times of a run that was not timed, a share of a peak
// that failed) are null, never 0 or NaN.
//
// Definitions (derive()):
//   tflops          flops / median; flops = 2·M·N·K (MoE: 2·M·top_k·N·K, each of M tokens
//                   through top_k experts of N x K)
//   weight_gbps     weight_bytes / median: the bytes of the weight as this backend stores it
//                   (qgemm, qdq: the canonical codes + scales + zeros; cublas-bf16: 2·N·K;
//                   cuBLASLt FP8: N·K + its scale)
//   min_bytes       weight_bytes + activation_bytes + output_bytes: what one call must move at
//                   least; memory_gbps = min_bytes / median
//   share           memory_gbps / peaks.copy_gbps, tflops / peaks.bf16_tflops and
//                   / peaks.fp8_tflops
//   speedup_vs_cublas_bf16   the cublas-bf16 median of the same case and M / this median
//   vs_alternative  (qgemm runs) the largest ratio of qgemm's time to an alternative's of the
//                   same case and M (timed in turns, paired_ratios, where they were; else the
//                   ratio of their medians), each taking the same input: qdq (the Engine's
//                   dequantize + cuBLAS candidate on the same call) against qgemm, and, where
//                   the weight is stored as an 8-bit float, cublaslt-fp8 (what a user of such a
//                   checkpoint runs without qgemm, on activations quantized beforehand) against
//                   qgemm-codes where that ran (else qgemm); "alternative" names the worst. The
//                   gate (`qgemm bench --gate RATIO`) fails a run whose vs_alternative > RATIO.
//   dequant_us      (qdq runs) the median of the dequantization alone, over the whole weight
//                   (Engine::dequantize); dequant_tbps = (weight_bytes, the canonical codes
//                   and scales it reads at least, + the 16-bit weight's 2·N·K it writes) /
//                   dequant_us
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/recipe.hpp"

namespace qgemm::bench {

struct MachineInfo {
  std::string gpu;
  std::string compute_capability;  // "9.0"
  int sm_count = 0;
  double sm_clock_mhz = 0;      // the device's rated maximum (cudaDevAttrClockRate)
  double memory_clock_mhz = 0;  // rated memory clock
  int memory_bus_bits = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t memory_bytes = 0;
  std::string cuda_runtime;  // "13.0" (the CUDA runtime the CLI runs against)
  std::string cuda_driver;   // "13.0" (the CUDA version the driver supports)
  std::string driver;        // the driver release, "580.65.06"
  std::string nvrtc;
  std::string cublas;  // "13.0.2"
  std::string qgemm;
  std::string host_cpu;
};

// The rates this machine reaches in the same run, the denominators of the shares.
struct PeakRates {
  std::optional<double> copy_gbps;    // device-to-device copy, (read + write bytes) / time
  std::optional<double> bf16_tflops;  // cuBLAS BF16 on gemm_size³
  std::optional<double> fp8_tflops;   // cuBLASLt e4m3 (fast accumulation) on gemm_size³
  std::int64_t copy_bytes = 0;        // bytes copied per timed copy
  std::int64_t gemm_size = 0;
  std::vector<std::string> problems;  // why a peak is missing
};

enum class RunStatus { Ok, Unsupported, Failed, Skipped };
std::string to_string(RunStatus status);  // "ok" "unsupported" "failed" "skipped"

struct TimingStats {
  double median_us = 0, min_us = 0, max_us = 0;
  int samples = 0;
};
// Error(InvalidArgument) when `samples_us` is empty or holds a value that is not finite and > 0
// (a timer that returned garbage must not become a median).
TimingStats summarize(std::vector<double> samples_us);

struct RunResult {
  std::size_t case_index = 0;
  std::string label, scheme, scheme_text;
  CaseKind kind = CaseKind::Dense;
  std::int64_t m = 0, n = 0, k = 0;
  int experts = 0, top_k = 0;  // MoE: the case's experts, and the experts each token goes to
  Backend backend = Backend::Qgemm;
  RunStatus status = RunStatus::Skipped;
  std::string reason;  // why not ok (empty when ok)
  std::string kernel;  // what ran (a qgemm kernel spec, a cuBLAS call); empty when unknown
  std::optional<TimingStats> time;
  std::optional<double> error, tolerance;       // relative Frobenius error against the reference
  std::int64_t error_rows = 0, error_cols = 0;  // the output block the error was measured on
  std::optional<double> first_call_ms, warm_call_ms;  // host wall time incl. synchronization
  std::int64_t weight_bytes = 0;                      // see the definitions above
  std::optional<std::int64_t> weight_device_bytes;    // the prepared weight's device memory
  std::int64_t activation_bytes = 0, output_bytes = 0;
  std::uint64_t activation_seed = 0;
  std::optional<double> dequant_us;  // qdq: the dequantization alone (median)
  // qgemm, qgemm-codes: this call's median over an alternative's, the two timed in turns
  // (gpu_timing.hpp, time_in_turns) after their own runs; what the gate compares.
  std::vector<std::pair<Backend, double>> paired_ratios;
};

// A run of `run.recipe_case` on `run.backend`, with the identity fields filled and nothing else.
RunResult make_run_result(const ExpandedRun& run);

struct DerivedFigures {
  double flops = 0;
  double min_bytes = 0;
  double arithmetic_intensity = 0;  // flops / min_bytes
  std::optional<double> tflops, weight_gbps, memory_gbps;
  std::optional<double> share_copy_bandwidth, share_bf16_peak, share_fp8_peak;
  std::optional<double> speedup_vs_cublas_bf16;
  std::optional<double> vs_alternative;  // qgemm runs
  std::optional<Backend> alternative;    // the backend vs_alternative compares with
  std::optional<double> dequant_tbps;    // qdq runs
};

struct BenchDocument;
// The figures of `run`, derived from its own fields, the document's peaks and the other runs of
// the same case and M.
DerivedFigures derive(const RunResult& run, const BenchDocument& document);

// Whether a weight of this scheme is stored as an 8-bit float, so that cuBLASLt FP8 on its
// codes is an alternative a user has.
bool fp8_is_an_alternative(const Scheme& scheme);
// Which cuBLASLt FP8 baseline that alternative is: cublaslt-fp8-exact (fp32-promoted
// accumulation) where the scheme scales activations in groups along K (fp8-block's 1x128), since
// cuBLASLt's block-scaled call accumulates that way and per-tensor fast accumulation would be a
// cheaper, different product; cublaslt-fp8 (fast accumulation) otherwise.
Backend fp8_alternative(const Scheme& scheme);

struct BenchDocument {
  std::string recipe_name, recipe_source;
  TimingMode timing = TimingMode::ColdL2;
  int repeats = 0, warmup = 0;
  std::vector<Backend> backends;
  std::uint64_t seed = 0;
  std::string tuning_table;  // QGEMM_TUNING_TABLE when the run had one (the qgemm backend used it)
  std::string started_at;
  double elapsed_s = 0;
  MachineInfo machine;
  PeakRates peaks;
  std::vector<RunResult> runs;
};

// A document for `recipe` with its recipe fields filled.
BenchDocument make_document(const Recipe& recipe, std::uint64_t seed);

std::string to_json_text(const BenchDocument& document);
// One row per run, the JSON's fields flattened (empty cell for null).
std::string to_csv(const BenchDocument& document);
// A table for people: a header row, then one row per run (print with cli::print_text_table).
std::vector<std::vector<std::string>> summary_rows(const BenchDocument& document);

// The qgemm runs slower than `ratio` × their fastest alternative (the never-slower gate), as
// lines "label M=..: qgemm X µs = R × alternative Y µs".
std::vector<std::string> gate_violations(const BenchDocument& document, double ratio);

}  // namespace qgemm::bench
