// qgemm demo: the main job in a few readable lines.
//
//   qgemm demo [--scheme w4a16] [--m 16 --n 4096 --k 4096] [--backend auto|cpu|gpu] [--seed X]
//
// Quantizes a random weight, runs the quantized GEMM on the GPU when there is one (issue 4)
// and on the CPU reference backend otherwise, and prints the error against the exact product
// and the reference, with what the formats allow, and the throughput. It is `qgemm check`
// (tools/harness/check) with a friendlier report; the exit status is check's.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "check/backend.hpp"
#include "check/check.hpp"
#include "command.hpp"
#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::cli {
namespace {

struct DemoOptions {
  std::string scheme = "w4a16";
  std::int64_t m = 16, n = 4096, k = 4096;  // a decode step through a 4096-wide layer
  std::string backend = "auto";
  std::optional<std::uint64_t> seed;
};

std::string scheme_title(const Scheme& scheme) {
  for (const Preset& preset : presets())
    if (preset.scheme == scheme) return fmt::format("{}: {}", preset.name, preset.description);
  return to_string(scheme);
}

int run(const DemoOptions& options) {
  const Scheme scheme = parse_scheme(options.scheme);
  check::BackendSelection selection;
  try {
    selection = check::select_backend(check::parse_backend_choice(options.backend));
  } catch (const Error& error) {
    return report_error("demo", error);  // NoDevice: no usable GPU for --backend gpu
  }
  const std::uint64_t seed = options.seed.value_or(check::fresh_seed());
  const check::CheckResult r =
      check::run_check(scheme, options.m, options.n, options.k, *selection.backend, seed);

  const double fp16_mib = 2.0 * r.n * r.k / (1 << 20);
  const double packed_mib = r.packed_weight_bytes / double(1 << 20);
  fmt::print("qgemm demo: {}\n", scheme_title(scheme));
  fmt::print(
      "  weight    {} x {}: {:.1f} MiB in fp16 -> {:.1f} MiB quantized ({:.2f} bits/weight)\n", r.n,
      r.k, fp16_mib, packed_mib, 8.0 * r.packed_weight_bytes / (double(r.n) * r.k));
  fmt::print("  backend   {}: {}\n            ({})\n", r.backend, selection.backend->description(),
             selection.reason);
  fmt::print("  GEMM      C[{} x {}] = A[{} x {}] . W^T: {:.2f} ms, {:.2f} GFLOP/s\n", r.m, r.n,
             r.m, r.k, r.time_ms, r.gflops);
  fmt::print(
      "  error     {:.2e} vs the exact product of the unquantized inputs (formats allow "
      "{:.2e})\n",
      r.error_vs_exact, r.tolerance_vs_exact);
  fmt::print("            {:.2e} vs the CPU reference (allowed {:.2e})\n", r.error_vs_reference,
             r.tolerance_vs_reference);
  fmt::print("  {}  (seed {})\n", r.pass ? "OK" : "FAILED: outside tolerance", r.seed);
  return r.pass ? kExitOk : kExitFailed;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<DemoOptions>();
  CLI::App* command = app.add_subcommand(
      "demo",
      "Quantize a random weight, run the quantized GEMM (GPU if any, else the CPU "
      "reference) and print its error and throughput");
  command->add_option("--scheme", options->scheme, "Preset name or compact text form")
      ->capture_default_str();
  command->add_option("--m", options->m, "Rows of A (tokens)")->capture_default_str();
  command->add_option("--n", options->n, "Rows of W (output features)")->capture_default_str();
  command->add_option("--k", options->k, "Shared dimension (input features)")
      ->capture_default_str();
  command->add_option("--backend", options->backend, "auto | cpu | gpu")->capture_default_str();
  command->add_option("--seed", options->seed, "Random seed (default: a fresh one)");
  command->callback([options, &status] { status = run(*options); });
});

}  // namespace
}  // namespace qgemm::cli
