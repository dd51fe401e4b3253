// Tests of bench recipes (tools/harness/bench/recipe.hpp) and `qgemm bench --dry-run` through the binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "bench/recipe.hpp"
#include "check/backend.hpp"
#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

namespace qgemm::bench {
namespace {

const std::string kRecipeDir = std::string(QGEMM_SOURCE_DIR) + "/bench/recipes/";
const std::array<const char*, 4> kShippedRecipes = {"quickstart.yaml", "decode.yaml",
                                                    "prefill.yaml", "formats.yaml"};

TEST(BenchRecipe, ParsesEveryKeyWithRandomShapes) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::int64_t n = 128 * std::uniform_int_distribution<std::int64_t>(1, 64)(rng);
  const std::int64_t k = 128 * std::uniform_int_distribution<std::int64_t>(1, 64)(rng);
  const std::int64_t m1 = std::uniform_int_distribution<std::int64_t>(1, 5000)(rng);
  const std::int64_t m2 = std::uniform_int_distribution<std::int64_t>(1, 5000)(rng);
  const int experts = std::uniform_int_distribution<int>(2, 256)(rng);
  const int top_k = std::uniform_int_distribution<int>(1, experts)(rng);
  const std::string text =
      "name: mine\ntiming: graph\nrepeats: 7\nwarmup: 0\n"
      "backends: [qdq, cublaslt-fp8-exact]\ncases:\n"
      "  - scheme: w4a16\n    n: " +
      std::to_string(n) + "\n    k: " + std::to_string(k) + "\n    m: [" + std::to_string(m1) +
      ", " + std::to_string(m2) +
      "]\n    label: first\n"
      "  - scheme: w=e4m3:ch:s=fp32;a=e4m3:tok:s=fp32;o=bf16\n    kind: moe\n"
      "    experts: " +
      std::to_string(experts) + "\n    top_k: " + std::to_string(top_k) +
      "\n    n: " + std::to_string(n) + "\n    k: " + std::to_string(k) +
      "\n    m: " + std::to_string(m2) + "\n";
  const Recipe r = parse_recipe(text, "mine.yaml");
  EXPECT_EQ(r.name, "mine");
  EXPECT_EQ(r.source, "mine.yaml");
  EXPECT_EQ(r.timing, TimingMode::Graph);
  EXPECT_EQ(r.repeats, 7);
  EXPECT_EQ(r.warmup, 0);
  EXPECT_EQ(r.backends, (std::vector<Backend>{Backend::Qdq, Backend::CublasLtFp8Exact}));
  ASSERT_EQ(r.cases.size(), 2u);
  EXPECT_EQ(r.cases[0].label, "first");
  EXPECT_EQ(r.cases[0].scheme.name, "w4a16");
  EXPECT_EQ(r.cases[0].n, n);
  EXPECT_EQ(r.cases[0].k, k);
  EXPECT_EQ(r.cases[0].m, (std::vector<std::int64_t>{m1, m2}));
  EXPECT_EQ(r.cases[0].kind, CaseKind::Dense);
  EXPECT_EQ(r.cases[0].line, 7);
  EXPECT_EQ(r.cases[1].kind, CaseKind::Moe);
  EXPECT_EQ(r.cases[1].experts, experts);
  EXPECT_EQ(r.cases[1].top_k, top_k);
  EXPECT_EQ(r.cases[1].m, (std::vector<std::int64_t>{m2}));
  EXPECT_EQ(r.cases[1].scheme.weight.format, formats::e4m3);
  EXPECT_FALSE(r.cases[1].label.empty());
  EXPECT_EQ(r.cases[1].line, 12);

  // case-major, then M, then backend
  const std::vector<ExpandedRun> runs = expand(r);
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[0].m, m1);
  EXPECT_EQ(runs[0].backend, Backend::Qdq);
  EXPECT_EQ(runs[1].m, m1);
  EXPECT_EQ(runs[1].backend, Backend::CublasLtFp8Exact);
  EXPECT_EQ(runs[2].m, m2);
  EXPECT_EQ(runs[4].case_index, 1u);
  EXPECT_EQ(runs[5].recipe_case, &r.cases[1]);
}

TEST(BenchRecipe, DefaultsWhenOptionalKeysAreAbsent) {
  const Recipe r = parse_recipe("name: d\ncases:\n  - {scheme: nvfp4, n: 64, k: 256, m: 3}\n", "d");
  EXPECT_EQ(r.timing, TimingMode::ColdL2);
  EXPECT_GE(r.repeats, 1);
  EXPECT_GE(r.warmup, 0);
  EXPECT_EQ(r.backends, (std::vector<Backend>{Backend::Qgemm}));
  EXPECT_EQ(r.cases[0].kind, CaseKind::Dense);
  EXPECT_NE(r.cases[0].label.find("nvfp4"), std::string::npos);
}

