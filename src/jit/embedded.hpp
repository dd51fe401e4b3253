// The device headers under kernels/, embedded at build time (cmake/WriteEmbeddedKernels.cmake).
#pragma once

#include <string>
#include <vector>

namespace qgemm::jit {

struct EmbeddedHeader {
  std::string path;  // relative to kernels/, e.g. "dequant/formats.cuh"
  std::string text;
};
const std::vector<EmbeddedHeader>& embedded_headers();

}  // namespace qgemm::jit
