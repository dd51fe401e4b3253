#include "gpu_bench/tune_run.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <optional>

#include "gpu_bench/workbench.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

void emit(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Runs one task and returns its result; `context_lost` is set when the CUDA context broke.
CandidateResult run_task(const TuneTask& task, std::size_t index, GpuBench& gpu,
                         CaseWeights& weights, Problem& problem, const Recipe& recipe,
                         bool& context_lost) {
  CandidateResult result;
  const RecipeCase& c = weights.recipe_case();
  try {
    const Format activation = engine_activation_format(c.scheme);
    GemmOptions options;
    options.candidate = task.config;
    const QuantWeight& weight = weights.prepared(gpu.engine());
    // The untimed part before the deadline starts: JIT compilation and the CPU reference. A
    // candidate that cannot serve the task is Unsupported here (skipped, with its reason).
    GemmProblem forced = gemm_problem(weight, task.m, activation, c.scheme.output);
    forced.candidate = task.config;
    gpu.engine().warm_up(forced, weight, gpu.stream());
    problem.prepare_reference(Backend::Qgemm);
    emit(compiled_line(index));
    const BackendCall call = problem.call(Backend::Qgemm, gpu, options);
    result.kernel = call.kernel;
    const Measurement measured =
        measure(call.call, call.output, call.output_bytes, call.error_now, call.tolerance,
                {recipe.timing, recipe.warmup, recipe.repeats}, gpu.stream(), gpu.flusher());
    result.error = measured.error;
    if (!measured.failure.empty()) {
      result.status = CandidateStatus::Failed;
      result.reason = measured.failure;
      return result;
    }
    result.status = CandidateStatus::Ok;
    result.time = measured.time;
    return result;
  } catch (const Error& error) {
    result.status =
        error.code() == ErrorCode::Unsupported ? CandidateStatus::Skipped : CandidateStatus::Failed;
    result.reason = error_message(error);
  } catch (const std::exception& error) {
    result.status = CandidateStatus::Failed;
    result.reason = error.what();
  }
  if (result.status == CandidateStatus::Failed && !context_usable()) context_lost = true;
  return result;
}

}  // namespace

int run_tune_worker(const Recipe& recipe, const std::vector<TuneTask>& tasks, std::size_t from,
                    std::uint64_t seed) {
  GpuBench gpu(0);
  std::optional<CaseWeights> weights;
  std::optional<Problem> problem;
  const std::vector<Backend> backends = {Backend::Qgemm};
  for (std::size_t i = from; i < tasks.size(); ++i) {
    const TuneTask& task = tasks[i];
    bool context_lost = false;
    CandidateResult result;
    try {
      if (!weights || weights->case_index() != task.case_index) {
        problem.reset();
        weights.reset();
        weights.emplace(recipe.cases.at(task.case_index), task.case_index, seed, backends);
      }
      if (!problem || problem->m() != task.m) {
        problem.reset();
        problem.emplace(*weights, task.m, seed, backends);
      }
      result = run_task(task, i, gpu, *weights, *problem, recipe, context_lost);
    } catch (const std::exception& error) {  // drawing or preparing the inputs failed
      result.status = CandidateStatus::Failed;
      result.reason = error.what();
      context_lost = !context_usable();
    }
    emit(result_line(i, result));
    if (context_lost) return kWorkerContextLost;
  }
  return 0;
}

}  // namespace qgemm::bench
