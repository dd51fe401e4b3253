// qgemm — the command-line tool. Each sub-command lives in its own cmd_*.cpp.
#include <cstdio>

#include "command.hpp"
#include "qgemm/error.hpp"

namespace qgemm::cli {
std::vector<AddCommand>& command_registry() {
  static std::vector<AddCommand> registry;
  return registry;
}
}  // namespace qgemm::cli

int main(int argc, char** argv) {
  CLI::App app{"qgemm: JIT-compiled quantized GEMM kernels for LLM inference"};
  app.require_subcommand(1);
  int status = 0;
  for (auto& add : qgemm::cli::command_registry()) add(app, status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const qgemm::Error& error) {
    std::fprintf(stderr, "qgemm: %s\n", error.what());
    return qgemm::cli::kExitInvalid;
  }
  return status;
}
