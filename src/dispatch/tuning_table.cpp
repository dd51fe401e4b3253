#include "dispatch/tuning_table.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qgemm/error.hpp"
#include "qgemm/scheme.hpp"

#ifndef QGEMM_VERSION
#define QGEMM_VERSION "unknown"
#endif

namespace qgemm::dispatch {
namespace {

constexpr const char* kFormatName = "qgemm-tuning-table";
constexpr int kFormatVersion = 1;

using nlohmann::json;

bool is_timestamp(const std::string& text) {
  // "YYYY-MM-DDTHH:MM:SSZ": fixed width, so text order is time order.
  static constexpr std::string_view kPattern = "dddd-dd-ddTdd:dd:ddZ";
  if (text.size() != kPattern.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool ok = kPattern[i] == 'd' ? std::isdigit(static_cast<unsigned char>(text[i])) != 0
                                       : text[i] == kPattern[i];
    if (!ok) return false;
  }
  return true;
}

class TableReader {
 public:
  explicit TableReader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& rule) const {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tuning table {}: {}: {}", source_, field, rule));
  }

  const json& member(const json& object, const std::string& prefix, const char* name) const {
    const std::string field = prefix.empty() ? name : prefix + "." + name;
    if (!object.contains(name)) fail(field, "required field is missing");
    return object.at(name);
  }

  std::string text(const json& object, const std::string& prefix, const char* name) const {
    const json& value = member(object, prefix, name);
    const std::string field = prefix.empty() ? name : prefix + "." + name;
    if (!value.is_string()) fail(field, fmt::format("must be a string, not {}", value.dump()));
    const std::string out = value.get<std::string>();
    if (out.empty()) fail(field, "must not be empty");
    return out;
  }

  std::int64_t integer(const json& object, const std::string& prefix, const char* name,
                       std::int64_t min) const {
    const json& value = member(object, prefix, name);
    const std::string field = prefix + "." + name;
    if (!value.is_number_integer())
      fail(field, fmt::format("must be an integer, not {}", value.dump()));
    const std::int64_t out = value.get<std::int64_t>();
    if (out < min) fail(field, fmt::format("{} is below the minimum {}", out, min));
    return out;
  }

  TuningTable read(std::string_view json_text) const {
    json doc;
    try {
      doc = json::parse(json_text);
    } catch (const json::exception& error) {  // parse_error, or out_of_range for 1e999
      fail("(document)", fmt::format("not valid JSON: {}", error.what()));
    }
    if (!doc.is_object()) fail("(document)", "must be a JSON object");
    if (text(doc, "", "format") != kFormatName)
      fail("format",
           fmt::format("'{}' is not '{}'", doc["format"].get<std::string>(), kFormatName));
    const json& version = member(doc, "", "format_version");
    if (!version.is_number_integer() || version.get<std::int64_t>() != kFormatVersion)
      fail("format_version", fmt::format("{} is not a version this build reads ({})",
                                         version.dump(), kFormatVersion));

    TuningTable table;
    const json& machine = member(doc, "", "machine");
    if (!machine.is_object()) fail("machine", "must be a JSON object");
    table.machine.gpu = text(machine, "machine", "gpu");
    const std::int64_t sms = integer(machine, "machine", "sm_count", 1);
    if (sms > 1 << 20) fail("machine.sm_count", fmt::format("{} is not a plausible SM count", sms));
    table.machine.sm_count = static_cast<int>(sms);
    table.machine.cuda = text(machine, "machine", "cuda");
    table.machine.driver = text(machine, "machine", "driver");
    table.machine.qgemm = text(machine, "machine", "qgemm");

    const json& entries = member(doc, "", "entries");
    if (!entries.is_array()) fail("entries", "must be a JSON array");
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string prefix = fmt::format("entries[{}]", i);
      const json& row = entries[i];
      if (!row.is_object()) fail(prefix, "must be a JSON object");
      TuningEntry entry;
      const std::string scheme = text(row, prefix, "scheme");
      try {
        entry.key.scheme = to_string(parse_scheme(scheme));
      } catch (const Error& error) {
        fail(prefix + ".scheme", error.what());
      }
      entry.key.n = integer(row, prefix, "n", 1);
      entry.key.k = integer(row, prefix, "k", 1);
      entry.key.m_bucket = integer(row, prefix, "m_bucket", 1);
      if (m_bucket(entry.key.m_bucket) != entry.key.m_bucket)
        fail(prefix + ".m_bucket",
             fmt::format("{} is not a bucket (rule: a power of two)", entry.key.m_bucket));
      entry.config = text(row, prefix, "config");
      const json& us = member(row, prefix, "us");
      if (!us.is_number() || !(us.get<double>() > 0) || !std::isfinite(us.get<double>()))
        fail(prefix + ".us", fmt::format("{} must be a positive finite number", us.dump()));
      entry.microseconds = us.get<double>();
      entry.measured_at = text(row, prefix, "measured_at");
      if (!is_timestamp(entry.measured_at))
        fail(prefix + ".measured_at",
             fmt::format("'{}' is not a UTC time YYYY-MM-DDTHH:MM:SSZ", entry.measured_at));
      for (std::size_t j = 0; j < table.entries.size(); ++j) {
        if (table.entries[j].key == entry.key)
          fail(prefix, fmt::format("same scheme, n, k and m_bucket as entries[{}]", j));
      }
      table.entries.push_back(std::move(entry));
    }
    return table;
  }

 private:
  std::string source_;
};

}  // namespace

bool operator==(const MachineKey& a, const MachineKey& b) {
  return a.gpu == b.gpu && a.sm_count == b.sm_count && a.cuda == b.cuda && a.driver == b.driver &&
         a.qgemm == b.qgemm;
}

