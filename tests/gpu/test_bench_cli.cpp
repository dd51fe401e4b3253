// `qgemm bench` and `qgemm tune` on the GPU, through the binary: a reduced quickstart.yaml
// (every backend, every timing mode), and a tuning table the Engine then follows.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/recipe.hpp"
#include "dispatch/tuned_config.hpp"
#include "dispatch/tuning_table.hpp"
#include "gpu/gpu_test_util.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/tuning.hpp"

namespace qgemm::bench {
namespace {

using nlohmann::json;

const std::string kRecipeDir = std::string(QGEMM_SOURCE_DIR) + "/bench/recipes/";

struct CommandResult {
  int status = -1;
  std::string output;
};

// Runs the CLI; stdout and stderr are captured together (the progress lines say what ran).
CommandResult run_cli(const std::string& arguments) {
  const std::string command = std::string("'") + QGEMM_CLI + "' " + arguments + " 2>&1";
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, got);
  const int raw = ::pclose(pipe);
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return result;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::path(testing::TempDir()) /
                   (name + "-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  return dir;
}

// `source` with fewer repeats (and another timing mode when given), written into `dir`.
std::filesystem::path reduced_recipe(const std::string& source, const std::filesystem::path& dir,
                                     const std::string& timing = "") {
  YAML::Node recipe = YAML::LoadFile(source);
  recipe["repeats"] = 5;
  recipe["warmup"] = 1;
  if (!timing.empty()) recipe["timing"] = timing;
  const auto path = dir / ("recipe-" + (timing.empty() ? "default" : timing) + ".yaml");
  std::ofstream(path) << recipe << "\n";
  return path;
}

bool finite_positive(const json& value) {
  return value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() > 0;
}

// Checks every run of a bench document; returns the number of ok runs.
int check_document(const json& doc, const Recipe& recipe) {
  const auto device = runtime::device_info(0);
  EXPECT_EQ(doc.at("machine").at("gpu"), device.name);
  EXPECT_EQ(doc.at("machine").at("sm_count"), device.sm_count);
  EXPECT_TRUE(finite_positive(doc.at("peaks").at("copy_gbps"))) << doc.at("peaks").dump();
  EXPECT_TRUE(finite_positive(doc.at("peaks").at("bf16_tflops"))) << doc.at("peaks").dump();
  if (device.major * 10 + device.minor >= 89)  // FP8 tensor cores
    EXPECT_TRUE(finite_positive(doc.at("peaks").at("fp8_tflops"))) << doc.at("peaks").dump();
  const json& runs = doc.at("runs");
  EXPECT_EQ(runs.size(), expand(recipe).size());
  int ok = 0;
  for (const json& run : runs) {
    SCOPED_TRACE(run.dump());
    const std::string status = run.at("status");
    const std::string backend = run.at("backend");
    const Scheme scheme = parse_scheme(run.at("scheme").get<std::string>());
    EXPECT_TRUE(status == "ok" || status == "unsupported") << status;
    // What must run: the baselines (FP8 ones from SM89 on), qgemm and qdq always, qgemm-codes
    // exactly where the scheme quantizes its activations. MoE cases (16-bit activations here):
    // qgemm (Engine::moe_gemm_grouped, SM90), qdq and cublas-bf16, grouped; no FP8 or codes form.
    const bool fp8 = backend.rfind("cublaslt-fp8", 0) == 0;
    if (run.at("kind") == "moe") {
      EXPECT_FALSE(scheme.activation.is_quantized());
      const bool grouped = backend == "qgemm" || backend == "qdq" || backend == "cublas-bf16";
      if (backend != "qgemm" || device.major == 9)
        EXPECT_EQ(status, grouped ? "ok" : "unsupported");
    } else if (backend == "qgemm-codes") {
      EXPECT_EQ(status, scheme.activation.is_quantized() ? "ok" : "unsupported");
    } else if (!fp8 || device.major * 10 + device.minor >= 89) {
      EXPECT_EQ(status, "ok");
    }
    if (status != "ok") {
      EXPECT_TRUE(run.at("reason").is_string());
      continue;
    }
    ++ok;
    const json& us = run.at("us");
    EXPECT_TRUE(finite_positive(us.at("median")));
    EXPECT_TRUE(finite_positive(us.at("min")));
    EXPECT_LE(us.at("min").get<double>(), us.at("median").get<double>());
    EXPECT_LE(us.at("median").get<double>(), us.at("max").get<double>());
    EXPECT_EQ(us.at("samples"), recipe.repeats);
    EXPECT_TRUE(finite_positive(run.at("tflops")));
    EXPECT_TRUE(finite_positive(run.at("first_call_ms")));
    EXPECT_TRUE(finite_positive(run.at("weight_device_bytes")));
    EXPECT_FALSE(run.at("kernel").get<std::string>().empty());
    const json& error = run.at("error");
    EXPECT_TRUE(error.at("rel_frobenius").is_number());
    EXPECT_LE(error.at("rel_frobenius").get<double>(), error.at("tolerance").get<double>());
    EXPECT_GT(error.at("rows").get<int>(), 0);
    if (backend != "cublas-bf16") EXPECT_TRUE(finite_positive(run.at("speedup_vs_cublas_bf16")));
  }
  return ok;
}

TEST(BenchCliGpu, QuickstartTimesEveryRunWithinTolerance) {
  QGEMM_REQUIRE_GPU();
  const auto dir = fresh_dir("qgemm_bench_gpu");
  const auto recipe_path = reduced_recipe(kRecipeDir + "quickstart.yaml", dir);
  const CommandResult r =
      run_cli("bench '" + recipe_path.string() + "' --json '" + (dir / "out.json").string() +
              "' --csv '" + (dir / "out.csv").string() + "'");
  std::printf("%s\n", r.output.c_str());  // the table and progress, for the log
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(dir / "out.json");
  const json doc = json::parse(in);
  const Recipe recipe = load_recipe(recipe_path.string());
  EXPECT_GT(check_document(doc, recipe), 0);
  EXPECT_TRUE(std::filesystem::file_size(dir / "out.csv") > 0);
  std::filesystem::remove_all(dir);
}

TEST(BenchCliGpu, GraphAndWarmModesTimeEveryBackend) {
  QGEMM_REQUIRE_GPU();
  const auto dir = fresh_dir("qgemm_bench_modes");
  const std::string text =
      "name: modes\nbackends: [qgemm, cublas-bf16, cublaslt-fp8, cublaslt-fp8-exact, qdq]\n"
      "cases:\n  - scheme: w4a16\n    n: 1024\n    k: 2048\n    m: [1, 48, 320]\n";
  std::ofstream(dir / "modes.yaml") << text;
  for (const std::string timing : {"graph", "warm"}) {
    SCOPED_TRACE(timing);
    const auto path = reduced_recipe((dir / "modes.yaml").string(), dir, timing);
    const CommandResult r =
        run_cli("bench '" + path.string() + "' --json '" + (dir / "out.json").string() + "'");
    std::printf("%s\n", r.output.c_str());
    ASSERT_EQ(r.status, 0) << r.output;
    std::ifstream in(dir / "out.json");
    const json doc = json::parse(in);
    EXPECT_EQ(doc.at("recipe").at("timing"), timing);
    EXPECT_EQ(check_document(doc, load_recipe(path.string())), 15);
  }
  std::filesystem::remove_all(dir);
}

TEST(TuneCliGpu, WritesATableForThisMachineThatTheEngineFollows) {
  QGEMM_REQUIRE_GPU();
  const auto dir = fresh_dir("qgemm_tune_gpu");
  const std::int64_t n = 1024, k = 2048;
  std::ofstream(dir / "tune.yaml")
      << "name: tune\nrepeats: 3\nwarmup: 1\ncases:\n"
      << "  - scheme: w4a16\n    n: " << n << "\n    k: " << k << "\n    m: [1, 256]\n";
  const auto table_path = dir / "table.json";
  const CommandResult r =
      run_cli("tune '" + (dir / "tune.yaml").string() + "' --out '" + table_path.string() +
              "' --report '" + (dir / "report.json").string() + "'");
  std::printf("%s\n", r.output.c_str());
  ASSERT_EQ(r.status, 0) << r.output;

  const dispatch::TuningTable table = dispatch::load_tuning_table(table_path.string());
  EXPECT_EQ(table.machine, dispatch::machine_key(runtime::device_info(0)));
  std::set<std::int64_t> buckets;
  for (const auto& entry : table.entries) buckets.insert(entry.key.m_bucket);
  EXPECT_EQ(buckets, (std::set<std::int64_t>{1, 256}));

  std::ifstream report_in(dir / "report.json");
  const json report = json::parse(report_in);
  std::set<std::string> statuses;
  for (const json& candidate : report.at("candidates")) {
    statuses.insert(candidate.at("status").get<std::string>());
    if (candidate.at("status") == "ok")
      EXPECT_TRUE(candidate.at("error").is_number()) << candidate.dump();
    if (candidate.at("status") == "skipped")
      EXPECT_FALSE(candidate.at("reason").get<std::string>().empty()) << candidate.dump();
  }
  EXPECT_TRUE(statuses.count("ok"));
  EXPECT_TRUE(statuses.count("skipped"));  // the streamed configs cannot serve M = 256
  EXPECT_FALSE(statuses.count("failed")) << report.dump(1);
  EXPECT_FALSE(statuses.count("hang")) << report.dump(1);

  // The Engine follows the table: its choice for each tuned bucket is the table's candidate.
  Engine engine(0);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> values(static_cast<std::size_t>(n * k));
  for (float& v : values) v = normal(rng);
  const QuantWeight weight =
      engine.prepare_weight(quantize_weight(parse_scheme("w4a16").weight, values.data(), n, k));
  use_tuning_table(table_path.string());
  for (const auto& entry : table.entries) {
    const GemmProblem problem = gemm_problem(weight, entry.key.m_bucket, formats::bf16, formats::bf16);
    const GemmPlan::Choice choice =
        engine.plan(problem, weight).choice_for(entry.key.m_bucket);
    EXPECT_EQ(choice.candidate, entry.config);
    EXPECT_NE(choice.reason.find("tuning table"), std::string::npos) << choice.reason;
  }
  use_tuning_table("");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qgemm::bench
