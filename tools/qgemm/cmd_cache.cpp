// qgemm cache: the on-disk kernel cache (src/jit/cache.hpp).
//
//   qgemm cache list [--json]                   every entry: spec, bytes, valid or why not
//   qgemm cache info [--json]                   directory, state, entry count, total bytes
//   qgemm cache clear                           removes qgemm's entries (and stray temp files)
//   qgemm cache prewarm [--arch A] [--jobs N]   compiles the catalog of A (default: device 0's,
//                                               else sm_90a): the utility kernels and the GEMM
//                                               kernels of every preset; with a progress bar
//   qgemm cache prewarm --recipe R.yaml         what the recipe's dense cases select over their
//                                               M ranges
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "command.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "jit/prewarm.hpp"
#include "qgemm/engine.hpp"
#include "bench/recipe.hpp"
#include "dispatch/candidate_launch.hpp"
#include "qgemm/error.hpp"
#include "runtime/driver.hpp"
#include "text_table.hpp"

namespace qgemm::cli {
namespace {

struct CacheCommandOptions {
  bool json = false;
  std::string arch;
  std::string recipe;  // prewarm --recipe
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

std::filesystem::path cache_dir_or_fail() {
  const auto dir = jit::default_cache_dir();
  if (dir.empty()) {
    throw Error(ErrorCode::InvalidArgument,
                "cache: no cache directory (set QGEMM_CACHE_DIR, XDG_CACHE_HOME or HOME)");
  }
  return dir;
}

int cache_list(const CacheCommandOptions& options) {
  const auto entries = jit::list_disk_entries(cache_dir_or_fail());
  if (options.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& entry : entries) {
      nlohmann::json row = {
          {"file", entry.path.filename().string()}, {"bytes", entry.bytes}, {"valid", entry.valid}};
      if (entry.valid) {
        row["metadata"] = nlohmann::json::parse(entry.metadata);
      } else {
        row["problem"] = entry.problem;
      }
      out.push_back(row);
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  std::vector<std::vector<std::string>> table = {{"spec", "bytes", "registers", "file"}};
  for (const auto& entry : entries) {
    std::string registers = "-";
    if (entry.valid) {
      registers = std::to_string(
          nlohmann::json::parse(entry.metadata).at("resources").at("registers").get<int>());
    }
    table.push_back({entry.valid ? entry.spec_text : "CORRUPT: " + entry.problem,
                     std::to_string(entry.bytes), registers, entry.path.filename().string()});
  }
  print_text_table(table);
  return 0;
}

int cache_info(const CacheCommandOptions& options) {
  const auto dir = jit::default_cache_dir();
  const auto entries = dir.empty() ? std::vector<jit::DiskEntry>() : jit::list_disk_entries(dir);
  std::uintmax_t bytes = 0;
  std::size_t corrupt = 0;
  for (const auto& entry : entries) {
    bytes += entry.bytes;
    corrupt += entry.valid ? 0 : 1;
  }
  const nlohmann::json info = {
      {"dir", dir.string()},
      {"disk_cache_enabled", !dir.empty() && !jit::disk_cache_disabled_by_environment()},
      {"entries", entries.size()},
      {"corrupt_entries", corrupt},
      {"total_bytes", bytes},
      {"nvrtc", jit::nvrtc_version_text()},
      {"headers_hash", jit::HeaderSet::embedded()->hash.hex()}};
  if (options.json) {
    fmt::print("{}\n", info.dump(2));
  } else {
    for (const auto& [key, value] : info.items()) fmt::print("{:<20} {}\n", key, value.dump());
  }
  return 0;
}

int cache_clear() {
  const auto dir = cache_dir_or_fail();
  const std::size_t removed = jit::clear_disk_cache(dir);
  fmt::print("removed {} files from {}\n", removed, dir.string());
  return 0;
}

jit::Arch default_arch() {
  if (runtime::device_count() > 0) {
    const auto device = runtime::device_info(0);
    return jit::arch_for_device(device.major, device.minor);
  }
  return jit::Arch::sm_90a;
}

int cache_prewarm(const CacheCommandOptions& options) {
  const jit::Arch arch = options.arch.empty() ? default_arch() : jit::parse_arch(options.arch);
  require(options.jobs >= 1, "cache prewarm: --jobs {} (rule: >= 1)", options.jobs);
  auto& cache = jit::KernelCache::global();
  if (!cache.disk_enabled()) {
    fmt::print(stderr,
               "note: the disk cache is disabled; prewarm only checks that specs compile\n");
  }
  dispatch::GpuLimits gpu = dispatch::GpuLimits::of_arch(arch, 132);
  if (options.arch.empty() && runtime::device_count() > 0)
    gpu = dispatch::GpuLimits::of_device(runtime::device_info(0));
  std::vector<jit::KernelSpec> specs;
  if (options.recipe.empty()) {
    specs = dispatch::kernel_catalog(gpu);
  } else {
    // Every GEMM kernel the recipe's dense cases can select over their M range, and the
    // activation kernels they launch.
    const bench::Recipe recipe = bench::load_recipe(options.recipe);
    dispatch::SelectionContext context;
    context.gpu = gpu;
    context.rates = dispatch::GpuRates::of(gpu);
    for (const bench::RecipeCase& c : recipe.cases) {
      if (c.kind != bench::CaseKind::Dense) continue;
      GemmProblem problem;
      problem.scheme = c.scheme;
      problem.m = *std::min_element(c.m.begin(), c.m.end());
      problem.m_max = *std::max_element(c.m.begin(), c.m.end());
      problem.n = c.n;
      problem.k = c.k;
      problem.input = c.scheme.activation.is_quantized() ? formats::bf16
                                                         : c.scheme.activation.format;
      // The layouts `qgemm bench` runs on: prepare_weight's, with its default max_rows.
      const dispatch::WeightFacts of_scheme =
          dispatch::WeightFacts::of_scheme(c.scheme, c.n, c.k, gpu.arch);
      const dispatch::WeightFacts weight = dispatch::keep_layouts(
          of_scheme, dispatch::kept_layouts(problem, of_scheme, kPrepareMaxRows, context));
      for (jit::KernelSpec& spec : dispatch::problem_specs(problem, weight, context))
        if (std::find(specs.begin(), specs.end(), spec) == specs.end())
          specs.push_back(std::move(spec));
    }
  }
  const auto results = jit::prewarm(cache, specs, options.jobs, jit::print_progress_bar);
  std::size_t compiled = 0, hits = 0, failed = 0;
  for (const auto& result : results) {
    if (!result.lookup.kernel) {
      ++failed;
      fmt::print(stderr, "{}\n", result.error);
    } else if (result.lookup.source == jit::CacheSource::Compiled) {
      ++compiled;
    } else {
      ++hits;
    }
  }
  fmt::print("{}: {} kernels, {} compiled, {} already cached, {} failed ({})\n",
             jit::arch_name(arch), specs.size(), compiled, hits, failed, cache.dir().string());
  return failed ? 1 : 0;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<CacheCommandOptions>();
  CLI::App* command = app.add_subcommand("cache", "Inspect, clear or prewarm the kernel cache");
  command->require_subcommand(1);
  CLI::App* list = command->add_subcommand("list", "List the cache entries");
  list->add_flag("--json", options->json, "Print JSON");
  list->callback([options, &status] { status = cache_list(*options); });
  CLI::App* info = command->add_subcommand("info", "Where the cache is and what it holds");
  info->add_flag("--json", options->json, "Print JSON");
  info->callback([options, &status] { status = cache_info(*options); });
  CLI::App* clear = command->add_subcommand("clear", "Remove every cache entry");
  clear->callback([&status] { status = cache_clear(); });
  CLI::App* prewarm = command->add_subcommand("prewarm", "Compile the catalog into the cache");
  prewarm->add_option("--arch", options->arch, "Target arch (default: device 0's, else sm_90a)");
  prewarm->add_option("--jobs", options->jobs, "Compile threads (default: hardware threads)");
  prewarm->add_option("--recipe", options->recipe,
                      "Compile what a bench recipe's cases select, over their M ranges");
  prewarm->callback([options, &status] { status = cache_prewarm(*options); });
});

}  // namespace
}  // namespace qgemm::cli
