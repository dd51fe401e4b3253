// qgemm info: the machine as qgemm sees it: CPU, driver, GPUs, NVRTC, cache directory.
//
//   qgemm info [--json]
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "command.hpp"
#include "host_info.hpp"
#include "jit/cache.hpp"
#include "jit/kernel_spec.hpp"
#include "runtime/driver.hpp"

namespace qgemm::cli {
namespace {

nlohmann::json machine_info() {
  nlohmann::json info;
  info["cpu"] = {{"model", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}};
  std::string why;
  const bool driver = runtime::Driver::available(&why);
  info["driver"] = {{"present", driver}};
  if (driver) {
    info["driver"]["version"] = runtime::driver_version_text();
  } else {
    info["driver"]["reason"] = why;
  }
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < runtime::device_count(); ++i) {
    const auto device = runtime::device_info(i);
    std::string arch;
    try {
      arch = jit::arch_name(jit::arch_for_device(device.major, device.minor));
    } catch (const std::exception&) {
      arch = "none";
    }
    gpus.push_back(
        {{"index", i},
         {"name", device.name},
         {"compute_capability", fmt::format("{}.{}", device.major, device.minor)},
         {"sm_count", device.sm_count},
         {"memory_gib", static_cast<double>(device.memory_bytes) / (1024.0 * 1024 * 1024)},
         {"target", arch}});
  }
  info["gpus"] = gpus;
  info["nvrtc"] = jit::nvrtc_version_text();
  info["cache_dir"] = jit::default_cache_dir().string();
  info["disk_cache_enabled"] = !jit::disk_cache_disabled_by_environment();
  return info;
}

void print_info(bool json) {
  const auto info = machine_info();
  if (json) {
    fmt::print("{}\n", info.dump(2));
    return;
  }
  fmt::print("cpu      {} ({} hardware threads)\n", info["cpu"]["model"].get<std::string>(),
             info["cpu"]["hardware_threads"].get<unsigned>());
  if (info["driver"]["present"].get<bool>()) {
    fmt::print("driver   CUDA {}\n", info["driver"]["version"].get<std::string>());
  } else {
    fmt::print("driver   none ({})\n", info["driver"]["reason"].get<std::string>());
  }
  if (info["gpus"].empty()) fmt::print("gpus     none\n");
  for (const auto& gpu : info["gpus"]) {
    fmt::print("gpu {}    {}, cc {}, {} SMs, {:.1f} GiB, target {}\n", gpu["index"].get<int>(),
               gpu["name"].get<std::string>(), gpu["compute_capability"].get<std::string>(),
               gpu["sm_count"].get<int>(), gpu["memory_gib"].get<double>(),
               gpu["target"].get<std::string>());
  }
  fmt::print("nvrtc    {}\n", info["nvrtc"].get<std::string>());
  fmt::print(
      "cache    {}{}\n", info["cache_dir"].get<std::string>(),
      info["disk_cache_enabled"].get<bool>() ? "" : " (disabled by QGEMM_DISABLE_DISK_CACHE)");
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto json = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand("info", "CPU, driver, GPUs, NVRTC and cache directory");
  command->add_flag("--json", *json, "Print JSON");
  command->callback([json, &status] {
    print_info(*json);
    status = 0;
  });
});

}  // namespace
}  // namespace qgemm::cli
