// qgemm bench: the bake-off of a recipe (bench/recipes/*.yaml, format in tools/harness/bench/recipe.hpp).
//
//   qgemm bench RECIPE.yaml [--json OUT] [--csv OUT] [--plot OUT.png] [--seed S] [--gate RATIO]
//               [--dry-run]
//
// Times every run (case × M × backend) of the recipe on GPU 0 (gpu_bench/bench_run.hpp), checks
// each output against the CPU reference, and writes the result document (tools/harness/bench/results.hpp)
// as JSON and/or CSV (OUT "-" is standard output), a table for people on stdout, progress on
// stderr. --plot runs bench/plot.py on the JSON (python3 with matplotlib). --dry-run validates
// the recipe and lists its runs without a GPU (--json / --csv then write that list).
//
// --gate RATIO: the never-slower gate. Every qgemm run must take at most RATIO × its fastest
// alternative of the same case and M (qdq, and cublaslt-fp8 for 8-bit float weights; the
// "vs alt" column, results.hpp); the runs that do not are listed and the exit status is 1.
//
// Exit status: 0 every run ok, unsupported or skipped (and within the gate); 1 a run failed (an
// error or a wrong result) or the gate did; 2 bad arguments or an invalid recipe; 3 no usable
// GPU, or --plot could not run.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "bench/recipe.hpp"
#include "bench/results.hpp"
#include "check/backend.hpp"
#include "check/check.hpp"
#include "command.hpp"
#include "gpu_bench/bench_run.hpp"
#include "qgemm/error.hpp"
#include "text_table.hpp"

extern char** environ;

namespace qgemm::cli {
namespace {

struct BenchOptions {
  std::string recipe;
  std::string json_out, csv_out, plot_out;
  std::optional<std::uint64_t> seed;
  std::optional<double> gate;
  bool dry_run = false;
};

void write_output(const std::string& path, const std::string& text, const char* what) {
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out)
    throw Error(ErrorCode::IoError, fmt::format("--{} {}: cannot write the file", what, path));
}

// bench/plot.py of this source tree (QGEMM_PLOT_SCRIPT overrides it, e.g. for an installed
// copy).
std::string plot_script() {
  if (const char* path = std::getenv("QGEMM_PLOT_SCRIPT"); path && *path) return path;
  return std::string(QGEMM_SOURCE_DIR) + "/bench/plot.py";
}

// Runs `python3 bench/plot.py RESULTS.json OUT.png`; returns an exit status of this command.
int run_plot(const std::string& json_path, const std::string& png_path) {
  const std::string script = plot_script();
  if (!std::filesystem::exists(script)) {
    std::fprintf(stderr, "qgemm bench: --plot: the plot script %s does not exist\n",
                 script.c_str());
    return kExitUnavailable;
  }
  std::string python = "python3";
  std::vector<std::string> args = {python, script, json_path, png_path};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int error = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
      error != 0) {
    std::fprintf(stderr, "qgemm bench: --plot needs python3 on PATH (%s)\n", std::strerror(error));
    return kExitUnavailable;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) {
    std::fprintf(stderr, "qgemm bench: --plot: %s did not finish normally\n", script.c_str());
    return kExitUnavailable;
  }
  const int code = WEXITSTATUS(status);
  if (code == 0) return kExitOk;
  // plot.py exits with 3 (having said so) when matplotlib is missing.
  if (code != 3)
    std::fprintf(stderr, "qgemm bench: --plot: %s exited with status %d\n", script.c_str(), code);
  return kExitUnavailable;
}

int dry_run(const BenchOptions& options, const bench::Recipe& recipe) {
  const std::vector<bench::ExpandedRun> runs = bench::expand(recipe);
  // The listing goes to stdout unless the JSON does; then stdout holds only the JSON.
  if (options.json_out != "-") {
    fmt::print("qgemm bench --dry-run  {}  ({})\n", recipe.name, recipe.source);
    fmt::print("  timing {}  repeats {}  warmup {}\n", bench::to_string(recipe.timing),
               recipe.repeats, recipe.warmup);
    for (std::size_t i = 0; i < runs.size(); ++i)
      fmt::print("  {:>4}  {}\n", i + 1, bench::describe_run(runs[i]));
    fmt::print("{} runs ({} cases)\n", runs.size(), recipe.cases.size());
  }
  if (!options.json_out.empty())
    write_output(options.json_out, bench::expanded_runs_json(recipe), "json");
  if (!options.csv_out.empty())
    write_output(options.csv_out, bench::expanded_runs_csv(recipe), "csv");
  if (!options.plot_out.empty())
    std::fprintf(stderr, "qgemm bench: --plot %s ignored with --dry-run (nothing was timed)\n",
                 options.plot_out.c_str());
  return kExitOk;
}

