// qgemm::Error — the one exception type of the library.
//
// Every message names the argument, the value it had and the rule it broke, e.g.
//   "scheme: weight group size 96 does not divide K = 1000 (rule: K % group == 0)".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace qgemm {

enum class ErrorCode {
  InvalidArgument,  // the caller passed something that breaks a documented rule
  Unsupported,      // valid, but no path of this build serves it (and no fallback could)
  CompileFailed,    // NVRTC rejected a generated translation unit
  CudaError,        // the driver returned an error
  NoDevice,         // a GPU was required and none is usable
  IoError,          // a file could not be read or written
  Internal,         // a bug in qgemm: please report
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(error_code_name(code)) + ": " + message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

inline const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return "invalid argument";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::CompileFailed: return "compile failed";
    case ErrorCode::CudaError: return "cuda error";
    case ErrorCode::NoDevice: return "no device";
    case ErrorCode::IoError: return "i/o error";
    case ErrorCode::Internal: return "internal error";
  }
  return "error";
}

// Throws InvalidArgument with `message` unless `condition` holds.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error(ErrorCode::InvalidArgument, message);
}

// The same with the message formatted (fmt) only when `condition` fails: checks that sit on a
// call's path cost the comparison, not the message.
template <typename... Args>
void require(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition)
    throw Error(ErrorCode::InvalidArgument, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qgemm
