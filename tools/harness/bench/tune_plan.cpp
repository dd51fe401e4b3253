#include "bench/tune_plan.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "dispatch/select.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

using nlohmann::json;

struct NamedStatus {
  const char* name;
  CandidateStatus status;
};
constexpr NamedStatus kStatusNames[] = {{"ok", CandidateStatus::Ok},
                                        {"skipped", CandidateStatus::Skipped},
                                        {"failed", CandidateStatus::Failed},
                                        {"hang", CandidateStatus::Hang}};

json to_json(const CandidateResult& result) {
  json out = {
      {"status", to_string(result.status)}, {"reason", result.reason}, {"kernel", result.kernel}};
  out["us"] = result.time ? json{{"median", result.time->median_us},
                                 {"min", result.time->min_us},
                                 {"max", result.time->max_us},
                                 {"samples", result.time->samples}}
                          : json(nullptr);
  out["error"] = result.error ? json(*result.error) : json(nullptr);
  return out;
}

[[noreturn]] void bad_line(const std::string& line, const std::string& rule) {
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("tune worker line '{}': {}", line.substr(0, 200), rule));
}

CandidateResult result_from_json(const json& object, const std::string& line) {
  if (!object.is_object()) bad_line(line, "result must be an object");
  CandidateResult result;
  const std::string status = object.value("status", "");
  bool found = false;
  for (const auto& row : kStatusNames) {
    if (status == row.name) result.status = row.status, found = true;
  }
  if (!found) bad_line(line, fmt::format("'{}' is not a candidate status", status));
  result.reason = object.value("reason", "");
  result.kernel = object.value("kernel", "");
  if (object.contains("us") && !object["us"].is_null()) {
    const json& us = object["us"];
    TimingStats stats;
    stats.median_us = us.at("median").get<double>();
    stats.min_us = us.at("min").get<double>();
    stats.max_us = us.at("max").get<double>();
    stats.samples = us.at("samples").get<int>();
    if (!(stats.median_us > 0) || !std::isfinite(stats.median_us))
      bad_line(line, "us.median must be a positive finite number");
    result.time = stats;
  }
  if (object.contains("error") && object["error"].is_number())
    result.error = object["error"].get<double>();
  if (result.status == CandidateStatus::Ok && !result.time)
    bad_line(line, "an ok result needs its times");
  return result;
}

}  // namespace

std::string to_string(CandidateStatus status) {
  for (const auto& row : kStatusNames) {
    if (row.status == status) return row.name;
  }
  throw Error(ErrorCode::Internal, "candidate status out of range");
}

std::vector<TuneTask> plan_tuning(const Recipe& recipe, std::vector<std::string>* skipped) {
  std::vector<TuneTask> tasks;
  for (std::size_t i = 0; i < recipe.cases.size(); ++i) {
    const RecipeCase& c = recipe.cases[i];
    if (c.kind == CaseKind::Moe) {
      if (skipped)
        skipped->push_back(
            fmt::format("{}: MoE cases are not tuned yet (the grouped GEMM's configs are "
                        "ranked by the cost model)",
                        c.label));
      continue;
    }
    std::map<std::int64_t, std::int64_t> largest_m;  // bucket -> the largest recipe M in it
    for (std::int64_t m : c.m) {
      std::int64_t& slot = largest_m[dispatch::m_bucket(m)];
      slot = std::max(slot, m);
    }
    for (const auto& [bucket, m] : largest_m) {
      for (const dispatch::Candidate& candidate : dispatch::all_candidates())
        tasks.push_back({i, m, bucket, candidate.name});
    }
  }
  return tasks;
}

std::string compiled_line(std::size_t task) {
  return json{{"task", task}, {"phase", "compiled"}}.dump();
}

std::string result_line(std::size_t task, const CandidateResult& result) {
  return json{{"task", task}, {"result", to_json(result)}}.dump();
}

WorkerMessage parse_worker_line(const std::string& line) {
  json object;
  try {
    object = json::parse(line);
  } catch (const json::exception& error) {
    bad_line(line, fmt::format("not JSON: {}", error.what()));
  }
  if (!object.is_object() || !object.contains("task") || !object["task"].is_number_unsigned())
    bad_line(line, "needs a non-negative integer 'task'");
  WorkerMessage message;
  message.task = object["task"].get<std::size_t>();
  if (object.contains("phase")) {
    if (object["phase"] != "compiled") bad_line(line, "the only phase is 'compiled'");
    message.compiled = true;
    return message;
  }
  if (!object.contains("result")) bad_line(line, "needs 'phase' or 'result'");
  try {
    message.result = result_from_json(object["result"], line);
  } catch (const json::exception& error) {
    bad_line(line, fmt::format("malformed result: {}", error.what()));
  }
  return message;
}

std::vector<dispatch::TuningEntry> pick_winners(const Recipe& recipe,
                                                const std::vector<TuneTask>& tasks,
                                                const std::vector<CandidateResult>& results,
                                                const std::string& measured_at) {
  require(tasks.size() == results.size(),
          "pick_winners: {} tasks but {} results (rule: one result per task)", tasks.size(),
          results.size());
  std::map<std::pair<std::size_t, std::int64_t>, std::size_t> best;  // (case, bucket) -> task
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (results[i].status != CandidateStatus::Ok || !results[i].time) continue;
    const auto key = std::make_pair(tasks[i].case_index, tasks[i].bucket);
    const auto found = best.find(key);
    if (found == best.end() || results[i].time->median_us < results[found->second].time->median_us)
      best[key] = i;
  }
  std::vector<dispatch::TuningEntry> entries;
  for (const auto& [key, index] : best) {
    const RecipeCase& c = recipe.cases.at(tasks[index].case_index);
    dispatch::TuningEntry entry;
    entry.key = dispatch::make_tuning_key(c.scheme, c.n, c.k, tasks[index].m);
    entry.config = tasks[index].config;
    entry.microseconds = results[index].time->median_us;
    entry.measured_at = measured_at;
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string tune_report_json(const Recipe& recipe, const dispatch::MachineKey& machine,
                             const std::vector<TuneTask>& tasks,
                             const std::vector<CandidateResult>& results) {
  json doc;
  doc["recipe"] = {{"name", recipe.name}, {"source", recipe.source}};
  doc["machine"] = {{"gpu", machine.gpu},
                    {"sm_count", machine.sm_count},
                    {"cuda", machine.cuda},
                    {"driver", machine.driver},
                    {"qgemm", machine.qgemm}};
  json candidates = json::array();
  for (std::size_t i = 0; i < tasks.size() && i < results.size(); ++i) {
    const RecipeCase& c = recipe.cases.at(tasks[i].case_index);
    json row = to_json(results[i]);
    row["case"] = tasks[i].case_index;
    row["label"] = c.label;
    row["scheme"] = qgemm::to_string(c.scheme);
    row["n"] = c.n;
    row["k"] = c.k;
    row["m"] = tasks[i].m;
    row["bucket"] = tasks[i].bucket;
    row["config"] = tasks[i].config;
    candidates.push_back(std::move(row));
  }
  doc["candidates"] = std::move(candidates);
  return doc.dump(2) + "\n";
}

}  // namespace qgemm::bench
