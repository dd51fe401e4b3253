// NVRTC: a KernelSpec's generated source -> a CUBIN for its architecture, with the ptxas
// resource report (registers, spills, shared memory) parsed from the compile log.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jit/embedded.hpp"
#include "jit/hash.hpp"
#include "jit/kernel_spec.hpp"

namespace qgemm::jit {

// The headers NVRTC sees, served from memory (no include path), and one hash over all of them.
struct HeaderSet {
  std::vector<EmbeddedHeader> headers;
  Hash128 hash;

  static HeaderSet from(std::vector<EmbeddedHeader> headers);
  static std::shared_ptr<const HeaderSet> embedded();  // the headers under kernels/
};

struct CompileOptions {
  bool line_info = false;  // -lineinfo (profilers map SASS back to the .cuh lines)
  friend bool operator==(const CompileOptions&, const CompileOptions&) = default;
};

// ptxas -v, for the kernel's entry function. -1 where the log did not say.
struct ResourceUsage {
  int registers = -1;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int stack_frame_bytes = 0;
  int static_smem_bytes = 0;
  // ptxas's notes that it serialized wgmma.mma_async (C7514 and its kin: an accumulator or
  // A-fragment register touched while a wgmma is in flight), which cost the SM90 kernels their
  // overlap; 0 for every kernel the library ships (its spec tests check).
  int wgmma_serializations = 0;
  int spill_bytes() const { return spill_store_bytes + spill_load_bytes; }
};
// Parses the lines ptxas writes for `lowered_name` (or the only entry when there is one).
ResourceUsage parse_ptxas_report(std::string_view log, std::string_view lowered_name);

struct CompiledKernel {
  std::string spec_text;
  KernelSpec spec;
  std::string lowered_name;  // the symbol to look up in the module
  std::string cubin;         // bytes
  ResourceUsage resources;
  double compile_ms = 0;  // of the compile that produced the cubin (maybe another process)
  Hash128 key;            // the cache key (cache.hpp)
};

// The NVRTC options for a spec: architecture, language, ptxas report, fast math per family.
std::vector<std::string> compile_options(const KernelSpec& spec, const CompileOptions& options);

// "13.0"; the number is major * 1000 + minor * 10 as in CUDA_VERSION.
std::string nvrtc_version_text();

// Compiles. Throws Error(CompileFailed) with the spec text and the NVRTC log.
// QGEMM_DUMP_SOURCE writes the generated TU: "1"/"stderr" to stderr, else into that directory.
CompiledKernel compile_kernel(const KernelSpec& spec, const HeaderSet& headers,
                              const CompileOptions& options);

}  // namespace qgemm::jit
