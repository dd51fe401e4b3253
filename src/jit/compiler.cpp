#include "jit/compiler.hpp"

#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/log.hpp"
#include "jit/source.hpp"
#include "qgemm/error.hpp"

namespace qgemm::jit {
namespace {

// Frees the NVRTC program on every path out of compile_kernel.
struct ProgramGuard {
  nvrtcProgram program = nullptr;
  ~ProgramGuard() {
    if (program) nvrtcDestroyProgram(&program);
  }
};

void check_nvrtc(nvrtcResult result, std::string_view what, std::string_view spec_text) {
  if (result != NVRTC_SUCCESS) {
    throw Error(ErrorCode::CompileFailed,
                fmt::format("{} failed for {}: {}", what, spec_text, nvrtcGetErrorString(result)));
  }
}

// Reads the integer right before `suffix` in `line` ("Used 32 registers" -> 32), -1 if absent.
int number_before(std::string_view line, std::string_view suffix) {
  const auto at = line.find(suffix);
  if (at == std::string_view::npos) return -1;
  auto end = at;
  while (end > 0 && line[end - 1] == ' ') --end;
  auto begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
  if (begin == end) return -1;
  return std::atoi(std::string(line.substr(begin, end - begin)).c_str());
}

void dump_source(const KernelSpec& spec, const GeneratedSource& source) {
  const char* target = std::getenv("QGEMM_DUMP_SOURCE");
  if (!target || !*target || std::string_view(target) == "0") return;
  const std::string_view where(target);
  if (where == "1" || where == "stderr" || where == "-") {
    std::fprintf(stderr, "// ---- %s\n%s", source.file_name.c_str(), source.code.c_str());
    return;
  }
  std::error_code error;
  std::filesystem::create_directories(where, error);
  const auto path = std::filesystem::path(where) /
                    fmt::format("{}-{}.cu", spec.family, spec_hash(spec).hex().substr(0, 16));
  std::ofstream out(path);
  out << source.code;
  if (!out) log(LogLevel::Warning, "QGEMM_DUMP_SOURCE: cannot write {}", path.string());
}

}  // namespace

HeaderSet HeaderSet::from(std::vector<EmbeddedHeader> headers) {
  HeaderSet set;
  Hasher128 hasher;
  for (const auto& header : headers) hasher.add(header.path).add(header.text);
  set.headers = std::move(headers);
  set.hash = hasher.finish();
  return set;
}

std::shared_ptr<const HeaderSet> HeaderSet::embedded() {
  static const auto set = std::make_shared<const HeaderSet>(from(embedded_headers()));
  return set;
}

ResourceUsage parse_ptxas_report(std::string_view log, std::string_view lowered_name) {
  // ptxas -v prints, per entry function:
  //   ptxas info    : Compiling entry function '_Z...' for 'sm_90a'
  //   ptxas info    : Function properties for _Z...
  //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  //   ptxas info    : Used 10 registers, used 1 barriers, 256 bytes smem
  // and, where it had to, "ptxas info : (C7514) Potential Performance Loss: wgmma.mma_async
  // instructions are serialized due to ... in the function '_Z...'" (the function named there).
  ResourceUsage usage;
  bool in_entry = lowered_name.empty();
  std::size_t position = 0;
  while (position < log.size()) {
    auto end = log.find('\n', position);
    if (end == std::string_view::npos) end = log.size();
    const std::string_view line = log.substr(position, end - position);
    position = end + 1;
    if (line.find("wgmma.mma_async instructions are serialized") != std::string_view::npos &&
        (lowered_name.empty() || line.find(lowered_name) != std::string_view::npos)) {
      ++usage.wgmma_serializations;
      continue;
    }
    if (line.find("Compiling entry function") != std::string_view::npos) {
      in_entry = lowered_name.empty() || line.find(lowered_name) != std::string_view::npos;
      continue;
    }
    if (!in_entry) continue;
    if (line.find("stack frame") != std::string_view::npos) {
      usage.stack_frame_bytes = std::max(0, number_before(line, "bytes stack frame"));
      usage.spill_store_bytes = std::max(0, number_before(line, "bytes spill stores"));
      usage.spill_load_bytes = std::max(0, number_before(line, "bytes spill loads"));
    } else if (line.find("Used ") != std::string_view::npos &&
               line.find("registers") != std::string_view::npos) {
      usage.registers = number_before(line, "registers");
      usage.static_smem_bytes = std::max(0, number_before(line, "bytes smem"));
    }
  }
  return usage;
}

std::vector<std::string> compile_options(const KernelSpec& spec, const CompileOptions& options) {
  const KernelFamily& family = find_kernel_family(spec.family);
  std::vector<std::string> out = {
      "--gpu-architecture=" + arch_name(spec.arch),
      "-std=c++17",
      "-default-device",  // unannotated (constexpr) helpers in the headers are device functions
      "--ptxas-options=-v",
  };
  if (family.fast_math) out.push_back("--use_fast_math");
  if (options.line_info) out.push_back("-lineinfo");
  return out;
}

std::string nvrtc_version_text() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

CompiledKernel compile_kernel(const KernelSpec& spec, const HeaderSet& headers,
                              const CompileOptions& options) {
  validate(spec);
  const auto start = std::chrono::steady_clock::now();
  const std::string spec_text = to_string(spec);
  const GeneratedSource source = generate_source(spec);
  dump_source(spec, source);

  std::vector<const char*> header_texts, header_names;
  for (const auto& header : headers.headers) {
    header_texts.push_back(header.text.c_str());
    header_names.push_back(header.path.c_str());
  }
  ProgramGuard guard;
  check_nvrtc(nvrtcCreateProgram(&guard.program, source.code.c_str(), source.file_name.c_str(),
                                 static_cast<int>(header_texts.size()), header_texts.data(),
                                 header_names.data()),
              "nvrtcCreateProgram", spec_text);
  check_nvrtc(nvrtcAddNameExpression(guard.program, source.name_expression.c_str()),
              "nvrtcAddNameExpression", spec_text);

  const std::vector<std::string> option_strings = compile_options(spec, options);
  std::vector<const char*> option_pointers;
  for (const auto& option : option_strings) option_pointers.push_back(option.c_str());
  const nvrtcResult compiled = nvrtcCompileProgram(
      guard.program, static_cast<int>(option_pointers.size()), option_pointers.data());

  std::size_t log_size = 0;
  nvrtcGetProgramLogSize(guard.program, &log_size);
  std::string compile_log(log_size, '\0');
  if (log_size) nvrtcGetProgramLog(guard.program, compile_log.data());
  while (!compile_log.empty() && compile_log.back() == '\0') compile_log.pop_back();
  if (compiled != NVRTC_SUCCESS) {
    throw Error(ErrorCode::CompileFailed,
                fmt::format("NVRTC could not compile {} ({}):\n{}\n--- generated source "
                            "({}):\n{}",
                            spec_text, nvrtcGetErrorString(compiled), compile_log, source.file_name,
                            source.code));
  }

  CompiledKernel kernel;
  kernel.spec = spec;
  kernel.spec_text = spec_text;
  const char* lowered = nullptr;
  check_nvrtc(nvrtcGetLoweredName(guard.program, source.name_expression.c_str(), &lowered),
              "nvrtcGetLoweredName", spec_text);
  kernel.lowered_name = lowered;
  std::size_t cubin_size = 0;
  check_nvrtc(nvrtcGetCUBINSize(guard.program, &cubin_size), "nvrtcGetCUBINSize", spec_text);
  kernel.cubin.resize(cubin_size);
  check_nvrtc(nvrtcGetCUBIN(guard.program, kernel.cubin.data()), "nvrtcGetCUBIN", spec_text);
  kernel.resources = parse_ptxas_report(compile_log, kernel.lowered_name);
  kernel.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  log(LogLevel::Debug, "compiled {} in {:.1f} ms: {} registers, {} spill bytes, {} B cubin",
      spec_text, kernel.compile_ms, kernel.resources.registers, kernel.resources.spill_bytes(),
      kernel.cubin.size());
  return kernel;
}

}  // namespace qgemm::jit
