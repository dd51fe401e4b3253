#include "bench/results.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

using nlohmann::json;

template <typename T>
json or_null(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

json text_or_null(const std::string& text) { return text.empty() ? json(nullptr) : json(text); }

// The ok run of `backend` for the same case and M as `run`, or null.
const RunResult* same_call(const BenchDocument& document, const RunResult& run, Backend backend) {
  for (const RunResult& other : document.runs)
    if (other.backend == backend && other.case_index == run.case_index && other.m == run.m &&
        other.status == RunStatus::Ok && other.time)
      return &other;
  return nullptr;
}

std::optional<double> ratio(std::optional<double> numerator, std::optional<double> denominator) {
  if (!numerator || !denominator || !(*denominator > 0)) return std::nullopt;
  return *numerator / *denominator;
}

// For people: 3 significant digits, or "-" for a missing value.
std::string short_number(std::optional<double> value, const char* format = "{:.3g}") {
  return value ? fmt::format(fmt::runtime(format), *value) : "-";
}

}  // namespace

std::string to_string(RunStatus status) {
  switch (status) {
    case RunStatus::Ok: return "ok";
    case RunStatus::Unsupported: return "unsupported";
    case RunStatus::Failed: return "failed";
    case RunStatus::Skipped: return "skipped";
  }
  throw Error(ErrorCode::Internal, "run status out of range");
}

TimingStats summarize(std::vector<double> samples_us) {
  require(!samples_us.empty(), "timing: no samples (rule: at least one timed run)");
  for (double sample : samples_us)
    require(std::isfinite(sample) && sample > 0, "timing: sample {} µs (rule: finite and > 0)",
            sample);
  std::sort(samples_us.begin(), samples_us.end());
  const std::size_t count = samples_us.size();
  TimingStats stats;
  // The middle value, or the mean of the two middle values for an even count.
  stats.median_us =
      count % 2 ? samples_us[count / 2] : 0.5 * (samples_us[count / 2 - 1] + samples_us[count / 2]);
  stats.min_us = samples_us.front();
  stats.max_us = samples_us.back();
  stats.samples = static_cast<int>(count);
  return stats;
}

RunResult make_run_result(const ExpandedRun& run) {
  const RecipeCase& c = *run.recipe_case;
  RunResult result;
  result.case_index = run.case_index;
  result.label = c.label;
  result.scheme = c.scheme_text;
  result.scheme_text = qgemm::to_string(c.scheme);
  result.kind = c.kind;
  if (c.kind == CaseKind::Moe) result.experts = c.experts, result.top_k = c.top_k;
  result.m = run.m;
  result.n = c.n;
  result.k = c.k;
  result.backend = run.backend;
  return result;
}

bool fp8_is_an_alternative(const Scheme& scheme) {
  const Format& w = scheme.weight.format;
  return w.is_float() && w.bits == 8;
}

Backend fp8_alternative(const Scheme& scheme) {
  return scheme.activation.scaling == ActivationScaling::DynamicGroup ? Backend::CublasLtFp8Exact
                                                                       : Backend::CublasLtFp8;
}

namespace {
bool is_fp8_baseline(Backend backend) {
  return backend == Backend::CublasLtFp8 || backend == Backend::CublasLtFp8Exact;
}
}  // namespace

