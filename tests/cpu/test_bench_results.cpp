// Tests of the `qgemm bench` result document (tools/harness/bench/results.hpp): statistics, the JSON
// schema and its derived figures, the CSV, all from synthetic timings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench/results.hpp"
#include "cpu/bench_test_support.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

using nlohmann::json;

TEST(BenchResults, SummarizeGivesMedianMinMax) {
  const TimingStats odd = summarize({5.0, 1.0, 3.0});
  EXPECT_EQ(odd.median_us, 3.0);
  EXPECT_EQ(odd.min_us, 1.0);
  EXPECT_EQ(odd.max_us, 5.0);
  EXPECT_EQ(odd.samples, 3);
  const TimingStats even = summarize({4.0, 1.0, 2.0, 10.0});
  EXPECT_EQ(even.median_us, 3.0);  // the mean of the two middle values
  EXPECT_EQ(even.samples, 4);
}

TEST(BenchResults, SummarizeRejectsSamplesATimerCannotProduce) {
  EXPECT_THROW(summarize({}), Error);
  EXPECT_THROW(summarize({1.0, 0.0}), Error);
  EXPECT_THROW(summarize({1.0, -2.0}), Error);
  EXPECT_THROW(summarize({1.0, std::numeric_limits<double>::quiet_NaN()}), Error);
  EXPECT_THROW(summarize({std::numeric_limits<double>::infinity()}), Error);
}

void expect_number_or_null(const json& value, bool number, const std::string& where) {
  if (number) {
    ASSERT_TRUE(value.is_number()) << where << ": " << value.dump();
    EXPECT_TRUE(std::isfinite(value.get<double>())) << where;
    EXPECT_GT(value.get<double>(), 0.0) << where;
  } else {
    EXPECT_TRUE(value.is_null()) << where << ": " << value.dump();
  }
}