bool operator==(const TuningKey& a, const TuningKey& b) {
  return a.scheme == b.scheme && a.n == b.n && a.k == b.k && a.m_bucket == b.m_bucket;
}

std::string qgemm_version() { return QGEMM_VERSION; }

std::int64_t m_bucket(std::int64_t m) {
  require(m >= 1, "m_bucket: m = {} (rule: m >= 1)", m);
  require(m <= (std::int64_t{1} << 62), "m_bucket: m = {} is too large", m);
  std::int64_t bucket = 1;
  while (bucket < m) bucket <<= 1;
  return bucket;
}

TuningKey make_tuning_key(std::string_view scheme, std::int64_t n, std::int64_t k, std::int64_t m) {
  require(n >= 1 && k >= 1, "tuning key: n = {}, k = {} (rule: both >= 1)", n, k);
  return {to_string(parse_scheme(scheme)), n, k, m_bucket(m)};
}

TuningKey make_tuning_key(const Scheme& scheme, std::int64_t n, std::int64_t k, std::int64_t m) {
  require(n >= 1 && k >= 1, "tuning key: n = {}, k = {} (rule: both >= 1)", n, k);
  // to_string is canonical: parse_scheme(to_string(s)) == s, so this equals the text form key.
  return {to_string(scheme), n, k, m_bucket(m)};
}

const TuningEntry* TuningTable::find(std::string_view scheme, std::int64_t n, std::int64_t k,
                                     std::int64_t m) const {
  return find(make_tuning_key(scheme, n, k, m));
}

const TuningEntry* TuningTable::find(const TuningKey& key) const {
  for (const TuningEntry& entry : entries) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

void TuningTable::insert(TuningEntry entry) {
  for (TuningEntry& existing : entries) {
    if (existing.key == entry.key) {
      // Timestamps are fixed-width UTC text, so text order is time order; a tie goes to the
      // incoming one (a re-run of the same moment carries the latest intent).
      if (entry.measured_at >= existing.measured_at) existing = std::move(entry);
      return;
    }
  }
  entries.push_back(std::move(entry));
}

TuningTable parse_tuning_table(std::string_view json_text, const std::string& source) {
  return TableReader(source).read(json_text);
}

TuningTable load_tuning_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::IoError, fmt::format("tuning table {}: cannot open the file", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::IoError, fmt::format("tuning table {}: read failed", path));
  return parse_tuning_table(text.str(), path);
}

std::string to_json_text(const TuningTable& table) {
  json doc;
  doc["format"] = kFormatName;
  doc["format_version"] = kFormatVersion;
  doc["machine"] = {{"gpu", table.machine.gpu},
                    {"sm_count", table.machine.sm_count},
                    {"cuda", table.machine.cuda},
                    {"driver", table.machine.driver},
                    {"qgemm", table.machine.qgemm}};
  doc["entries"] = json::array();
  for (const TuningEntry& e : table.entries) {
    doc["entries"].push_back({{"scheme", e.key.scheme},
                              {"n", e.key.n},
                              {"k", e.key.k},
                              {"m_bucket", e.key.m_bucket},
                              {"config", e.config},
                              {"us", e.microseconds},
                              {"measured_at", e.measured_at}});
  }
  return doc.dump(2) + "\n";
}

void save_tuning_table(const TuningTable& table, const std::string& path) {
  const std::string text = to_json_text(table);
  // Same directory as the target so rename() stays on one filesystem (and so is atomic).
  const std::string temp = fmt::format("{}.tmp-{}", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw Error(ErrorCode::IoError,
                  fmt::format("tuning table {}: cannot create the temporary file {}", path, temp));
    out << text;
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      throw Error(ErrorCode::IoError,
                  fmt::format("tuning table {}: write to {} failed", path, temp));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    throw Error(ErrorCode::IoError,
                fmt::format("tuning table {}: cannot rename {} onto it", path, temp));
  }
}

std::string mismatch_reason(const MachineKey& table, const MachineKey& current) {
  std::string reason;
  auto clause = [&](const char* what, const std::string& theirs, const std::string& ours) {
    if (theirs == ours) return;
    reason += fmt::format("{}the table is for {} '{}' (this machine: '{}')",
                          reason.empty() ? "" : "; ", what, theirs, ours);
  };
  clause("GPU", table.gpu, current.gpu);
  clause("SM count", std::to_string(table.sm_count), std::to_string(current.sm_count));
  clause("CUDA", table.cuda, current.cuda);
  clause("driver", table.driver, current.driver);
  clause("qgemm", table.qgemm, current.qgemm);
  return reason;
}

std::optional<TuningTable> load_applicable_table(const std::string& path, const MachineKey& current,
                                                 std::string& reason) {
  TuningTable table;
  try {
    table = load_tuning_table(path);
  } catch (const Error& error) {
    reason = fmt::format("tuning table not used: {}", error.what());
    return std::nullopt;
  }
  const std::string mismatch = mismatch_reason(table.machine, current);
  if (!mismatch.empty()) {
    reason = fmt::format("tuning table {} not used: {}", path, mismatch);
    return std::nullopt;
  }
  reason = fmt::format("tuning table {} applies ({} entries)", path, table.entries.size());
  return table;
}

void merge_into(TuningTable& base, const TuningTable& incoming) {
  const std::string mismatch = mismatch_reason(incoming.machine, base.machine);
  require(mismatch.empty(), "merge: tables of different machines cannot be merged ({})", mismatch);
  for (const TuningEntry& entry : incoming.entries) base.insert(entry);
}

std::string utc_timestamp_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

}  // namespace qgemm::dispatch