DerivedFigures derive(const RunResult& run, const BenchDocument& document) {
  const PeakRates& peaks = document.peaks;
  DerivedFigures figures;
  // MoE: each token's row goes through top_k distinct experts (at most all of them).
  const double rows_per_token =
      run.kind == CaseKind::Moe ? std::min(run.top_k, run.experts) : 1;
  figures.flops = 2.0 * static_cast<double>(run.m) * rows_per_token * static_cast<double>(run.n) *
                  static_cast<double>(run.k);
  figures.min_bytes =
      static_cast<double>(run.weight_bytes + run.activation_bytes + run.output_bytes);
  figures.arithmetic_intensity = figures.min_bytes > 0 ? figures.flops / figures.min_bytes : 0;
  if (run.status != RunStatus::Ok || !run.time) return figures;
  const double seconds = run.time->median_us * 1e-6;
  figures.tflops = figures.flops / seconds * 1e-12;
  figures.weight_gbps = static_cast<double>(run.weight_bytes) / seconds * 1e-9;
  figures.memory_gbps = figures.min_bytes / seconds * 1e-9;
  figures.share_copy_bandwidth = ratio(figures.memory_gbps, peaks.copy_gbps);
  figures.share_bf16_peak = ratio(figures.tflops, peaks.bf16_tflops);
  figures.share_fp8_peak = ratio(figures.tflops, peaks.fp8_tflops);
  if (const RunResult* cublas_bf16 = same_call(document, run, Backend::CublasBf16))
    figures.speedup_vs_cublas_bf16 = cublas_bf16->time->median_us / run.time->median_us;
  if (run.backend == Backend::Qgemm) {
    // Each alternative against the qgemm run that takes the same input: qdq the bf16
    // activations, cuBLASLt FP8 codes quantized beforehand (qgemm-codes where it ran).
    std::vector<Backend> alternatives = {Backend::Qdq};
    const Scheme scheme = parse_scheme(run.scheme_text);
    if (fp8_is_an_alternative(scheme)) alternatives.push_back(fp8_alternative(scheme));
    for (Backend backend : alternatives) {
      const RunResult* other = same_call(document, run, backend);
      if (!other) continue;
      const RunResult* codes =
          is_fp8_baseline(backend) ? same_call(document, run, Backend::QgemmCodes) : nullptr;
      const RunResult& ours = codes ? *codes : run;
      double ratio = ours.time->median_us / other->time->median_us;
      for (const auto& [paired, paired_ratio] : ours.paired_ratios)
        if (paired == backend) ratio = paired_ratio;
      if (!figures.vs_alternative || ratio > *figures.vs_alternative) {
        figures.vs_alternative = ratio;
        figures.alternative = backend;
      }
    }
  }
  if (run.dequant_us && *run.dequant_us > 0)
    figures.dequant_tbps =
        (static_cast<double>(run.weight_bytes) + 2.0 * run.n * run.k) / *run.dequant_us * 1e-6;
  return figures;
}

BenchDocument make_document(const Recipe& recipe, std::uint64_t seed) {
  BenchDocument document;
  document.recipe_name = recipe.name;
  document.recipe_source = recipe.source;
  document.timing = recipe.timing;
  document.repeats = recipe.repeats;
  document.warmup = recipe.warmup;
  document.backends = recipe.backends;
  document.seed = seed;
  return document;
}

