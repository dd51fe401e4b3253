// A `qgemm bench` result document with synthetic timings, built through the same functions the
// CLI uses (make_document, make_run_result, summarize), for the schema and plot tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/recipe.hpp"
#include "bench/results.hpp"

namespace qgemm::bench::test {

inline const std::string kRecipeDir = std::string(QGEMM_SOURCE_DIR) + "/bench/recipes/";

// Every run of `recipe`: MoE cases skipped (as after a lost context), the qgemm runs of quantized-activation schemes
// unsupported, the rest ok with random positive times (and the error they would have), so that
// every status and every null/number branch of the schema appears.
inline BenchDocument synthetic_document(const Recipe& recipe, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> us(2.0, 3000.0), error(1e-4, 5e-3);
  BenchDocument document = make_document(recipe, seed);
  document.started_at = "2026-12-02T10:00:00Z";
  document.elapsed_s = 12.5;
  document.machine.gpu = "NVIDIA H200";
  document.machine.compute_capability = "9.0";
  document.machine.sm_count = 132;
  document.machine.sm_clock_mhz = 1980;
  document.machine.memory_clock_mhz = 2619;
  document.machine.memory_bus_bits = 6144;
  document.machine.l2_bytes = 60 << 20;
  document.machine.memory_bytes = std::int64_t{143} << 30;
  document.machine.cuda_runtime = "13.0";
  document.machine.cuda_driver = "13.0";
  document.machine.driver = "580.65.06";
  document.machine.nvrtc = "13.0";
  document.machine.cublas = "13.1.0";
  document.machine.qgemm = "0.1.0";
  document.machine.host_cpu = "test cpu";
  document.peaks.copy_gbps = 3900;
  document.peaks.copy_bytes = std::int64_t{512} << 20;
  document.peaks.bf16_tflops = 720;
  document.peaks.fp8_tflops = 1300;
  document.peaks.gemm_size = 8192;
  for (const ExpandedRun& run : expand(recipe)) {
    RunResult result = make_run_result(run);
    result.activation_seed = rng();
    result.weight_bytes = run.recipe_case->n * run.recipe_case->k / 2;
    result.activation_bytes = 2 * run.m * run.recipe_case->k;
    result.output_bytes = 2 * run.m * run.recipe_case->n;
    if (run.recipe_case->kind == CaseKind::Moe) {
      result.status = RunStatus::Skipped;
      result.reason = "not run: the CUDA context was lost at run 3";
    } else if (run.backend == Backend::Qgemm && run.recipe_case->scheme.activation.is_quantized()) {
      result.status = RunStatus::Unsupported;
      result.reason = "dense gemm: config 'decode-w8' cannot serve: needs 209024 bytes of shared "
                      "memory";
    } else {
      result.status = RunStatus::Ok;
      result.kernel = "kernel<" + to_string(run.backend) + ">";
      std::vector<double> samples;
      for (int i = 0; i < 5; ++i) samples.push_back(us(rng));
      result.time = summarize(samples);
      result.error = error(rng);
      result.tolerance = 2e-2;
      result.error_rows = std::min<std::int64_t>(run.m, 32);
      result.error_cols = 192;
      result.first_call_ms = 250.0;
      result.warm_call_ms = 0.05;
      result.weight_device_bytes = result.weight_bytes + 4096;
    }
    document.runs.push_back(result);
  }
  return document;
}

}  // namespace qgemm::bench::test
