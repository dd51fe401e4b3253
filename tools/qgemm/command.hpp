// Sub-commands of the `qgemm` CLI register themselves: each tools/qgemm/cmd_*.cpp defines one
// static CommandRegistration, so adding a command touches one file.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <vector>

#include "qgemm/error.hpp"

namespace qgemm::cli {

// Exit statuses shared by every sub-command.
enum ExitStatus : int {
  kExitOk = 0,
  kExitFailed = 1,       // ran, and the result is outside what is allowed (check, demo)
  kExitInvalid = 2,      // bad arguments or input (a qgemm::Error reached main)
  kExitUnavailable = 3,  // the backend or device the command needs is not there
};

// A qgemm::Error that ends sub-command `name`: printed as "qgemm NAME: ...", and its exit
// status: kExitUnavailable when the device or what it runs is missing (NoDevice, CudaError,
// Unsupported), else kExitInvalid.
inline int report_error(const char* name, const Error& error) {
  std::fprintf(stderr, "qgemm %s: %s\n", name, error.what());
  const ErrorCode code = error.code();
  return code == ErrorCode::NoDevice || code == ErrorCode::CudaError ||
                 code == ErrorCode::Unsupported
             ? kExitUnavailable
             : kExitInvalid;
}

// Adds a sub-command to `app`; the sub-command's callback stores its exit status in `status`.
using AddCommand = std::function<void(CLI::App& app, int& status)>;

std::vector<AddCommand>& command_registry();

struct CommandRegistration {
  explicit CommandRegistration(AddCommand add) { command_registry().push_back(std::move(add)); }
};

}  // namespace qgemm::cli
