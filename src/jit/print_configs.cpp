#include "jit/print_configs.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>

namespace qgemm::jit {

bool print_configs_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("QGEMM_PRINT_CONFIGS");
    return value && *value && std::string_view(value) != "0";
  }();
  return enabled;
}

void print_chosen_config(std::string_view operation, std::int64_t m, std::int64_t n, std::int64_t k,
                         const KernelSpec& spec, std::string_view reason) {
  if (!print_configs_enabled()) return;
  std::string line =
      fmt::format("[qgemm config] {} m={} n={} k={} -> {}", operation, m, n, k, to_string(spec));
  if (!reason.empty()) line += fmt::format(" ({})", reason);
  static std::mutex mutex;
  static std::unordered_set<std::string> printed;  // once per distinct line
  std::lock_guard lock(mutex);
  if (printed.insert(line).second) std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace qgemm::jit