TEST(BenchResults, JsonHasTheDocumentedSchemaForEveryRun) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Recipe recipe = load_recipe(test::kRecipeDir + "quickstart.yaml");
  const BenchDocument document = test::synthetic_document(recipe, seed);
  const json doc = json::parse(to_json_text(document));

  EXPECT_EQ(doc.at("format"), "qgemm-bench");
  EXPECT_EQ(doc.at("format_version"), 1);
  EXPECT_EQ(doc.at("recipe").at("name"), recipe.name);
  EXPECT_EQ(doc.at("recipe").at("timing"), "cold-l2");
  EXPECT_EQ(doc.at("recipe").at("repeats"), recipe.repeats);
  EXPECT_EQ(doc.at("recipe").at("backends").size(), recipe.backends.size());
  EXPECT_EQ(doc.at("seed").get<std::uint64_t>(), seed);
  EXPECT_TRUE(doc.at("started_at").is_string());
  EXPECT_TRUE(doc.at("tuning_table").is_null());  // none in the synthetic run
  EXPECT_TRUE(doc.at("elapsed_s").is_number());
  for (const char* key : {"gpu", "compute_capability", "cuda_runtime", "cuda_driver", "driver",
                          "nvrtc", "cublas", "qgemm", "host_cpu"})
    EXPECT_TRUE(doc.at("machine").at(key).is_string()) << key;
  for (const char* key : {"sm_count", "sm_clock_mhz", "memory_clock_mhz", "memory_bus_bits",
                          "l2_bytes", "memory_bytes"})
    EXPECT_TRUE(doc.at("machine").at(key).is_number()) << key;
  for (const char* key : {"copy_gbps", "bf16_tflops", "fp8_tflops", "copy_bytes", "gemm_size"})
    EXPECT_TRUE(doc.at("peaks").at(key).is_number()) << key;
  EXPECT_TRUE(doc.at("peaks").at("problems").is_array());

  const json& runs = doc.at("runs");
  ASSERT_EQ(runs.size(), expand(recipe).size());
  // The cublas-bf16 median of each (case, M), from the inputs, for the speedups.
  std::map<std::pair<std::size_t, std::int64_t>, double> baseline;
  for (const RunResult& run : document.runs)
    if (run.backend == Backend::CublasBf16 && run.time)
      baseline[{run.case_index, run.m}] = run.time->median_us;
  std::map<std::string, int> statuses;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const json& run = runs[i];
    const RunResult& source = document.runs[i];
    const std::string where = "runs[" + std::to_string(i) + "]";
    for (const char* key : {"label", "scheme", "scheme_text", "kind", "backend", "status"})
      EXPECT_TRUE(run.at(key).is_string()) << where << "." << key;
    for (const char* key : {"case", "m", "n", "k", "weight_bytes", "activation_seed", "flops",
                            "min_bytes", "arithmetic_intensity"})
      EXPECT_TRUE(run.at(key).is_number()) << where << "." << key;
    const std::string status = run.at("status");
    ++statuses[status];
    const bool ok = status == "ok";
    EXPECT_EQ(run.at("reason").is_null(), ok) << where;
    EXPECT_EQ(run.at("kernel").is_string(), ok) << where;
    if (ok) {
      const json& us = run.at("us");
      for (const char* key : {"median", "min", "max", "samples"})
        expect_number_or_null(us.at(key), true, where + ".us." + key);
      EXPECT_LE(us.at("min").get<double>(), us.at("median").get<double>());
      EXPECT_LE(us.at("median").get<double>(), us.at("max").get<double>());
    } else {
      EXPECT_TRUE(run.at("us").is_null()) << where;
    }
    for (const char* key : {"tflops", "weight_gbps", "memory_gbps", "first_call_ms", "warm_call_ms",
                            "weight_device_bytes"})
      expect_number_or_null(run.at(key), ok, where + "." + key);
    for (const char* key : {"copy_bandwidth", "bf16_peak", "fp8_peak"})
      expect_number_or_null(run.at("share").at(key), ok, where + ".share." + key);
    for (const char* key : {"rel_frobenius", "tolerance"})
      expect_number_or_null(run.at("error").at(key), ok, where + ".error." + key);
    EXPECT_TRUE(run.at("error").at("rows").is_number());

    // The derived figures, recomputed here from the definitions in results.hpp.
    const bool moe = source.kind == CaseKind::Moe;
    const double flops = 2.0 * source.m * (moe ? std::min(source.top_k, source.experts) : 1) *
                         source.n * source.k;
    EXPECT_EQ(run.at("experts").is_null(), !moe) << where;
    if (moe) EXPECT_EQ(run.at("top_k").get<int>(), source.top_k) << where;
    const double bytes =
        static_cast<double>(source.weight_bytes + source.activation_bytes + source.output_bytes);
    EXPECT_DOUBLE_EQ(run.at("flops").get<double>(), flops);
    EXPECT_DOUBLE_EQ(run.at("min_bytes").get<double>(), bytes);
    EXPECT_DOUBLE_EQ(run.at("arithmetic_intensity").get<double>(), flops / bytes);
    const auto base = baseline.find({source.case_index, source.m});
    if (ok) {
      const double seconds = source.time->median_us * 1e-6;
      EXPECT_NEAR(run.at("tflops").get<double>(), flops / seconds / 1e12, 1e-9 * flops / seconds);
      EXPECT_NEAR(run.at("weight_gbps").get<double>(), source.weight_bytes / seconds / 1e9, 1e-6);
      EXPECT_NEAR(run.at("share").at("copy_bandwidth").get<double>(),
                  bytes / seconds / 1e9 / 3900.0, 1e-9);
      EXPECT_NEAR(run.at("share").at("bf16_peak").get<double>(), flops / seconds / 1e12 / 720.0,
                  1e-9);
      ASSERT_NE(base, baseline.end()) << where;
      EXPECT_NEAR(run.at("speedup_vs_cublas_bf16").get<double>(),
                  base->second / source.time->median_us, 1e-12);
    } else {
      EXPECT_TRUE(run.at("speedup_vs_cublas_bf16").is_null()) << where;
    }
  }
  // quickstart.yaml has a MoE case (skipped) and a W8A8 case (qgemm unsupported here).
  EXPECT_GT(statuses["ok"], 0);
  EXPECT_GT(statuses["skipped"], 0);
  EXPECT_GT(statuses["unsupported"], 0);
}

TEST(BenchResults, SharesAreNullWhenAPeakIsMissing) {
  const Recipe recipe = load_recipe(test::kRecipeDir + "quickstart.yaml");
  BenchDocument document = test::synthetic_document(recipe, 3);
  document.peaks.fp8_tflops.reset();
  document.peaks.problems.push_back("cuBLASLt FP8 rate: no algorithm");
  const json doc = json::parse(to_json_text(document));
  EXPECT_TRUE(doc.at("peaks").at("fp8_tflops").is_null());
  EXPECT_EQ(doc.at("peaks").at("problems").size(), 1u);
  for (const json& run : doc.at("runs")) {
    EXPECT_TRUE(run.at("share").at("fp8_peak").is_null());
    if (run.at("status") == "ok") EXPECT_TRUE(run.at("share").at("bf16_peak").is_number());
  }
}

// Splits one CSV line into fields (quoted fields may hold commas and doubled quotes).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted && ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += ch;
    }
  }
  return fields;
}

