// Aligned plain-text tables for the CLI's human-readable output (the --json forms are for tools).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace qgemm::cli {

// Prints `rows` (the first is the header) with every column padded to its widest cell and a
// dashed rule under the header. Cells are left-aligned; the last column is not padded.
inline void print_text_table(const std::vector<std::vector<std::string>>& rows,
                             std::FILE* out = stdout) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (c + 1 < row.size())
        line += fmt::format("{:<{}}  ", row[c], widths[c]);
      else
        line += row[c];
    }
    fmt::print(out, "{}\n", line);
  };
  for (std::size_t r = 0; r < rows.size(); ++r) {
    print_row(rows[r]);
    if (r == 0) {
      std::vector<std::string> rule;
      for (std::size_t c = 0; c < rows[0].size(); ++c) rule.emplace_back(widths[c], '-');
      print_row(rule);
    }
  }
}

}  // namespace qgemm::cli
