// qgemm sweep: random configurations checked against the CPU reference (issue #19).
//
//   qgemm sweep --n N [--seed S] [--backend auto|cpu|gpu] [--timeout SECONDS] [--max-work W]
//               [--moe] [--json] [--jobs J]
//
// Each configuration draws a scheme (a preset, or a compact form built from every weight
// format, granularity and group size, scale format, zero-point mode, activation quantization
// and output type; the ones the rules refuse are drawn again), M from 1 to 4096 (log-uniform),
// and N and K among aligned, odd and tensor-parallel-split sizes (M·N·K at most --max-work: the
// CPU reference multiplies in double), and for about a third of them a placement of A and C on
// the device (rows longer than the matrix, matrices starting off an aligned address: what views
// into larger tensors give), then runs `qgemm check`'s
// test (tools/harness/check: fresh random inputs from the case's seed, the error against the
// exact product and against the CPU reference, with the tolerances the formats allow).
//
// With --moe, every other case is a whole routed expert layer instead (`qgemm check --moe`): a
// scheme with 16-bit activations, 1-512 tokens, 1-64 experts, top-k up to 8, hidden and
// intermediate sizes from model shapes, tensor-parallel splits and odd multiples of 32, every
// GLU, with or without biases.
//
// Every case runs in a child process, so that a crash (a signal) or a hang (past --timeout) is
// that case's outcome and the sweep goes on; the parent never touches the GPU (a CUDA context
// does not survive fork); --jobs J keeps J children running at once (most of a case's time is
// the host's: NVRTC and the CPU reference), each case's messages printed under its line when it
// ends. Each failure is printed with the `qgemm check` command that reruns it. Exit status: 0 when
// every case passed (or was refused by the rules with their reason), 1 when any was wrong, crashed
// or hung, 2 bad arguments.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check/backend.hpp"
#include "check/check.hpp"
#include "check/moe_check.hpp"
#include "command.hpp"
#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::cli {
namespace {

struct SweepOptions {
  int n = 100;
  std::optional<std::uint64_t> seed;
  std::string backend = "auto";
  double timeout_s = 120;
  double max_work = 2e10;  // M·N·K
  bool moe = false;
  bool json = false;
  int jobs = 1;  // cases running at once (their child processes share the GPU)
};

struct Case {
  std::string scheme;
  std::int64_t m = 0, n = 0, k = 0;
  std::uint64_t seed = 0;
  check::MatrixPlacement placement;
  std::optional<check::MoeCase> moe;  // a routed expert layer (m tokens, k hidden, n inter)
};

template <class T, std::size_t N>
const T& pick(std::mt19937_64& rng, const std::array<T, N>& values) {
  return values[std::uniform_int_distribution<std::size_t>(0, N - 1)(rng)];
}

// A compact scheme text built from every part the grammar has (include/qgemm/scheme.hpp); the
// rules decide which of them are valid.
std::string random_scheme_text(std::mt19937_64& rng) {
  static const std::array<const char*, 14> formats = {
      "uint2", "uint3", "uint4", "uint8", "int4", "int8", "e4m3",
      "e5m2",  "e2m1",  "e3m2",  "e2m3", "ternary", "uint6", "int2"};
  static const std::array<const char*, 9> granularities = {"g16", "g32", "g64", "g128", "g256",
                                                           "g96", "ch",  "t",   "b128x128"};
  static const std::array<const char*, 5> scales = {"bf16", "fp16", "fp32", "e8m0", "ue4m3"};
  static const std::array<const char*, 5> zeros = {"", ":zp=mid", ":zp=int", ":zp=float", ""};
  static const std::array<const char*, 9> activations = {
      "bf16",          "fp16",          "e4m3:tok:s=fp32", "int8:tok:s=fp32", "e4m3:g128:s=fp32",
      "e4m3:mx:s=e8m0", "e2m1:nv:s=ue4m3", "e4m3:t:s=fp32", "bf16"};
  static const std::array<const char*, 3> outputs = {"bf16", "fp16", "fp32"};
  return fmt::format("w={}:{}:s={}{};a={};o={}", pick(rng, formats), pick(rng, granularities),
                     pick(rng, scales), pick(rng, zeros), pick(rng, activations),
                     pick(rng, outputs));
}

// Sizes: multiples of 64 as in models, odd ones, and tensor-parallel splits of real widths.
std::int64_t random_size(std::mt19937_64& rng) {
  static const std::array<std::int64_t, 10> widths = {2880, 1536, 11008, 14336, 5760,
                                                      2048, 4096, 7168,  18432, 768};
  switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
    case 0: return 64 * std::uniform_int_distribution<std::int64_t>(1, 64)(rng);
    case 1: return std::uniform_int_distribution<std::int64_t>(1, 2048)(rng) * 2 + 1;
    case 2: {
      static const std::array<std::int64_t, 4> splits = {2, 4, 8, 16};
      return std::max<std::int64_t>(1, pick(rng, widths) / pick(rng, splits));
    }
    default: return std::uniform_int_distribution<std::int64_t>(16, 4096)(rng);
  }
}

