#include "dispatch/tuned_config.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "common/log.hpp"
#include "jit/compiler.hpp"
#include "qgemm/error.hpp"
#include "qgemm/tuning.hpp"

namespace qgemm::dispatch {

std::string driver_release() {
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." : the first
  // token that looks like a dotted release number.
  std::ifstream file("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(file, line)) {
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      const bool dotted = word.find('.') != std::string::npos &&
                          word.find_first_not_of("0123456789.") == std::string::npos &&
                          std::isdigit(static_cast<unsigned char>(word.front()));
      if (dotted) return word;
    }
  }
  std::string why;
  if (!runtime::Driver::available(&why)) return "none";
  return "CUDA " + runtime::driver_version_text();
}

MachineKey machine_key(const runtime::DeviceInfo& device) {
  return {device.name, device.sm_count, jit::nvrtc_version_text(), driver_release(),
          qgemm_version()};
}

namespace {

// The process-wide active table. `active` is the fast path of every gemm() call without one.
struct ActiveTable {
  std::mutex mutex;
  std::atomic<bool> active{false};
  std::atomic<bool> environment_read{false};
  std::string path;
  std::shared_ptr<const TuningTable> table;
  std::atomic<std::uint64_t> generation{0};
  std::map<int, bool> applies;  // per device index, decided at its first lookup
};

ActiveTable& active_table() {
  static ActiveTable state;
  return state;
}

// Installs `path` (empty: none). Caller holds the mutex.
void install(ActiveTable& state, const std::string& path) {
  state.active = false;
  state.path = path;
  state.table.reset();
  state.applies.clear();
  if (!path.empty()) state.table = std::make_shared<const TuningTable>(load_tuning_table(path));
  state.active = state.table != nullptr;
  ++state.generation;
}

void read_environment(ActiveTable& state) {
  if (state.environment_read) return;
  state.environment_read = true;
  const char* path = std::getenv("QGEMM_TUNING_TABLE");
  if (!path || !*path) return;
  try {
    install(state, path);
    log(LogLevel::Info, "tuning table {} loaded ({} entries)", path, state.table->entries.size());
  } catch (const Error& error) {
    // A server must still start: the heuristics serve, and the warning says why.
    log(LogLevel::Warning, "QGEMM_TUNING_TABLE ignored: {}", error.what());
  }
}

}  // namespace

void set_active_tuning_table(const std::string& path) {
  ActiveTable& state = active_table();
  std::lock_guard lock(state.mutex);
  state.environment_read = true;  // an explicit choice replaces the environment's
  install(state, path);
}

std::shared_ptr<const TuningTable> applicable_tuning_table(const runtime::DeviceInfo& device) {
  ActiveTable& state = active_table();
  if (state.environment_read && !state.active) return nullptr;
  std::lock_guard lock(state.mutex);
  read_environment(state);
  if (!state.table) return nullptr;
  auto applies = state.applies.find(device.index);
  if (applies == state.applies.end()) {
    const std::string mismatch = mismatch_reason(state.table->machine, machine_key(device));
    if (!mismatch.empty())
      log(LogLevel::Warning, "tuning table {} ignored on device {}: {}", state.path, device.index,
          mismatch);
    applies = state.applies.emplace(device.index, mismatch.empty()).first;
  }
  return applies->second ? state.table : nullptr;
}

std::uint64_t tuning_table_generation() {
  ActiveTable& state = active_table();
  if (!state.environment_read) {
    std::lock_guard lock(state.mutex);
    read_environment(state);
  }
  return state.generation;
}

}  // namespace qgemm::dispatch

namespace qgemm {

void use_tuning_table(const std::string& path) { dispatch::set_active_tuning_table(path); }

}  // namespace qgemm