std::string to_json_text(const BenchDocument& document) {
  json doc;
  doc["format"] = "qgemm-bench";
  doc["format_version"] = 1;
  json backends = json::array();
  for (Backend backend : document.backends) backends.push_back(to_string(backend));
  doc["recipe"] = {{"name", document.recipe_name},
                   {"source", document.recipe_source},
                   {"timing", to_string(document.timing)},
                   {"repeats", document.repeats},
                   {"warmup", document.warmup},
                   {"backends", backends}};
  doc["seed"] = document.seed;
  doc["tuning_table"] = text_or_null(document.tuning_table);
  doc["started_at"] = document.started_at;
  doc["elapsed_s"] = document.elapsed_s;
  const MachineInfo& m = document.machine;
  doc["machine"] = {{"gpu", m.gpu},
                    {"compute_capability", m.compute_capability},
                    {"sm_count", m.sm_count},
                    {"sm_clock_mhz", m.sm_clock_mhz},
                    {"memory_clock_mhz", m.memory_clock_mhz},
                    {"memory_bus_bits", m.memory_bus_bits},
                    {"l2_bytes", m.l2_bytes},
                    {"memory_bytes", m.memory_bytes},
                    {"cuda_runtime", m.cuda_runtime},
                    {"cuda_driver", m.cuda_driver},
                    {"driver", m.driver},
                    {"nvrtc", m.nvrtc},
                    {"cublas", m.cublas},
                    {"qgemm", m.qgemm},
                    {"host_cpu", m.host_cpu}};
  const PeakRates& p = document.peaks;
  doc["peaks"] = {{"copy_gbps", or_null(p.copy_gbps)},
                  {"copy_bytes", p.copy_bytes},
                  {"bf16_tflops", or_null(p.bf16_tflops)},
                  {"fp8_tflops", or_null(p.fp8_tflops)},
                  {"gemm_size", p.gemm_size},
                  {"problems", p.problems}};

  json runs = json::array();
  for (const RunResult& run : document.runs) {
    const DerivedFigures f = derive(run, document);
    json row = {{"case", run.case_index},
                {"label", run.label},
                {"scheme", run.scheme},
                {"scheme_text", run.scheme_text},
                {"kind", to_string(run.kind)},
                {"m", run.m},
                {"n", run.n},
                {"k", run.k},
                {"experts", run.kind == CaseKind::Moe ? json(run.experts) : json(nullptr)},
                {"top_k", run.kind == CaseKind::Moe ? json(run.top_k) : json(nullptr)},
                {"backend", to_string(run.backend)},
                {"status", to_string(run.status)},
                {"reason", text_or_null(run.reason)},
                {"kernel", text_or_null(run.kernel)}};
    row["us"] = run.time ? json{{"median", run.time->median_us},
                                {"min", run.time->min_us},
                                {"max", run.time->max_us},
                                {"samples", run.time->samples}}
                         : json(nullptr);
    row["tflops"] = or_null(f.tflops);
    row["weight_gbps"] = or_null(f.weight_gbps);
    row["memory_gbps"] = or_null(f.memory_gbps);
    row["flops"] = f.flops;
    row["min_bytes"] = f.min_bytes;
    row["arithmetic_intensity"] = f.arithmetic_intensity;
    row["share"] = {{"copy_bandwidth", or_null(f.share_copy_bandwidth)},
                    {"bf16_peak", or_null(f.share_bf16_peak)},
                    {"fp8_peak", or_null(f.share_fp8_peak)}};
    row["speedup_vs_cublas_bf16"] = or_null(f.speedup_vs_cublas_bf16);
    row["vs_alternative"] = or_null(f.vs_alternative);
    row["alternative"] = f.alternative ? json(to_string(*f.alternative)) : json(nullptr);
    row["dequant_us"] = or_null(run.dequant_us);
    row["dequant_tbps"] = or_null(f.dequant_tbps);
    json paired = json::object();
    for (const auto& [backend, ratio] : run.paired_ratios) paired[to_string(backend)] = ratio;
    row["paired_ratios"] = std::move(paired);
    row["error"] = {{"rel_frobenius", or_null(run.error)},
                    {"tolerance", or_null(run.tolerance)},
                    {"rows", run.error_rows},
                    {"cols", run.error_cols}};
    row["first_call_ms"] = or_null(run.first_call_ms);
    row["warm_call_ms"] = or_null(run.warm_call_ms);
    row["weight_bytes"] = run.weight_bytes;
    row["weight_device_bytes"] = or_null(run.weight_device_bytes);
    row["activation_seed"] = run.activation_seed;
    runs.push_back(std::move(row));
  }
  doc["runs"] = std::move(runs);
  return doc.dump(2) + "\n";
}

