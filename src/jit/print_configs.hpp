// QGEMM_PRINT_CONFIGS: when the variable is set (not "0"), every plan an Engine makes prints
// itself once to stderr (src/api/engine.cpp; gemm() makes one plan per call shape):
//   [qgemm plan] GemmPlan w=uint4:g128:... M 16..16 N 4096 K 4096 (bf16 in, bf16 out) on sm_90a
//     M 16..16: decode, 17.1 µs (lowest predicted time, ...)
#pragma once

namespace qgemm::jit {

bool print_configs_enabled();

}  // namespace qgemm::jit