struct BadRecipe {
  const char* what;
  std::string yaml;
  std::vector<std::string> fragments;  // all must appear in the message
};

TEST(BenchRecipe, EveryErrorNamesFileKeyLineAndRule) {
  const std::string head = "name: bad\ncases:\n";
  const std::string good_case = "  - scheme: w4a16\n    n: 256\n    k: 512\n    m: [1, 8]\n";
  const std::vector<BadRecipe> cases = {
      {"unknown top key",
       "name: bad\nrepeat: 3\n" + std::string("cases:\n") + good_case,
       {"line 2", "'repeat'", "unknown key"}},
      {"missing name", "cases:\n" + good_case, {"line 1", "'name'", "missing"}},
      {"missing cases", "name: bad\n", {"line 1", "'cases'", "missing"}},
      {"empty cases", "name: bad\ncases: []\n", {"line 2", "'cases'", "non-empty"}},
      {"bad timing",
       "name: bad\ntiming: hot\ncases:\n" + good_case,
       {"line 2", "'timing'", "'hot'", "cold-l2"}},
      {"repeats zero",
       "name: bad\nrepeats: 0\ncases:\n" + good_case,
       {"line 2", "'repeats'", "minimum 1"}},
      {"warmup negative",
       "name: bad\nwarmup: -1\ncases:\n" + good_case,
       {"line 2", "'warmup'", "minimum 0"}},
      {"repeats not int",
       "name: bad\nrepeats: 2.5\ncases:\n" + good_case,
       {"line 2", "'repeats'", "not an integer"}},
      {"bad backend",
       "name: bad\nbackends: [qgemm,\n  cutlass]\ncases:\n" + good_case,
       {"line 3", "'backends[1]'", "'cutlass'", "not a backend"}},
      {"duplicate backend",
       "name: bad\nbackends: [qdq, qdq]\ncases:\n" + good_case,
       {"line 2", "'backends[1]'", "twice"}},
      {"unknown case key",
       head + good_case + "  - scheme: w4a16\n    n: 256\n    k: 512\n    mm: 3\n    m: 1\n",
       {"line 10", "'cases[1].mm'", "unknown key"}},
      {"bad scheme",
       head + "  - scheme: w9a16\n    n: 256\n    k: 512\n    m: 1\n",
       {"line 3", "'cases[0].scheme'", "w9a16"}},
      {"n zero",
       head + "  - scheme: w4a16\n    n: 0\n    k: 512\n    m: 1\n",
       {"line 4", "'cases[0].n'", "minimum 1"}},
      {"m list entry bad",
       head + "  - scheme: w4a16\n    n: 256\n    k: 512\n    m: [4, x]\n",
       {"line 6", "'cases[0].m[1]'", "not an integer"}},
      {"missing m",
       head + "  - scheme: w4a16\n    n: 256\n    k: 512\n",
       {"line 3", "'cases[0].m'", "missing"}},
      {"bad kind",
       head + good_case + "    kind: sparse\n",
       {"line 7", "'cases[0].kind'", "sparse"}},
      {"moe without experts",
       head + good_case + "    kind: moe\n    top_k: 2\n",
       {"line 3", "'cases[0].experts'", "moe"}},
      {"top_k above experts",
       head + good_case + "    kind: moe\n    experts: 4\n    top_k: 5\n",
       {"line 9", "'cases[0].top_k'", "top_k <= experts"}},
      {"experts on dense",
       head + good_case + "    experts: 4\n",
       {"line 7", "'cases[0].experts'", "only allowed"}},
      {"case not a map", head + "  - w4a16\n", {"line 3", "'cases[0]'", "mapping"}},
      {"syntax error", "name: bad\ncases: [\n", {"not valid YAML"}},
  };
  for (const BadRecipe& c : cases) {
    SCOPED_TRACE(c.what);
    try {
      parse_recipe(c.yaml, "bad.yaml");
      ADD_FAILURE() << "no error for: " << c.yaml;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
      const std::string message = error.what();
      EXPECT_NE(message.find("bad.yaml"), std::string::npos) << message;
      for (const std::string& fragment : c.fragments)
        EXPECT_NE(message.find(fragment), std::string::npos)
            << "'" << fragment << "' not in: " << message;
    }
  }
}