std::string to_csv(const BenchDocument& document) {
  auto quoted = [](const std::string& text) {
    std::string out = "\"";
    for (char ch : text) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return out + "\"";
  };
  auto cell = [](const std::optional<double>& value) {
    return value ? fmt::format("{:.6g}", *value) : std::string();
  };
  std::string out =
      "case,label,scheme,kind,m,n,k,backend,status,reason,kernel,median_us,min_us,max_us,"
      "samples,tflops,weight_gbps,memory_gbps,share_copy_bandwidth,share_bf16_peak,"
      "share_fp8_peak,speedup_vs_cublas_bf16,vs_alternative,alternative,dequant_us,"
      "dequant_tbps,error,tolerance,first_call_ms,warm_call_ms,weight_bytes,"
      "weight_device_bytes\n";
  for (const RunResult& run : document.runs) {
    const DerivedFigures f = derive(run, document);
    const std::optional<double> median =
        run.time ? std::optional<double>(run.time->median_us) : std::nullopt;
    const std::optional<double> min =
        run.time ? std::optional<double>(run.time->min_us) : std::nullopt;
    const std::optional<double> max =
        run.time ? std::optional<double>(run.time->max_us) : std::nullopt;
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},"
        "{}\n",
        run.case_index, quoted(run.label), quoted(run.scheme), to_string(run.kind), run.m, run.n,
        run.k, to_string(run.backend), to_string(run.status), quoted(run.reason),
        quoted(run.kernel), cell(median), cell(min), cell(max),
        run.time ? std::to_string(run.time->samples) : std::string(), cell(f.tflops),
        cell(f.weight_gbps), cell(f.memory_gbps), cell(f.share_copy_bandwidth),
        cell(f.share_bf16_peak), cell(f.share_fp8_peak), cell(f.speedup_vs_cublas_bf16),
        cell(f.vs_alternative), f.alternative ? to_string(*f.alternative) : std::string(),
        cell(run.dequant_us), cell(f.dequant_tbps),
        cell(run.error), cell(run.tolerance), cell(run.first_call_ms), cell(run.warm_call_ms),
        run.weight_bytes,
        run.weight_device_bytes ? std::to_string(*run.weight_device_bytes) : std::string());
  }
  return out;
}

std::vector<std::vector<std::string>> summary_rows(const BenchDocument& document) {
  std::vector<std::vector<std::string>> rows = {{"case", "M", "backend", "median us", "min", "max",
                                                 "TFLOPS", "weight GB/s", "% copy BW",
                                                 "x cublas-bf16", "vs alt", "error", "status"}};
  for (const RunResult& run : document.runs) {
    const DerivedFigures f = derive(run, document);
    std::string status = to_string(run.status);
    if (!run.reason.empty()) status += ": " + run.reason;
    if (run.dequant_us)
      status += fmt::format(" (dequant {:.1f} us, {} TB/s)", *run.dequant_us,
                            short_number(f.dequant_tbps, "{:.2f}"));
    const std::optional<double> share = f.share_copy_bandwidth
                                            ? std::optional<double>(100 * *f.share_copy_bandwidth)
                                            : std::nullopt;
    rows.push_back({run.label, std::to_string(run.m), to_string(run.backend),
                    run.time ? fmt::format("{:.2f}", run.time->median_us) : "-",
                    run.time ? fmt::format("{:.2f}", run.time->min_us) : "-",
                    run.time ? fmt::format("{:.2f}", run.time->max_us) : "-",
                    short_number(f.tflops), short_number(f.weight_gbps, "{:.0f}"),
                    short_number(share, "{:.0f}"), short_number(f.speedup_vs_cublas_bf16, "{:.2f}"),
                    short_number(f.vs_alternative, "{:.2f}"), short_number(run.error, "{:.1e}"),
                    status});
  }
  return rows;
}

std::vector<std::string> gate_violations(const BenchDocument& document, double ratio) {
  std::vector<std::string> lines;
  for (const RunResult& run : document.runs) {
    if (run.backend != Backend::Qgemm) continue;
    const DerivedFigures f = derive(run, document);
    if (!f.vs_alternative || *f.vs_alternative <= ratio) continue;
    const RunResult* other = same_call(document, run, *f.alternative);
    const RunResult* codes =
        is_fp8_baseline(*f.alternative) ? same_call(document, run, Backend::QgemmCodes) : nullptr;
    const RunResult& ours = codes ? *codes : run;
    lines.push_back(fmt::format("{} M={}: {} {:.2f} us, {} {:.2f} us: ratio {:.3f} ({})",
                                run.label, run.m, to_string(ours.backend), ours.time->median_us,
                                to_string(*f.alternative), other->time->median_us,
                                *f.vs_alternative, ours.kernel));
  }
  return lines;
}

}  // namespace qgemm::bench