// A configuration the rules accept (schemes and shapes they refuse are drawn again).
Case draw_case(std::mt19937_64& rng, double max_work) {
  const std::vector<Preset>& all = presets();
  for (;;) {
    Case c;
    c.scheme = std::uniform_int_distribution<int>(0, 9)(rng) < 3
                   ? all[std::uniform_int_distribution<std::size_t>(0, all.size() - 1)(rng)].name
                   : random_scheme_text(rng);
    c.m = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(
               std::exp2(std::uniform_real_distribution<double>(0.0, 12.0)(rng))));
    c.n = random_size(rng);
    c.k = random_size(rng);
    c.seed = rng();
    if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
      static const std::array<std::int64_t, 6> pads = {0, 1, 2, 3, 8, 13};
      static const std::array<std::int64_t, 5> offsets = {0, 1, 2, 3, 8};
      c.placement = {pick(rng, pads), pick(rng, offsets), pick(rng, pads), pick(rng, offsets)};
    }
    if (static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) > max_work)
      continue;
    try {
      const Scheme scheme = parse_scheme(c.scheme);
      validate(scheme);
      validate_shape(scheme, c.m, c.n, c.k);
      return c;
    } catch (const Error&) {
      continue;
    }
  }
}

// A routed expert layer the rules accept: the weight part of a drawn scheme with 16-bit
// activations; work (tokens · top_k · hidden · inter) within max_work / 8 (the reference
// multiplies and bounds every slot in double), and at most 2e8 expert weights to draw and
// quantize on the CPU.
Case draw_moe_case(std::mt19937_64& rng, double max_work) {
  static const std::array<std::int64_t, 8> widths = {2048, 768, 2880, 1536, 4096, 1408, 7168, 512};
  auto size = [&] {
    switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
      case 0: return pick(rng, widths);
      case 1: return pick(rng, widths) / pick(rng, std::array<std::int64_t, 3>{2, 4, 8});
      default: return 32 * (2 * std::uniform_int_distribution<std::int64_t>(1, 24)(rng) + 1);
    }
  };
  for (;;) {
    Case c;
    check::MoeCase layer;
    const std::string text = random_scheme_text(rng);
    try {
      layer.scheme = parse_scheme(text);
    } catch (const Error&) {
      continue;
    }
    // Hidden states in bf16 or fp16; a scheme's activation quantization kept half the time
    // (the layer quantizes them itself).
    const Format hidden_type =
        std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? formats::fp16 : formats::bf16;
    if (!layer.scheme.activation.is_quantized() || std::uniform_int_distribution<int>(0, 1)(rng)) {
      layer.scheme.activation = ActivationQuant{};
      layer.scheme.activation.format = hidden_type;
    }
    layer.quantized_from = hidden_type;
    layer.tokens = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(
               std::exp2(std::uniform_real_distribution<double>(0.0, 9.0)(rng))));
    layer.experts = pick(rng, std::array<int, 6>{1, 4, 8, 16, 32, 64});
    layer.top_k = std::uniform_int_distribution<int>(1, std::min(8, layer.experts))(rng);
    layer.hidden = size();
    layer.inter = size();
    layer.glu.kind = pick(rng, std::array<GluKind, 3>{GluKind::Silu, GluKind::Gelu,
                                                      GluKind::ClampedSwiglu});
    layer.bias = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
    const double work = static_cast<double>(layer.tokens) * layer.top_k * layer.hidden * layer.inter;
    const double weights = 3.0 * layer.experts * layer.hidden * layer.inter;
    if (work > max_work / 8 || weights > 2e8) continue;
    try {
      check::validate(layer);
    } catch (const Error&) {
      continue;
    }
    c.scheme = to_string(layer.scheme);
    c.m = layer.tokens;
    c.n = layer.inter;
    c.k = layer.hidden;
    c.seed = rng();
    c.moe = layer;
    return c;
  }
}