// Found by fuzzing (tests/fuzz/fuzz_recipe.cpp, issue #19): yaml-cpp passes bytes that are not
// UTF-8 through, so such a label reached the dry-run JSON, whose writer threw nlohmann's
// type_error instead of the recipe being refused with a qgemm::Error naming the key.
TEST(BenchRecipe, TextThatIsNotUtf8IsAnErrorNamingTheKey) {
  const std::string base =
      "name: r\ncases:\n  - scheme: w4a16\n    n: 128\n    k: 128\n    m: 1\n    label: ";
  for (const std::string label : {std::string("\"a\xff b\""), std::string("a\xc0\xaf"),
                                  std::string("\xed\xa0\x80"), std::string("'\xf4\x90\x80\x80'")}) {
    SCOPED_TRACE(label);
    try {
      parse_recipe(base + label + "\n", "u.yaml");
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("u.yaml, line 7, key 'cases[0].label'"), std::string::npos)
          << message;
      EXPECT_NE(message.find("UTF-8"), std::string::npos) << message;
    }
  }
  EXPECT_THROW(parse_recipe("name: \"\xfe\"\ncases: []\n", "u.yaml"), Error);
  EXPECT_THROW(parse_recipe(base + "\"\\uD800\"\n", "u.yaml"), Error);  // yaml-cpp's own error
  // UTF-8 passes, and reaches the JSON listing unchanged.
  const Recipe recipe = parse_recipe(base + "\"\xc3\xbc \\u00e9 \xf0\x9f\x99\x82\"\n", "u.yaml");
  const auto doc = nlohmann::json::parse(expanded_runs_json(recipe));
  EXPECT_EQ(doc["runs"][0]["label"], "\xc3\xbc \xc3\xa9 \xf0\x9f\x99\x82");
}

TEST(BenchRecipe, MissingFileIsAnIoErrorNamingIt) {
  try {
    load_recipe("/nonexistent/recipe.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::IoError);
    EXPECT_NE(std::string(error.what()).find("/nonexistent/recipe.yaml"), std::string::npos);
  }
}

// The number of runs counted straight from the YAML (not through the parser under test).
std::size_t runs_in_yaml(const std::string& path) {
  const YAML::Node root = YAML::LoadFile(path);
  const std::size_t backends = root["backends"] ? root["backends"].size() : 1;
  std::size_t total = 0;
  for (const auto& c : root["cases"]) total += c["m"].IsSequence() ? c["m"].size() : 1;
  return total * backends;
}

TEST(BenchRecipe, EveryShippedRecipeIsValid) {
  for (const char* file : kShippedRecipes) {
    SCOPED_TRACE(file);
    const Recipe r = load_recipe(kRecipeDir + file);
    EXPECT_FALSE(r.cases.empty());
    EXPECT_EQ(expand(r).size(), runs_in_yaml(kRecipeDir + file));
  }
}

TEST(BenchRecipe, ShippedRecipesCoverWhatTheyPromise) {
  const Recipe formats_recipe = load_recipe(kRecipeDir + "formats.yaml");
  std::set<std::string> listed;
  for (const RecipeCase& c : formats_recipe.cases) {
    listed.insert(c.scheme.name);
    EXPECT_EQ(c.n, 8192);
    EXPECT_EQ(c.k, 8192);
    EXPECT_EQ(c.m, (std::vector<std::int64_t>{1, 4096}));
  }
  for (const Preset& p : presets()) EXPECT_TRUE(listed.count(p.name)) << p.name << " missing";

  const Recipe decode = load_recipe(kRecipeDir + "decode.yaml");
  for (const RecipeCase& c : decode.cases) {
    for (std::int64_t m : c.m) EXPECT_LE(m, 64) << c.label;
  }
  const Recipe prefill = load_recipe(kRecipeDir + "prefill.yaml");
  for (const RecipeCase& c : prefill.cases) {
    for (std::int64_t m : c.m) EXPECT_GE(m, 512) << c.label;
  }
  // prefill.yaml uses the same layer shapes as decode.yaml
  ASSERT_EQ(decode.cases.size(), prefill.cases.size());
  for (std::size_t i = 0; i < decode.cases.size(); ++i) {
    EXPECT_EQ(decode.cases[i].n, prefill.cases[i].n);
    EXPECT_EQ(decode.cases[i].k, prefill.cases[i].k);
  }
}

TEST(BenchRecipe, CsvHasOneRowPerRun) {
  const Recipe r = load_recipe(kRecipeDir + "quickstart.yaml");
  const std::string csv = expanded_runs_csv(r);
  std::size_t lines = 0;
  for (char c : csv) lines += c == '\n';
  EXPECT_EQ(lines, expand(r).size() + 1);
}

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult run_cli(const std::string& arguments) {
  const std::string command = std::string("'") + QGEMM_CLI + "' " + arguments;
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, got);
  const int raw = pclose(pipe);
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return result;
}

