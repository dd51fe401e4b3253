// qgemm compile: compile kernel specs through the cache and report what each costs.
//
//   qgemm compile --arch sm_90a --all [--json] [--jobs N]   the whole catalog of the arch
//   qgemm compile --arch sm_90a --spec TEXT [--spec TEXT]   specific specs (text form of
//                                                           src/jit/kernel_spec.hpp; the @arch
//                                                           suffix may be left out)
//   qgemm compile --arch sm_80 --all --bench [--repeat N]   cold NVRTC / warm disk / memory-hit
//                                                           timings (bench/NOTES.md)
//
// Per kernel: spec, cache ("hit": memory or disk, "miss": compiled now), compile_ms (wall time
// of this lookup), load_ms (module load on device 0; null without a GPU of that arch),
// registers, spill_bytes, smem_bytes (static + dynamic), cubin_bytes.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "dispatch/candidate_launch.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "jit/prewarm.hpp"
#include "qgemm/error.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "text_table.hpp"

namespace qgemm::cli {
namespace {

struct CompileCommandOptions {
  std::string arch = "sm_90a";
  bool all = false;
  std::vector<std::string> specs;
  bool json = false;
  int jobs = 1;
  bool bench = false;
  int repeat = 3;
};

std::vector<jit::KernelSpec> selected_specs(const CompileCommandOptions& options) {
  const jit::Arch arch = jit::parse_arch(options.arch);
  require(options.all != !options.specs.empty(),
          "qgemm compile: give exactly one of --all or --spec TEXT");
  if (options.all) return dispatch::kernel_catalog(dispatch::GpuLimits::of_arch(arch, 132));
  std::vector<jit::KernelSpec> specs;
  for (const auto& text : options.specs) {
    specs.push_back(jit::parse_kernel_spec(
        text.find('@') == std::string::npos ? text + "@" + jit::arch_name(arch) : text));
  }
  return specs;
}

// The module load time on device 0, when device 0 runs cubins of the spec's arch.
nlohmann::json load_ms(const jit::CompiledKernel& kernel) {
  if (runtime::device_count() == 0) return nullptr;
  const runtime::DeviceInfo device = runtime::device_info(0);
  try {
    if (jit::arch_for_device(device.major, device.minor) != kernel.spec.arch) return nullptr;
  } catch (const Error&) {
    return nullptr;
  }
  runtime::use_primary_context(0);
  runtime::KernelLoader::global().get(kernel);
  return runtime::KernelLoader::last_load_ms();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int run_compile(const CompileCommandOptions& options) {
  const auto specs = selected_specs(options);
  auto& cache = jit::KernelCache::global();
  const bool show_progress = options.jobs > 1 || specs.size() > 4;
  const auto results = jit::prewarm(
      cache, specs, options.jobs,
      show_progress ? jit::print_progress_bar : std::function<void(std::size_t, std::size_t)>());
  nlohmann::json rows = nlohmann::json::array();
  int failures = 0;
  for (const auto& result : results) {
    nlohmann::json row;
    row["spec"] = jit::to_string(result.spec);
    if (!result.lookup.kernel) {
      ++failures;
      row["error"] = result.error;
      rows.push_back(row);
      continue;
    }
    const auto& kernel = *result.lookup.kernel;
    row["cache"] = result.lookup.source == jit::CacheSource::Compiled ? "miss" : "hit";
    row["compile_ms"] = result.elapsed_ms;
    row["load_ms"] = load_ms(kernel);
    row["registers"] = kernel.resources.registers;
    row["spill_bytes"] = kernel.resources.spill_bytes();
    row["smem_bytes"] = kernel.resources.static_smem_bytes + kernel.spec.launch.dynamic_smem_bytes;
    row["cubin_bytes"] = kernel.cubin.size();
    rows.push_back(row);
  }
  if (options.json) {
    fmt::print("{}\n", rows.dump(2));
  } else {
    std::vector<std::vector<std::string>> table = {
        {"spec", "cache", "compile_ms", "load_ms", "regs", "spill", "smem", "cubin"}};
    for (const auto& row : rows) {
      if (row.contains("error")) {
        table.push_back({row["spec"], "FAILED", "", "", "", "", "", ""});
        continue;
      }
      table.push_back(
          {row["spec"], row["cache"], fmt::format("{:.1f}", row["compile_ms"].get<double>()),
           row["load_ms"].is_null() ? "-" : fmt::format("{:.2f}", row["load_ms"].get<double>()),
           std::to_string(row["registers"].get<int>()),
           std::to_string(row["spill_bytes"].get<int>()),
           std::to_string(row["smem_bytes"].get<int>()),
           std::to_string(row["cubin_bytes"].get<std::size_t>())});
    }
    print_text_table(table);
    for (const auto& row : rows) {
      if (row.contains("error")) fmt::print(stderr, "{}\n", row["error"].get<std::string>());
    }
  }
  return failures ? 1 : 0;
}

// Cold: NVRTC straight (no cache). Warm disk: a fresh cache object over a directory that holds
// the entry (read + checksum + parse; + module load when a GPU of the arch is present). Memory:
// repeated get() on one cache object.
int run_bench(const CompileCommandOptions& options) {
  const auto specs = selected_specs(options);
  const int repeat = std::max(1, options.repeat);
  const auto headers = jit::HeaderSet::embedded();
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("qgemm-jit-bench-{}",
                               std::chrono::steady_clock::now().time_since_epoch().count());
  jit::CacheConfig config;
  config.dir = dir;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> all_cold, all_disk, all_memory_ns, all_module_load;
  for (const auto& spec : specs) {
    std::vector<double> cold;
    for (int r = 0; r < repeat; ++r) {
      const auto start = std::chrono::steady_clock::now();
      jit::compile_kernel(spec, *headers, config.options);
      cold.push_back(milliseconds_since(start));
    }
    jit::KernelCache writer(config);
    writer.get(spec);
    std::vector<double> disk;
    nlohmann::json module_load;  // the first repeat's load: later ones find the module loaded
    for (int r = 0; r < repeat * 3; ++r) {
      jit::KernelCache reader(config);
      const auto start = std::chrono::steady_clock::now();
      auto lookup = reader.get(spec);
      const nlohmann::json loaded = load_ms(*lookup.kernel);
      disk.push_back(milliseconds_since(start));
      require(lookup.source == jit::CacheSource::Disk, "bench: expected a disk hit");
      if (r == 0) module_load = loaded;
    }
    if (module_load.is_number()) all_module_load.push_back(module_load.get<double>());
    constexpr int kMemoryLookups = 20000;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kMemoryLookups; ++i) writer.get(spec);
    const double memory_ns = milliseconds_since(start) * 1e6 / kMemoryLookups;
    rows.push_back({{"spec", jit::to_string(spec)},
                    {"cold_compile_ms_median", median(cold)},
                    {"warm_disk_ms_median", median(disk)},
                    {"module_load_ms", module_load},
                    {"memory_hit_ns", memory_ns}});
    all_cold.push_back(median(cold));
    all_disk.push_back(median(disk));
    all_memory_ns.push_back(memory_ns);
    if (!options.json) {
      fmt::print(stderr, "{:<90} cold {:7.1f} ms  disk {:6.3f} ms  memory {:6.0f} ns\n",
                 jit::to_string(spec), median(cold), median(disk), memory_ns);
    }
  }
  std::error_code error;
  std::filesystem::remove_all(dir, error);
  const nlohmann::json summary = {
      {"kernels", specs.size()},
      {"repeat", repeat},
      {"cold_compile_ms_median", median(all_cold)},
      {"cold_compile_ms_max", *std::max_element(all_cold.begin(), all_cold.end())},
      {"warm_disk_ms_median", median(all_disk)},
      {"memory_hit_ns_median", median(all_memory_ns)},
      {"nvrtc", jit::nvrtc_version_text()},
      {"module_load_ms_median",
       all_module_load.empty() ? nlohmann::json() : nlohmann::json(median(all_module_load))},
      {"gpu_load_included", runtime::device_count() > 0}};
  if (options.json) {
    fmt::print("{}\n", nlohmann::json{{"kernels", rows}, {"summary", summary}}.dump(2));
  } else {
    fmt::print("{}\n", summary.dump(2));
  }
  return 0;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<CompileCommandOptions>();
  CLI::App* command = app.add_subcommand("compile", "Compile kernel specs through the JIT cache");
  command->add_option("--arch", options->arch,
                      "Target: sm_75 sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a (default sm_90a)");
  command->add_flag("--all", options->all, "Every spec of the arch's catalog");
  command->add_option("--spec", options->specs, "A kernel spec in text form (repeatable)");
  command->add_flag("--json", options->json, "Print JSON instead of a text table");
  command->add_option("--jobs", options->jobs, "Compile on this many threads");
  command->add_flag("--bench", options->bench,
                    "Measure cold compile, warm disk hit and memory hit (no cache is touched)");
  command->add_option("--repeat", options->repeat,
                      "Cold compiles per spec for --bench (default 3)");
  command->callback([options, &status] {
    status = options->bench ? run_bench(*options) : run_compile(*options);
  });
});

}  // namespace
}  // namespace qgemm::cli