enum class Outcome { Pass, Wrong, Refused, Crash, Hang };
const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Pass: return "pass";
    case Outcome::Wrong: return "wrong";
    case Outcome::Refused: return "refused";
    case Outcome::Crash: return "crash";
    case Outcome::Hang: return "hang";
  }
  return "?";
}

// The child: one check, its verdict as the exit status (0 pass, 1 wrong, 3 refused by the
// library with an Error, which it prints).
[[noreturn]] void run_child(const Case& c, const std::string& backend) {
  int status = 4;
  try {
    check::BackendSelection selection =
        check::select_backend(check::parse_backend_choice(backend));
    if (c.moe) {
      const check::MoeCheckResult result = check::run_moe_check(*c.moe, *selection.backend, c.seed);
      status = result.pass ? 0 : 1;
      if (!result.pass)
        std::fprintf(stderr, "  %lld elements outside their bounds (%lld not finite), worst %.2f\n",
                     static_cast<long long>(result.outside),
                     static_cast<long long>(result.non_finite), result.worst);
    } else {
      const check::CheckResult result = check::run_check(parse_scheme(c.scheme), c.m, c.n, c.k,
                                                         *selection.backend, c.seed, c.placement);
      status = result.pass ? 0 : 1;
      if (!result.pass)
        std::fprintf(stderr,
                     "  error vs exact %.3e (tolerance %.3e), vs reference %.3e (%.3e), %lld "
                     "elements written outside C\n",
                     result.error_vs_exact, result.tolerance_vs_exact, result.error_vs_reference,
                     result.tolerance_vs_reference, static_cast<long long>(result.outside_writes));
    }
  } catch (const Error& error) {
    std::fprintf(stderr, "  refused: %s\n", error.what());
    status = 3;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "  exception: %s\n", error.what());
    status = 4;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(status);
}

// A case running in its child process. The child's stdout and stderr go to `log` (a temporary
// file), which the parent prints under the case's line once it ends: with several children at
// once, their messages would interleave otherwise.
struct RunningCase {
  int index = 0;
  pid_t pid = -1;
  std::FILE* log = nullptr;
  std::chrono::steady_clock::time_point start;
};

RunningCase start_case(int index, const Case& c, const std::string& backend) {
  std::fflush(stdout);
  std::fflush(stderr);
  RunningCase run{index, -1, std::tmpfile(), std::chrono::steady_clock::now()};
  if (run.log == nullptr) throw Error(ErrorCode::Internal, "qgemm sweep: tmpfile failed");
  run.pid = fork();
  if (run.pid < 0) throw Error(ErrorCode::Internal, "qgemm sweep: fork failed");
  if (run.pid == 0) {
    dup2(fileno(run.log), STDOUT_FILENO);
    dup2(fileno(run.log), STDERR_FILENO);
    run_child(c, backend);
  }
  return run;
}

