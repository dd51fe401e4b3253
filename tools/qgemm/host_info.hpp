// The host CPU as /proc/cpuinfo names it (qgemm info, the bench's machine record).
#pragma once

#include <fstream>
#include <string>

namespace qgemm::cli {

inline std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

}  // namespace qgemm::cli