TEST(BenchResults, CsvHasOneRowPerRunWithTheHeaderColumns) {
  const Recipe recipe = load_recipe(test::kRecipeDir + "quickstart.yaml");
  BenchDocument document = test::synthetic_document(recipe, 5);
  document.runs[0].label = "a, \"quoted\" label";
  std::istringstream csv(to_csv(document));
  std::string line;
  ASSERT_TRUE(std::getline(csv, line));
  const std::vector<std::string> header = csv_fields(line);
  EXPECT_EQ(header.front(), "case");
  std::size_t rows = 0;
  while (std::getline(csv, line)) {
    const std::vector<std::string> fields = csv_fields(line);
    ASSERT_EQ(fields.size(), header.size()) << line;
    const RunResult& run = document.runs[rows];
    EXPECT_EQ(fields[1], run.label);
    EXPECT_EQ(fields[8], to_string(run.status));
    if (run.time)  // 6 significant digits
      EXPECT_NEAR(std::stod(fields[11]), run.time->median_us, 1e-5 * run.time->median_us);
    else
      EXPECT_EQ(fields[11], "");
    ++rows;
  }
  EXPECT_EQ(rows, document.runs.size());
}

TEST(BenchResults, SummaryRowsSayWhyARunWasNotTimed) {
  const Recipe recipe = load_recipe(test::kRecipeDir + "quickstart.yaml");
  const BenchDocument document = test::synthetic_document(recipe, 9);
  const auto rows = summary_rows(document);
  ASSERT_EQ(rows.size(), document.runs.size() + 1);
  for (std::size_t i = 0; i < document.runs.size(); ++i) {
    const RunResult& run = document.runs[i];
    const std::string& status = rows[i + 1].back();
    EXPECT_EQ(status.rfind(to_string(run.status), 0), 0u) << status;
    if (!run.reason.empty()) EXPECT_NE(status.find(run.reason), std::string::npos) << status;
  }
}

// The never-slower gate compares qgemm's pre-quantized call with the cuBLASLt FP8 baseline that
// computes the same product: fp32-promoted accumulation (cublaslt-fp8-exact) for block-scaled
// activations, fast accumulation otherwise. A qgemm run within 1.10 of the first but not of the
// second passes for fp8-block and fails for w8a8-fp8.
TEST(BenchResults, GateComparesBlockScaledSchemesWithPromotedAccumulation) {
  const Recipe recipe = parse_recipe(
      "name: gate\nbackends: [qgemm, qgemm-codes, qdq, cublaslt-fp8, cublaslt-fp8-exact]\n"
      "cases:\n  - scheme: fp8-block\n    n: 1024\n    k: 1024\n    m: [256]\n"
      "  - scheme: w8a8-fp8\n    n: 1024\n    k: 1024\n    m: [256]\n",
      "gate.yaml");
  EXPECT_EQ(fp8_alternative(recipe.cases[0].scheme), Backend::CublasLtFp8Exact);
  EXPECT_EQ(fp8_alternative(recipe.cases[1].scheme), Backend::CublasLtFp8);
  BenchDocument document = make_document(recipe, 1);
  // Times (µs): fast 50, promoted 62, qgemm-codes 66, qgemm (bf16 in) 70, qdq 300.
  const std::map<Backend, double> times = {{Backend::CublasLtFp8, 50.0},
                                           {Backend::CublasLtFp8Exact, 62.0},
                                           {Backend::QgemmCodes, 66.0},
                                           {Backend::Qgemm, 70.0},
                                           {Backend::Qdq, 300.0}};
  for (const ExpandedRun& run : expand(recipe)) {
    RunResult result = make_run_result(run);
    result.status = RunStatus::Ok;
    result.time = summarize({times.at(run.backend)});
    document.runs.push_back(result);
  }
  const std::vector<std::string> violations = gate_violations(document, 1.10);
  ASSERT_EQ(violations.size(), 1u) << (violations.empty() ? "" : violations[0]);
  EXPECT_NE(violations[0].find("w8a8-fp8"), std::string::npos) << violations[0];
  EXPECT_NE(violations[0].find("cublaslt-fp8 50.00"), std::string::npos) << violations[0];
  for (const RunResult& run : document.runs)
    if (run.backend == Backend::Qgemm) {
      const DerivedFigures f = derive(run, document);
      ASSERT_TRUE(f.alternative.has_value());
      EXPECT_NEAR(*f.vs_alternative, run.scheme == "fp8-block" ? 66.0 / 62.0 : 66.0 / 50.0, 1e-9);
    }
}

}  // namespace
}  // namespace qgemm::bench
