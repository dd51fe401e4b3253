// qgemm bench: the bake-off of a recipe (bench/recipes/*.yaml, format in src/bench/recipe.hpp).
//
//   qgemm bench RECIPE.yaml [--json OUT] [--csv OUT] [--plot OUT.png] [--dry-run]
//
// --dry-run validates the recipe and lists the runs it expands to (case × M × backend), with
// no GPU; --json / --csv then write that list (OUT "-" is standard output). The timed bake-off
// itself is future work: without --dry-run the command validates the recipe and exits with
// status 3 saying so. Exit status: 0 ok, 2 bad arguments or an invalid recipe, 3 timing is not
// available here.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "bench/recipe.hpp"
#include "check/backend.hpp"
#include "command.hpp"
#include "qgemm/error.hpp"

namespace qgemm::cli {
namespace {

struct BenchOptions {
  std::string recipe;
  std::string json_out, csv_out, plot_out;
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

int run(const BenchOptions& options) {
  const bench::Recipe recipe = bench::load_recipe(options.recipe);
  const std::vector<bench::ExpandedRun> runs = bench::expand(recipe);
  if (!options.dry_run) {
    const check::GpuProbe gpu = check::probe_gpu();
    std::fprintf(
        stderr,
        "qgemm bench: recipe %s is valid (%zu runs), but timing needs a GPU and the GPU "
        "timing part of qgemm bench is future work (not built yet); %s. Use --dry-run "
        "to list the runs.\n",
        options.recipe.c_str(), runs.size(),
        gpu.usable ? ("GPU found: " + gpu.detail).c_str() : ("no GPU here: " + gpu.detail).c_str());
    return kExitUnavailable;
  }
  // The listing goes to stdout unless the JSON does; then stdout holds only the JSON.
  const bool json_on_stdout = options.json_out == "-";
  if (!json_on_stdout) {
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
  return 0;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench",
      "Bake-off of a recipe (bench/recipes/*.yaml); --dry-run validates it and lists the runs "
      "without a GPU");
  command->add_option("recipe", options->recipe, "Recipe file (YAML)")->required();
  command->add_option("--json", options->json_out,
                      "Write the results as JSON to OUT ('-': stdout)");
  command->add_option("--csv", options->csv_out, "Write the results as CSV to OUT ('-': stdout)");
  command->add_option("--plot", options->plot_out, "Write a speedup plot (PNG) to OUT");
  command->add_flag("--dry-run", options->dry_run, "Validate and list the runs; no GPU needed");
  command->callback([options, &status] {
    try {
      status = run(*options);
    } catch (const Error& error) {
      std::fprintf(stderr, "qgemm bench: %s\n", error.what());
      status = kExitInvalid;
    }
  });
});

}  // namespace
}  // namespace qgemm::cli
