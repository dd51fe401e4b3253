// QGEMM_PRINT_CONFIGS: the dispatcher calls print_chosen_config for every call; when the
// variable is set (not "0"), the first call of each (operation, shape, kernel) prints one line
// to stderr:
//   [qgemm config] gemm m=16 n=4096 k=4096 -> dequantize_weight<...>@sm_90a (decode: ...)
#pragma once

#include <cstdint>
#include <string_view>

#include "jit/kernel_spec.hpp"

namespace qgemm::jit {

bool print_configs_enabled();
void print_chosen_config(std::string_view operation, std::int64_t m, std::int64_t n, std::int64_t k,
                         const KernelSpec& spec, std::string_view reason = {});

}  // namespace qgemm::jit
