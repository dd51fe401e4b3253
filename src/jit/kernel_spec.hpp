// KernelSpec: every compile-time parameter of one kernel, as a plain value.
//
//   family<name=value,...>[threads=T,smem=S]@arch
//   e.g. dequantize_weight<weight=uint4,scale=bf16,zero=mid,out=bf16>[threads=256,smem=0]@sm_90a
//
// The family (a template in a header under kernels/) fixes the ordered parameter list; the
// values are ints, bools, choices (named enumerators) or whole number formats (printed by their
// canonical name, passed to the template as one packed 64-bit constant, util/format_code.cuh).
// The launch shape (threads per block, dynamic shared memory) is part of the spec and is passed
// to the template as its last two arguments, so the launcher and the kernel read the same value
// and nothing is read back out of a cubin.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jit/hash.hpp"
#include "qgemm/format.hpp"
#include "qgemm/moe.hpp"

namespace qgemm::jit {

enum class Arch { sm_75, sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a };

std::string arch_name(Arch arch);        // "sm_90a"
Arch parse_arch(std::string_view text);  // "sm_90a", "sm90a", "90a"; Error names the text
int compute_capability(Arch arch);       // 75, 80, ..., 120
const std::vector<Arch>& all_archs();
// The target whose cubins a device of compute capability major.minor runs (sm_86 for 8.7,
// sm_90a for 9.0, ...). Throws Unsupported for a device qgemm has no target for.
Arch arch_for_device(int major, int minor);

enum class ParamKind { Int, Bool, Choice, Format };

struct ParamSchema {
  std::string name;
  ParamKind kind;
  std::vector<std::string> choices;  // Choice: the enumerators, in the order of their codes
};

// One kernel template: which header, which function, which parameters in which order.
// Every kernel takes one argument struct by value and ends its template parameter list with
// `int kThreads, int kDynamicSmemBytes`.
struct KernelFamily {
  std::string name;       // "dequantize_weight"
  std::string header;     // "util/dequantize.cuh", relative to kernels/
  std::string kernel;     // "qgemm::kernels::dequantize_weight_kernel"
  std::string args_type;  // "qgemm::kernels::DequantizeWeightArgs"
  std::vector<ParamSchema> params;
  bool fast_math = false;  // compile with --use_fast_math
};

const std::vector<KernelFamily>& kernel_families();
const KernelFamily& find_kernel_family(std::string_view name);  // Error lists the known ones

struct SpecParam {
  std::string name;
  ParamKind kind = ParamKind::Int;
  std::int64_t value = 0;  // Int, Bool (0/1)
  std::string choice;      // Choice
  Format format{};         // Format

  static SpecParam integer(std::string name, std::int64_t value);
  static SpecParam boolean(std::string name, bool value);
  static SpecParam chosen(std::string name, std::string choice);
  static SpecParam number_format(std::string name, const Format& format);
  std::string value_text() const;
  friend bool operator==(const SpecParam&, const SpecParam&);
};

// The "glu" parameter of the grouped GEMM families (dense_decode_sm80, wgmma_gemm_sm90): the
// GLU fused into a gate_up GEMM's epilogue, or none.
SpecParam fused_glu_param(const std::optional<GluKind>& glu);

struct LaunchShape {
  int threads_per_block = 128;
  int dynamic_smem_bytes = 0;
  friend bool operator==(const LaunchShape&, const LaunchShape&) = default;
};

struct KernelSpec {
  std::string family;
  std::vector<SpecParam> params;
  Arch arch = Arch::sm_80;
  LaunchShape launch;

  const SpecParam& param(std::string_view name) const;  // Error when absent
  friend bool operator==(const KernelSpec&, const KernelSpec&) = default;
};

// Checks the spec against its family: every parameter present, in order, of the right kind,
// choices among the enumerators, threads in [32, 1024] and a multiple of 32, smem in
// [0, 227 KB]. Throws InvalidArgument naming the parameter, its value and the rule.
void validate(const KernelSpec& spec);
std::string to_string(const KernelSpec& spec);
// Parses the text form (as printed by to_string) and validates it.
KernelSpec parse_kernel_spec(std::string_view text);
// XXH3-128 of the canonical text: the spec's identity.
Hash128 spec_hash(const KernelSpec& spec);

// The 64-bit constant a Format becomes as a template argument (util/format_code.cuh).
std::uint64_t packed_format_code(const Format& format);

}  // namespace qgemm::jit