// The case's outcome once its child has ended (or was killed past `timeout_s`: a hang), else
// nothing yet.
std::optional<Outcome> poll_case(const RunningCase& run, double timeout_s) {
  int status = 0;
  const pid_t done = waitpid(run.pid, &status, WNOHANG);
  if (done == run.pid) {
    if (WIFSIGNALED(status)) return Outcome::Crash;
    switch (WEXITSTATUS(status)) {
      case 0: return Outcome::Pass;
      case 1: return Outcome::Wrong;
      case 3: return Outcome::Refused;
      default: return Outcome::Crash;  // an exception that is not a qgemm::Error
    }
  }
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - run.start).count() >
      timeout_s) {
    kill(run.pid, SIGKILL);
    waitpid(run.pid, &status, 0);
    return Outcome::Hang;
  }
  return std::nullopt;
}

// What the child printed, then the file closed (and removed: tmpfile's).
std::string take_log(RunningCase& run) {
  std::string text;
  std::rewind(run.log);
  char buffer[4096];
  for (std::size_t got; (got = std::fread(buffer, 1, sizeof buffer, run.log)) > 0;)
    text.append(buffer, got);
  std::fclose(run.log);
  run.log = nullptr;
  return text;
}

std::string placement_text(const check::MatrixPlacement& p) {
  if (p.is_default()) return "";
  return fmt::format(" --a-pad {} --a-offset {} --c-pad {} --c-offset {}", p.a_pad, p.a_offset,
                     p.c_pad, p.c_offset);
}

std::string rerun_command(const Case& c, const std::string& backend) {
  if (c.moe)
    return fmt::format(
        "qgemm check --moe --scheme '{}' --m {} --k {} --n {} --experts {} --top-k {} --glu {}{}{} "
        "--seed {} --backend {}",
        c.scheme, c.m, c.k, c.n, c.moe->experts, c.moe->top_k, glu_kind_name(c.moe->glu.kind),
        c.moe->bias ? " --bias" : "",
        c.moe->scheme.activation.is_quantized()
            ? " --hidden-type " + c.moe->quantized_from.name()
            : "",
        c.seed, backend);
  return fmt::format("qgemm check --scheme '{}' --m {} --n {} --k {} --seed {} --backend {}{}",
                     c.scheme, c.m, c.n, c.k, c.seed, backend, placement_text(c.placement));
}

