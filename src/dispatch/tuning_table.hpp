// Tuning tables: which kernel config measured fastest per (scheme, N, K, M bucket) on one
// machine. `qgemm tune` writes them; the selection layer may load one. This file is pure data and
// functions: loading, checking that a table belongs to the current machine, merging, saving.
//
// A table holds for exactly one machine: the GPU name, SM count, CUDA and driver versions and the
// qgemm version it was measured with. A table for any other machine is never applied (a config
// that won on another GPU, toolkit or qgemm build says nothing about this one); the caller gets
// the reason and the built-in heuristics serve.
//
// File format (JSON):
//   {"format": "qgemm-tuning-table", "format_version": 1,
//    "machine": {"gpu": "NVIDIA H200", "sm_count": 132, "cuda": "13.0", "driver": "580.65.06",
//                "qgemm": "0.1.0"},
//    "entries": [{"scheme": "<compact text form>", "n": 4096, "k": 4096, "m_bucket": 16,
//                 "config": "<kernel config name>", "us": 12.5,
//                 "measured_at": "2026-12-02T16:40:00Z"}, ...]}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qgemm/scheme.hpp"

namespace qgemm::dispatch {

struct MachineKey {
  std::string gpu;
  int sm_count = 0;
  std::string cuda;
  std::string driver;
  std::string qgemm;
};
bool operator==(const MachineKey& a, const MachineKey& b);

// The version of this qgemm build (what a table written now records).
std::string qgemm_version();

// M is tuned per bucket: the smallest power of two >= m (1, 2, 4, ..., so decode sizes stay
// distinct); m must be >= 1.
std::int64_t m_bucket(std::int64_t m);

struct TuningKey {
  std::string scheme;  // the canonical compact text form (to_string(parse_scheme(...)))
  std::int64_t n = 0, k = 0;
  std::int64_t m_bucket = 0;
};
bool operator==(const TuningKey& a, const TuningKey& b);

struct TuningEntry {
  TuningKey key;
  std::string config;       // the kernel config name the dispatcher knows
  double microseconds = 0;  // the measured median
  std::string measured_at;  // UTC, "YYYY-MM-DDTHH:MM:SSZ" (orders as text)
};

struct TuningTable {
  MachineKey machine;
  std::vector<TuningEntry> entries;  // at most one per key

  // The entry for (scheme, n, k, m's bucket); `scheme` may be a preset name or any text form.
  const TuningEntry* find(std::string_view scheme, std::int64_t n, std::int64_t k,
                          std::int64_t m) const;
  const TuningEntry* find(const TuningKey& key) const;
  // Adds the entry, or replaces the one with the same key when `entry` is at least as new.
  void insert(TuningEntry entry);
};

// Builds a key from any spelling of the scheme (validated; canonical text stored).
TuningKey make_tuning_key(std::string_view scheme, std::int64_t n, std::int64_t k, std::int64_t m);
// The same from a parsed scheme (no text parsing: the per-call lookup of the selection layer).
TuningKey make_tuning_key(const Scheme& scheme, std::int64_t n, std::int64_t k, std::int64_t m);

// Parses a table; errors (InvalidArgument) name `source` and the field, e.g.
//   "tuning table t.json: entries[2].us: must be a positive number".
TuningTable parse_tuning_table(std::string_view json_text, const std::string& source);
// Reads a table (IoError when the file cannot be read).
TuningTable load_tuning_table(const std::string& path);
std::string to_json_text(const TuningTable& table);
// Writes atomically: a temporary file next to `path`, then rename, so a reader never sees half
// a table and a failed write leaves the old one. IoError on failure.
void save_tuning_table(const TuningTable& table, const std::string& path);

// Why `table` may not be applied on `current`: one clause per differing field, e.g.
// "the table is for GPU 'NVIDIA A100' (this machine: 'NVIDIA H200'); ...". Empty when it fits.
std::string mismatch_reason(const MachineKey& table, const MachineKey& current);

// Loads `path` for `current`: the table when it fits, else nullopt with `reason` saying why
// (another machine, or the file is missing or invalid). Never throws for those.
std::optional<TuningTable> load_applicable_table(const std::string& path, const MachineKey& current,
                                                 std::string& reason);

// Merges `incoming` into `base`: per key the newer measurement wins, other entries of both are
// kept. Both must be for the same machine (InvalidArgument naming the difference otherwise).
void merge_into(TuningTable& base, const TuningTable& incoming);

// The current time as "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_timestamp_now();

}  // namespace qgemm::dispatch
