// Logging, controlled by the environment:
//   QGEMM_LOG_LEVEL  0 silent · 1 warnings (default) · 2 info: choices and fallbacks · 3 debug
//                    · 4 trace
//   QGEMM_LOG_FILE   append to this file instead of stderr
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace qgemm {

enum class LogLevel { Silent = 0, Warning = 1, Info = 2, Debug = 3, Trace = 4 };

LogLevel log_level();
void log_message(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) > static_cast<int>(log_level())) return;
  log_message(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qgemm
