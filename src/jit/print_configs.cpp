#include "jit/print_configs.hpp"

#include <cstdlib>
#include <string_view>

namespace qgemm::jit {

bool print_configs_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("QGEMM_PRINT_CONFIGS");
    return value && *value && std::string_view(value) != "0";
  }();
  return enabled;
}

}  // namespace qgemm::jit
