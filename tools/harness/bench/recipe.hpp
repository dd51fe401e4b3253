// Bench recipes: the YAML files `qgemm bench` reads (bench/recipes/*.yaml), parsed and validated
// on the CPU, and expanded into the list of runs (case × M × backend) a bake-off times.
//
//   name: decode                   # required
//   timing: cold-l2                # cold-l2 (default) | warm | graph
//   repeats: 50                    # timed runs per case, >= 1 (default 20)
//   warmup: 5                      # untimed runs first, >= 0 (default 3)
//   backends: [qgemm, cublas-bf16] # qgemm | cublas-bf16 | cublaslt-fp8 | cublaslt-fp8-exact | qdq
//                                  # | qgemm-codes
//                                  # (default [qgemm])
//   cases:                         # required, at least one
//     - scheme: w4a16              # a preset name or the compact text form (qgemm/scheme.hpp)
//       n: 4096                    # output features (rows of W)
//       k: 4096                    # input features
//       m: [1, 2, 4]               # tokens: an int or a list of ints
//       kind: dense                # dense (default) | moe (then `experts` and `top_k` too)
//       label: llama3-8b.o_proj    # optional; default "<scheme> <n>x<k>"
//
// Every error is a qgemm::Error (InvalidArgument, IoError for an unreadable file) whose message
// names the file, the line, the key and the rule, e.g.
//   "decode.yaml:12: cases[1].k: 1000 is not a multiple of the weight group 128 ...".
// Unknown keys are errors (a misspelt `repeat:` must not silently run the default).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qgemm/scheme.hpp"

namespace qgemm::bench {

enum class TimingMode { ColdL2, Warm, Graph };
// qgemm-codes: qgemm given activations quantized beforehand (a DeviceActivation of the host
// quantizer's codes), as the FP8 baselines are; for schemes that quantize activations.
enum class Backend { Qgemm, CublasBf16, CublasLtFp8, CublasLtFp8Exact, Qdq, QgemmCodes };
enum class CaseKind { Dense, Moe };

// The recipe spellings ("cold-l2", "cublaslt-fp8", "moe", ...).
std::string to_string(TimingMode mode);
std::string to_string(Backend backend);
std::string to_string(CaseKind kind);
// Every backend, in the order the recipe documentation lists them.
const std::vector<Backend>& all_backends();

struct RecipeCase {
  std::string label;
  std::string scheme_text;  // as written in the recipe (a preset name or the text form)
  Scheme scheme;            // parsed and validated
  std::int64_t n = 0, k = 0;
  std::vector<std::int64_t> m;  // in recipe order, each validated against the scheme
  CaseKind kind = CaseKind::Dense;
  int experts = 0, top_k = 0;  // MoE only
  int line = 0;                // 1-based line of the case in the recipe, for later messages
};

struct Recipe {
  std::string source;  // the file name (or the name given to parse_recipe)
  std::string name;
  TimingMode timing = TimingMode::ColdL2;
  int repeats = 20;
  int warmup = 3;
  std::vector<Backend> backends{Backend::Qgemm};
  std::vector<RecipeCase> cases;
};

// Reads and validates a recipe file (IoError when it cannot be read).
Recipe load_recipe(const std::string& path);
// Parses and validates recipe text; `source` names it in error messages.
Recipe parse_recipe(std::string_view yaml_text, const std::string& source);

// One timed run: a case at one M on one backend.
struct ExpandedRun {
  std::size_t case_index = 0;
  const RecipeCase* recipe_case = nullptr;  // points into the Recipe it was expanded from
  std::int64_t m = 0;
  Backend backend = Backend::Qgemm;
};
// case-major, then M in recipe order, then backends in recipe order.
std::vector<ExpandedRun> expand(const Recipe& recipe);

// The expanded list as one JSON document:
//   {"recipe": name, "source": file, "timing": "...", "repeats": r, "warmup": w,
//    "backends": [...], "count": n,
//    "runs": [{"case": i, "label": ..., "scheme": as written, "scheme_text": canonical,
//              "kind": ..., "m": ..., "n": ..., "k": ..., "experts": e, "top_k": t,
//              "backend": ...}, ...]}
// (experts and top_k only for MoE cases).
std::string expanded_runs_json(const Recipe& recipe);
// The same runs as CSV with a header row.
std::string expanded_runs_csv(const Recipe& recipe);
// One line per run for people, e.g. "  3  llama3-8b.o_proj  w4a16  dense  m=4  n=4096  k=4096
// qgemm".
std::string describe_run(const ExpandedRun& run);

}  // namespace qgemm::bench