void print_summary(const bench::BenchDocument& document) {
  const bench::MachineInfo& m = document.machine;
  fmt::print(
      "qgemm bench {}: {}, {} SMs, CUDA {} (driver {}), cuBLAS {}, qgemm {}; timing {}, "
      "{} repeats, seed {}\n",
      document.recipe_name, m.gpu, m.sm_count, m.cuda_runtime, m.driver, m.cublas, m.qgemm,
      bench::to_string(document.timing), document.repeats, document.seed);
  const bench::PeakRates& p = document.peaks;
  auto peak = [](const std::optional<double>& value, const char* unit) {
    return value ? fmt::format("{:.0f} {}", *value, unit) : std::string("not measured");
  };
  fmt::print("peaks: copy {}, cuBLAS BF16 {}, cuBLASLt FP8 {} ({}^3)\n", peak(p.copy_gbps, "GB/s"),
             peak(p.bf16_tflops, "TFLOPS"), peak(p.fp8_tflops, "TFLOPS"), p.gemm_size);
  print_text_table(bench::summary_rows(document));
}

int run(const BenchOptions& options) {
  const bench::Recipe recipe = bench::load_recipe(options.recipe);
  if (options.dry_run) return dry_run(options, recipe);
  const check::GpuProbe gpu = check::probe_gpu();
  if (!gpu.usable) {
    std::fprintf(stderr,
                 "qgemm bench: recipe %s is valid, but timing needs a GPU: %s. Use --dry-run to "
                 "list its runs.\n",
                 options.recipe.c_str(), gpu.detail.c_str());
    return kExitUnavailable;
  }
  const std::uint64_t seed = options.seed ? *options.seed : check::fresh_seed();
  std::fprintf(stderr, "qgemm bench: seed %llu (repeat with --seed %llu)\n",
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  const bench::BenchDocument document = bench::run_bench(recipe, seed);

  const std::string json = bench::to_json_text(document);
  if (!options.json_out.empty()) write_output(options.json_out, json, "json");
  if (!options.csv_out.empty()) write_output(options.csv_out, bench::to_csv(document), "csv");
  if (options.json_out != "-" && options.csv_out != "-") print_summary(document);

  int status = kExitOk;
  for (const bench::RunResult& result : document.runs) {
    if (result.status == bench::RunStatus::Failed) status = kExitFailed;
  }
  if (options.gate) {
    const std::vector<std::string> violations = bench::gate_violations(document, *options.gate);
    for (const std::string& line : violations)
      std::fprintf(stderr, "qgemm bench: gate %.2f: %s\n", *options.gate, line.c_str());
    std::fprintf(stderr, "qgemm bench: gate %.2f: %zu run%s slower than allowed\n", *options.gate,
                 violations.size(), violations.size() == 1 ? "" : "s");
    if (!violations.empty()) status = kExitFailed;
  }
  if (!options.plot_out.empty()) {
    // The plot reads the JSON: the one written, or a temporary copy.
    std::string json_path = options.json_out;
    const bool temporary = json_path.empty() || json_path == "-";
    if (temporary) {
      json_path = (std::filesystem::temp_directory_path() /
                   fmt::format("qgemm-bench-{}.json", static_cast<long>(::getpid())))
                      .string();
      write_output(json_path, json, "plot");
    }
    const int plot_status = run_plot(json_path, options.plot_out);
    if (temporary) std::filesystem::remove(json_path);
    if (plot_status != kExitOk && status == kExitOk) status = plot_status;
  }
  return status;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench",
      "Bake-off of a recipe (bench/recipes/*.yaml) on GPU 0 against cuBLAS baselines; "
      "--dry-run validates it and lists the runs without a GPU");
  command->add_option("recipe", options->recipe, "Recipe file (YAML)")->required();
  command->add_option("--json", options->json_out,
                      "Write the results as JSON to OUT ('-': stdout)");
  command->add_option("--csv", options->csv_out, "Write the results as CSV to OUT ('-': stdout)");
  command->add_option("--plot", options->plot_out,
                      "Write plots (PNG): OUT (speedup against M) and OUT's stem + "
                      "'_roofline.png' (needs python3 with matplotlib)");
  command->add_option("--seed", options->seed, "Seed of the random inputs (default: fresh)");
  command->add_option("--gate", options->gate,
                      "Exit 1 if a qgemm run takes more than RATIO x its fastest alternative")
      ->check(CLI::PositiveNumber);
  command->add_flag("--dry-run", options->dry_run, "Validate and list the runs; no GPU needed");
  command->callback([options, &status] {
    try {
      status = run(*options);
    } catch (const Error& error) {
      status = report_error("bench", error);
    }
  });
});

}  // namespace
}  // namespace qgemm::cli