int run(const SweepOptions& options) {
  check::parse_backend_choice(options.backend);  // names a bad value before any work
  require(options.n >= 1, "qgemm sweep: --n = {} (rule: at least 1)", options.n);
  require(options.timeout_s > 0, "qgemm sweep: --timeout = {} (rule: > 0 seconds)",
          options.timeout_s);
  require(options.jobs >= 1 && options.jobs <= 64,
          "qgemm sweep: --jobs = {} (rule: 1 to 64 cases at once)", options.jobs);
  require(options.max_work >= 1e6, "qgemm sweep: --max-work = {} (rule: at least 1e6)",
          options.max_work);
  const std::uint64_t seed = options.seed.value_or(check::fresh_seed());
  std::mt19937_64 rng(seed);
  if (!options.json)
    fmt::print("qgemm sweep  {} configurations  seed {} (rerun: --seed {})  backend {}\n",
               options.n, seed, seed, options.backend);
  // Every case is drawn first, in order, so that a seed gives the same cases at any --jobs.
  std::vector<Case> cases;
  for (int i = 0; i < options.n; ++i)
    cases.push_back(options.moe && i % 2 == 1 ? draw_moe_case(rng, options.max_work)
                                              : draw_case(rng, options.max_work));
  std::array<int, 5> counts{};
  std::vector<std::pair<Case, Outcome>> failures;
  std::vector<RunningCase> running;
  int next = 0;
  while (next < options.n || !running.empty()) {
    while (next < options.n && static_cast<int>(running.size()) < options.jobs) {
      running.push_back(start_case(next, cases[next], options.backend));
      ++next;
    }
    bool any_ended = false;
    for (std::size_t r = 0; r < running.size();) {
      const std::optional<Outcome> outcome = poll_case(running[r], options.timeout_s);
      if (!outcome) {
        ++r;
        continue;
      }
      any_ended = true;
      const Case& c = cases[running[r].index];
      const std::string log = take_log(running[r]);
      ++counts[static_cast<int>(*outcome)];
      const bool failed =
          *outcome == Outcome::Wrong || *outcome == Outcome::Crash || *outcome == Outcome::Hang;
      if (failed) failures.emplace_back(c, *outcome);
      if (!options.json) {
        fmt::print("[{}/{}] {:7}  {}{}\n", running[r].index + 1, options.n, outcome_name(*outcome),
                   c.moe ? "moe " + check::describe(*c.moe)
                         : fmt::format("{}  m={} n={} k={}{}", c.scheme, c.m, c.n, c.k,
                                       placement_text(c.placement)),
                   failed ? "\n          " + rerun_command(c, options.backend) : "");
        fmt::print("{}", log);
      }
      std::fflush(stdout);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(r));
    }
    if (!any_ended) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto count = [&](Outcome o) { return counts[static_cast<int>(o)]; };
  if (options.json) {
    std::string list;
    for (const auto& [c, outcome] : failures)
      list += fmt::format("{}{{\"outcome\":\"{}\",\"rerun\":\"{}\"}}", list.empty() ? "" : ",",
                          outcome_name(outcome), rerun_command(c, options.backend));
    fmt::print("{{\"seed\":{},\"backend\":\"{}\",\"configurations\":{},\"pass\":{},\"wrong\":{},"
               "\"refused\":{},\"crash\":{},\"hang\":{},\"failures\":[{}]}}\n",
               seed, options.backend, options.n, count(Outcome::Pass), count(Outcome::Wrong),
               count(Outcome::Refused), count(Outcome::Crash), count(Outcome::Hang), list);
  } else {
    fmt::print("pass {}  wrong {}  crash {}  hang {}  refused {}\n", count(Outcome::Pass),
               count(Outcome::Wrong), count(Outcome::Crash), count(Outcome::Hang),
               count(Outcome::Refused));
  }
  return failures.empty() ? kExitOk : kExitFailed;
}

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<SweepOptions>();
  CLI::App* command = app.add_subcommand(
      "sweep",
      "Check N random configurations (schemes, shapes) against the CPU reference, each in its "
      "own process; report pass / wrong / crash / hang with a rerun command for each failure");
  command->add_option("--n", options->n, "How many configurations")->capture_default_str();
  command->add_option("--seed", options->seed, "Random seed (default: a fresh one, printed)");
  command->add_option("--backend", options->backend, "auto | cpu | gpu")->capture_default_str();
  command->add_option("--timeout", options->timeout_s, "Seconds before a case counts as a hang")
      ->capture_default_str();
  command->add_option("--max-work", options->max_work,
                      "Largest M*N*K drawn (the CPU reference multiplies in double)")
      ->capture_default_str();
  command
      ->add_option("--jobs", options->jobs,
                   "Cases checked at once, each in its own process (NVRTC compiles and the "
                   "CPU reference run on the host's cores meanwhile)")
      ->capture_default_str();
  command->add_flag("--moe", options->moe,
                    "Every other configuration a routed expert layer (qgemm check --moe)");
  command->add_flag("--json", options->json, "Print one JSON object instead of text");
  command->callback([options, &status] { status = run(*options); });
});

}  // namespace
}  // namespace qgemm::cli
