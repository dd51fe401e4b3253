// libFuzzer target: tuning tables (JSON, src/dispatch/tuning_table.cpp: parse_tuning_table, what
// QGEMM_TUNING_TABLE and `qgemm tune --out` read). A parsed table must save as text that parses
// back to the same table, find each of its entries, and merge into itself unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dispatch/tuning_table.hpp"
#include "fuzz_support.hpp"

namespace {

using qgemm::dispatch::TuningTable;

bool same(const TuningTable& a, const TuningTable& b) {
  if (!(a.machine == b.machine) || a.entries.size() != b.entries.size()) return false;
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    const auto &x = a.entries[i], &y = b.entries[i];
    if (!(x.key == y.key) || x.config != y.config || x.microseconds != y.microseconds ||
        x.measured_at != y.measured_at)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  qgemm::fuzz::expect_object_or_error([&] {
    const TuningTable table = qgemm::dispatch::parse_tuning_table(text, "fuzz.json");
    FUZZ_CHECK(table.machine.sm_count >= 1, "sm_count");
    for (const auto& entry : table.entries) {
      FUZZ_CHECK(entry.key.n >= 1 && entry.key.k >= 1 && entry.microseconds > 0, entry.key.scheme);
      FUZZ_CHECK(qgemm::dispatch::m_bucket(entry.key.m_bucket) == entry.key.m_bucket,
                 entry.key.scheme);
      FUZZ_CHECK(table.find(entry.key) == &entry, entry.key.scheme);
      // The stored scheme is canonical: looking it up by its text finds the same entry.
      FUZZ_CHECK(table.find(entry.key.scheme, entry.key.n, entry.key.k, entry.key.m_bucket) == &entry,
                 entry.key.scheme);
    }
    const std::string saved = qgemm::dispatch::to_json_text(table);
    TuningTable again;
    try {
      again = qgemm::dispatch::parse_tuning_table(saved, "saved.json");
    } catch (const qgemm::Error& error) {
      qgemm::fuzz::finding(std::string("a saved table does not parse: ") + error.what());
    }
    FUZZ_CHECK(same(table, again), "save + parse changed the table");
    TuningTable merged = table;
    qgemm::dispatch::merge_into(merged, table);
    FUZZ_CHECK(same(table, merged), "merging a table into itself changed it");
  });
  return 0;
}
