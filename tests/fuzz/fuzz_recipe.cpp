// libFuzzer target: bench recipes (YAML, tools/harness/bench/recipe.cpp: parse_recipe, what
// `qgemm bench RECIPE.yaml` reads). A parsed recipe must hold what the rules promise, and its
// dry-run listings (JSON, CSV, one line per run) must be printable.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bench/recipe.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  qgemm::fuzz::expect_object_or_error([&] {
    const qgemm::bench::Recipe recipe = qgemm::bench::parse_recipe(text, "fuzz.yaml");
    FUZZ_CHECK(!recipe.name.empty(), "name");
    FUZZ_CHECK(recipe.repeats >= 1 && recipe.warmup >= 0, "repeats/warmup");
    FUZZ_CHECK(!recipe.backends.empty() && !recipe.cases.empty(), "backends/cases");
    std::size_t runs = 0;
    for (const auto& c : recipe.cases) {
      FUZZ_CHECK(c.n >= 1 && c.k >= 1 && !c.m.empty() && !c.label.empty(), c.label);
      FUZZ_CHECK(c.kind == qgemm::bench::CaseKind::Moe
                     ? c.top_k >= 1 && c.top_k <= c.experts
                     : c.experts == 0 && c.top_k == 0,
                 c.label);
      FUZZ_CHECK(qgemm::parse_scheme(c.scheme_text) == c.scheme, c.scheme_text);
      for (std::int64_t m : c.m) {
        FUZZ_CHECK(m >= 1, c.label);
        qgemm::validate_shape(c.scheme, m, c.n, c.k);
      }
      runs += c.m.size() * recipe.backends.size();
    }
    const auto expanded = qgemm::bench::expand(recipe);
    FUZZ_CHECK(expanded.size() == runs, "expand");
    // The listings of `qgemm bench --dry-run` (aliases can make a short text list many runs:
    // print them while that stays cheap).
    if (runs <= 20000) {
      for (const auto& run : expanded) (void)qgemm::bench::describe_run(run);
      (void)qgemm::bench::expanded_runs_json(recipe);
      (void)qgemm::bench::expanded_runs_csv(recipe);
    }
  });
  return 0;
}
