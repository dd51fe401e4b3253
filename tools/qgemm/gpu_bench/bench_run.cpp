#include "gpu_bench/bench_run.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include "dispatch/tuning_table.hpp"
#include "gpu_bench/moe_workbench.hpp"
#include "gpu_bench/workbench.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

using Clock = std::chrono::steady_clock;

void print_progress(std::size_t done, std::size_t total, Clock::time_point started,
                    const RunResult& run) {
  const auto seconds =
      static_cast<long>(std::chrono::duration<double>(Clock::now() - started).count());
  std::string outcome;
  if (run.status == RunStatus::Ok && run.time)
    outcome = fmt::format("{:.2f} us  (error {:.1e})", run.time->median_us, run.error.value_or(0));
  else
    outcome = to_string(run.status) + (run.reason.empty() ? "" : ": " + run.reason);
  std::fprintf(stderr, "[%*zu/%zu %ld:%02ld] %s m=%lld %s: %s\n",
               static_cast<int>(std::to_string(total).size()), done, total, seconds / 60,
               seconds % 60, run.label.c_str(), static_cast<long long>(run.m),
               to_string(run.backend).c_str(), outcome.c_str());
  std::fflush(stderr);
}

// Runs one backend's call (of a dense or an MoE problem with that output sample) and fills
// the measured fields of `result`; returns the call when it ran ok (for the timing in turns).
GpuCall run_backend(GpuBench& gpu, const BackendCall& call, const OutputSample& sample,
                    const Recipe& recipe, RunResult& result) {
  result.kernel = call.kernel;
  result.weight_bytes = call.weight_bytes;
  result.weight_device_bytes = call.weight_device_bytes;
  result.activation_bytes = call.activation_bytes;
  result.output_bytes = call.output_bytes;
  result.error_rows = static_cast<std::int64_t>(sample.rows.size());
  result.error_cols = sample.columns();
  result.tolerance = call.tolerance;
  const Measurement measured =
      measure(call.call, call.output, call.output_bytes, call.error_now, call.tolerance,
              {recipe.timing, recipe.warmup, recipe.repeats}, gpu.stream(), gpu.flusher());
  result.first_call_ms = measured.first_call_ms;
  result.error = measured.error;
  if (!measured.failure.empty()) {
    result.status = RunStatus::Failed;
    result.reason = measured.failure;
    return {};
  }
  result.warm_call_ms = measured.warm_call_ms;
  result.time = measured.time;
  result.status = RunStatus::Ok;
  if (call.dequantize) {
    // Timed apart, in the recipe's mode: what the dequantization pass of qdq costs. A weight
    // whose dequantization the Engine cannot give alone (a global scale left to the GEMM) has
    // none.
    try {
      call.dequantize(gpu.stream());
      check_cuda(cudaStreamSynchronize(gpu.stream()), "cudaStreamSynchronize (dequantize)");
      result.dequant_us = summarize(time_call(call.dequantize,
                                              {recipe.timing, recipe.warmup, recipe.repeats},
                                              gpu.stream(), gpu.flusher()))
                              .median_us;
    } catch (const Error& error) {
      if (error.code() != ErrorCode::Unsupported) throw;
    }
  }
  return call.call;
}

// The gate's comparisons of one case and M, timed in turns: qgemm against qdq, and qgemm-codes
// (else qgemm) against cublaslt-fp8 where the weight is an 8-bit float. `calls` holds the ok
// runs' calls by backend; the ratios go to the qgemm-side run in `runs`.
void pair_alternatives(const std::map<Backend, std::pair<std::size_t, GpuCall>>& calls,
                       const Recipe& recipe, GpuBench& gpu, std::vector<RunResult>& runs) {
  auto pair = [&](Backend ours, Backend alternative) {
    const auto a = calls.find(ours), b = calls.find(alternative);
    if (a == calls.end() || b == calls.end()) return;
    const auto samples =
        time_in_turns({a->second.second, b->second.second},
                      {recipe.timing, recipe.warmup, recipe.repeats}, gpu.stream(), gpu.flusher());
    runs[a->second.first].paired_ratios.push_back(
        {alternative, summarize(samples[0]).median_us / summarize(samples[1]).median_us});
  };
  pair(Backend::Qgemm, Backend::Qdq);
  const RunResult& any = runs[calls.begin()->second.first];
  if (fp8_is_an_alternative(parse_scheme(any.scheme_text)))
    pair(calls.count(Backend::QgemmCodes) ? Backend::QgemmCodes : Backend::Qgemm,
         Backend::CublasLtFp8);
}

}  // namespace

