// Source generation: a KernelSpec becomes a short translation unit that includes the family's
// header and explicitly instantiates its kernel template with constexpr arguments. This is the
// only place that writes generated C++.
#pragma once

#include <string>

#include "jit/kernel_spec.hpp"

namespace qgemm::jit {

struct GeneratedSource {
  std::string file_name;        // "qgemm_dequantize_weight.cu" (what NVRTC names in its log)
  std::string code;             // the translation unit
  std::string name_expression;  // passed to nvrtcAddNameExpression / nvrtcGetLoweredName
};

// The spec must be valid (validate()).
GeneratedSource generate_source(const KernelSpec& spec);

}  // namespace qgemm::jit
