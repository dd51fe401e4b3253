#include "common/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace qgemm {
namespace {

LogLevel read_level() {
  const char* text = std::getenv("QGEMM_LOG_LEVEL");
  if (!text || !*text) return LogLevel::Warning;
  int value = std::atoi(text);
  if (value < 0) value = 0;
  if (value > 4) value = 4;
  return static_cast<LogLevel>(value);
}

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::Warning: return "warning";
    case LogLevel::Info: return "info";
    case LogLevel::Debug: return "debug";
    case LogLevel::Trace: return "trace";
    default: return "";
  }
}

}  // namespace

LogLevel log_level() {
  static const LogLevel level = read_level();
  return level;
}

void log_message(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static FILE* sink = [] {
    const char* path = std::getenv("QGEMM_LOG_FILE");
    FILE* file = path && *path ? std::fopen(path, "a") : nullptr;
    return file ? file : stderr;
  }();
  std::lock_guard lock(mutex);
  std::fprintf(sink, "[qgemm %s] %.*s\n", level_tag(level), static_cast<int>(message.size()),
               message.data());
  std::fflush(sink);
}

}  // namespace qgemm