BenchDocument run_bench(const Recipe& recipe, std::uint64_t seed, int device) {
  const Clock::time_point started = Clock::now();
  BenchDocument document = make_document(recipe, seed);
  document.started_at = dispatch::utc_timestamp_now();
  if (const char* table = std::getenv("QGEMM_TUNING_TABLE")) document.tuning_table = table;
  GpuBench gpu(device);
  document.machine = gpu.machine();
  std::fprintf(stderr, "qgemm bench: %s on %s (%d SMs); measuring peaks...\n", recipe.name.c_str(),
               gpu.machine().gpu.c_str(), gpu.machine().sm_count);
  document.peaks = measure_peaks(gpu, seed);
  for (const std::string& problem : document.peaks.problems)
    std::fprintf(stderr, "qgemm bench: peak not measured: %s\n", problem.c_str());

  const std::vector<ExpandedRun> runs = expand(recipe);
  std::optional<CaseWeights> weights;
  std::optional<Problem> problem;
  std::optional<MoeCaseWeights> moe_weights;
  std::optional<MoeProblem> moe_problem;
  std::string context_lost;  // set once a sticky CUDA error ends the timing
  // The ok calls of the current case and M (index of their result, call), for the gate's timing
  // in turns once the group's last backend has run.
  std::map<Backend, std::pair<std::size_t, GpuCall>> group;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const ExpandedRun& run = runs[i];
    RunResult result = make_run_result(run);
    if (!context_lost.empty()) {
      result.status = RunStatus::Skipped;
      result.reason = context_lost;
    } else {
      try {
        GpuCall call;
        if (run.recipe_case->kind == CaseKind::Moe) {
          // One case's weights at a time, dense or MoE.
          problem.reset();
          weights.reset();
          if (!moe_weights || moe_weights->case_index() != run.case_index) {
            moe_problem.reset();
            moe_weights.reset();
            moe_weights.emplace(*run.recipe_case, run.case_index, seed, recipe.backends);
          }
          if (!moe_problem || moe_problem->m() != run.m) {
            moe_problem.reset();
            moe_problem.emplace(*moe_weights, run.m, seed);
          }
          result.activation_seed = moe_problem->activation_seed();
          call = run_backend(gpu, moe_problem->call(result.backend, gpu), moe_problem->sample(),
                             recipe, result);
        } else {
          moe_problem.reset();
          moe_weights.reset();
          if (!weights || weights->case_index() != run.case_index) {
            problem.reset();
            weights.reset();
            weights.emplace(*run.recipe_case, run.case_index, seed, recipe.backends);
          }
          if (!problem || problem->m() != run.m) {
            problem.reset();
            problem.emplace(*weights, run.m, seed, recipe.backends);
          }
          result.activation_seed = problem->activation_seed();
          call = run_backend(gpu, problem->call(result.backend, gpu), problem->sample(), recipe,
                             result);
        }
        if (call)
          group.emplace(result.backend, std::make_pair(document.runs.size(), std::move(call)));
      } catch (const Error& error) {
        result.status =
            error.code() == ErrorCode::Unsupported ? RunStatus::Unsupported : RunStatus::Failed;
        result.reason = error_message(error);
      } catch (const std::exception& error) {
        result.status = RunStatus::Failed;
        result.reason = error.what();
      }
      if (result.status == RunStatus::Failed && !context_usable()) {
        context_lost = fmt::format("not run: the CUDA context was lost at run {} ({} m={} {})",
                                   i + 1, result.label, result.m, to_string(result.backend));
        problem.reset();
        weights.reset();
        moe_problem.reset();
        moe_weights.reset();
      }
    }
    print_progress(i + 1, runs.size(), started, result);
    document.runs.push_back(std::move(result));
    const bool group_ends = i + 1 == runs.size() || runs[i + 1].case_index != run.case_index ||
                            runs[i + 1].m != run.m;
    if (group_ends) {
      if (!group.empty() && context_lost.empty()) {
        try {
          pair_alternatives(group, recipe, gpu, document.runs);
        } catch (const Error& error) {
          std::fprintf(stderr, "qgemm bench: timing in turns failed: %s\n", error.what());
        }
      }
      group.clear();
    }
  }
  document.elapsed_s = std::chrono::duration<double>(Clock::now() - started).count();
  return document;
}

}  // namespace qgemm::bench
