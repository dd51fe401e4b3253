// Tuning tables: measured tile configs per (scheme, N, K, M bucket) on one machine, written by
// `qgemm tune RECIPE.yaml --out TABLE.json`. With a table active, every Engine prefers the
// table's config for a matching call when that config can serve it, and falls back to the
// built-in heuristics otherwise. A table measured on another machine (GPU, SM count, CUDA,
// driver or qgemm version) is ignored, with one warning naming the difference.
//
//   QGEMM_TUNING_TABLE=/path/table.json ./server     (read at the first GEMM), or
//   qgemm::use_tuning_table("/path/table.json");     (replaces it; "" turns tables off)
#pragma once

#include <string>

namespace qgemm {

// Error(IoError) when the file cannot be read, Error(InvalidArgument) naming the field when it
// is not a valid table.
void use_tuning_table(const std::string& path);

}  // namespace qgemm