TEST(BenchCli, DryRunListsEveryRunAndCountsThem) {
  const std::string path = kRecipeDir + "quickstart.yaml";
  const CommandResult r = run_cli("bench '" + path + "' --dry-run 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::size_t expected = runs_in_yaml(path);
  EXPECT_NE(r.output.find(std::to_string(expected) + " runs"), std::string::npos) << r.output;
  std::size_t listed = 0;
  for (std::size_t at = 0; (at = r.output.find(" m=", at)) != std::string::npos; ++at) ++listed;
  EXPECT_EQ(listed, expected);
}

TEST(BenchCli, DryRunJsonParsesWithExpectedFields) {
  const std::string path = kRecipeDir + "quickstart.yaml";
  const YAML::Node yaml = YAML::LoadFile(path);
  const CommandResult r = run_cli("bench '" + path + "' --dry-run --json - 2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json doc = nlohmann::json::parse(r.output);
  EXPECT_EQ(doc.at("recipe"), yaml["name"].as<std::string>());
  EXPECT_EQ(doc.at("timing"), "cold-l2");
  EXPECT_EQ(doc.at("repeats"), yaml["repeats"].as<int>());
  EXPECT_EQ(doc.at("warmup"), yaml["warmup"].as<int>());
  ASSERT_EQ(doc.at("runs").size(), runs_in_yaml(path));
  EXPECT_EQ(doc.at("count"), doc.at("runs").size());
  bool saw_moe = false;
  for (const auto& run : doc.at("runs")) {
    for (const char* key :
         {"case", "label", "scheme", "scheme_text", "kind", "m", "n", "k", "backend"})
      EXPECT_TRUE(run.contains(key)) << key << " missing in " << run.dump();
    // the canonical text form must name the same scheme as the recipe's spelling
    EXPECT_EQ(parse_scheme(run.at("scheme_text").get<std::string>()),
              parse_scheme(run.at("scheme").get<std::string>()));
    if (run.at("kind") == "moe") {
      saw_moe = true;
      EXPECT_TRUE(run.contains("experts"));
      EXPECT_LE(run.at("top_k").get<int>(), run.at("experts").get<int>());
    }
  }
  EXPECT_TRUE(saw_moe);  // quickstart.yaml has a MoE case
}

TEST(BenchCli, EveryShippedRecipePassesDryRunThroughTheBinary) {
  for (const char* file : kShippedRecipes) {
    const CommandResult r = run_cli("bench '" + kRecipeDir + file + "' --dry-run 2>&1");
    EXPECT_EQ(r.status, 0) << file << ": " << r.output;
  }
}

TEST(BenchCli, InvalidRecipeExits2NamingLineAndKey) {
  const std::string path = testing::TempDir() + "/qgemm_bad_recipe.yaml";
  {
    std::ofstream out(path);
    out << "name: bad\ncases:\n  - scheme: w4a16\n    n: 256\n    k: 0\n    m: 1\n";
  }
  const CommandResult r = run_cli("bench '" + path + "' --dry-run 2>&1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("line 5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cases[0].k"), std::string::npos) << r.output;
  std::remove(path.c_str());
}

TEST(BenchCli, TimingWithoutAGpuExits3SayingItNeedsOne) {
  // With a GPU this would be the real bake-off: tests/gpu/test_bench_cli.cpp covers that.
  if (check::probe_gpu().usable) GTEST_SKIP() << "a GPU is present";
  const CommandResult r = run_cli("bench '" + kRecipeDir + "quickstart.yaml' 2>&1");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("needs a GPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--dry-run"), std::string::npos) << r.output;
}

TEST(TuneCli, WithoutAGpuExits3SayingItNeedsOne) {
  if (check::probe_gpu().usable) GTEST_SKIP() << "a GPU is present";
  const CommandResult r = run_cli("tune '" + kRecipeDir + "quickstart.yaml' 2>&1");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("needs a GPU"), std::string::npos) << r.output;
  // The MoE case is named as left out, before the GPU is even looked for.
  EXPECT_NE(r.output.find("MoE"), std::string::npos) << r.output;
}

TEST(TuneCli, InvalidRecipeExits2NamingTheKey) {
  const std::string path = testing::TempDir() + "/qgemm_bad_tune_recipe.yaml";
  {
    std::ofstream out(path);
    out << "name: bad\nrepeat: 3\ncases:\n  - scheme: w4a16\n    n: 256\n    k: 256\n    m: 1\n";
  }
  const CommandResult r = run_cli("tune '" + path + "' 2>&1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("'repeat'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("line 2"), std::string::npos) << r.output;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace qgemm::bench
