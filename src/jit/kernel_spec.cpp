#include "jit/kernel_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "../../kernels/util/format_code.cuh"
#include "qgemm/error.hpp"

namespace qgemm::jit {
namespace {

struct ArchInfo {
  Arch arch;
  const char* name;
  int capability;
};
constexpr ArchInfo kArchs[] = {
    {Arch::sm_75, "sm_75", 75},      {Arch::sm_80, "sm_80", 80},   {Arch::sm_86, "sm_86", 86},
    {Arch::sm_89, "sm_89", 89},      {Arch::sm_90a, "sm_90a", 90}, {Arch::sm_100a, "sm_100a", 100},
    {Arch::sm_120a, "sm_120a", 120},
};

std::string known_arch_list() {
  std::string out;
  for (const auto& info : kArchs) out += (out.empty() ? "" : ", ") + std::string(info.name);
  return out;
}

// The packed layout of util/format_code.cuh uses the order of qgemm's enums.
static_assert(static_cast<int>(NumberKind::Integer) == kernels::kIntegerFormat);
static_assert(static_cast<int>(NumberKind::Float) == kernels::kFloatFormat);
static_assert(static_cast<int>(FloatSpecials::IEEE) == kernels::kIeee);
static_assert(static_cast<int>(FloatSpecials::FiniteOneNaN) == kernels::kFiniteOneNaN);
static_assert(static_cast<int>(FloatSpecials::FiniteNoNaN) == kernels::kFiniteNoNaN);
static_assert(static_cast<int>(FloatSpecials::ExponentOnly) == kernels::kExponentOnly);

constexpr int kMaxDynamicSmemBytes = 227 * 1024;  // the largest opt-in of any supported arch

bool is_identifier(std::string_view text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::int64_t parse_integer(std::string_view text, std::string_view what) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  require(error == std::errc() && end == text.data() + text.size(),
          "kernel spec: {} = '{}' is not an integer", what, text);
  return value;
}

const char* kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::Int: return "int";
    case ParamKind::Bool: return "bool";
    case ParamKind::Choice: return "choice";
    case ParamKind::Format: return "format";
  }
  return "?";
}

}  // namespace

SpecParam fused_glu_param(const std::optional<GluKind>& glu) {
  return SpecParam::chosen("glu", glu ? glu_kind_name(*glu) : "none");
}

std::string arch_name(Arch arch) {
  for (const auto& info : kArchs) {
    if (info.arch == arch) return info.name;
  }
  throw Error(ErrorCode::Internal, fmt::format("arch {} has no name", static_cast<int>(arch)));
}

Arch parse_arch(std::string_view text) {
  std::string normalized(text);
  for (char& c : normalized) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (normalized.rfind("sm_", 0) == 0)
    normalized.erase(0, 3);
  else if (normalized.rfind("sm", 0) == 0)
    normalized.erase(0, 2);
  for (const auto& info : kArchs) {
    if (normalized == std::string(info.name).substr(3)) return info.arch;
  }
  throw Error(
      ErrorCode::InvalidArgument,
      fmt::format("arch '{}' is not a target of qgemm (known: {})", text, known_arch_list()));
}

int compute_capability(Arch arch) {
  for (const auto& info : kArchs) {
    if (info.arch == arch) return info.capability;
  }
  return 0;
}

const std::vector<Arch>& all_archs() {
  static const std::vector<Arch> archs = [] {
    std::vector<Arch> out;
    for (const auto& info : kArchs) out.push_back(info.arch);
    return out;
  }();
  return archs;
}

Arch arch_for_device(int major, int minor) {
  // A cubin for sm_XY runs on X.Z with Z >= Y; the `a` targets run only on their exact chip.
  if (major == 7 && minor >= 5) return Arch::sm_75;
  if (major == 8 && minor == 0) return Arch::sm_80;
  if (major == 8 && minor < 9) return Arch::sm_86;
  if (major == 8) return Arch::sm_89;
  if (major == 9 && minor == 0) return Arch::sm_90a;
  if (major == 10 && minor == 0) return Arch::sm_100a;
  if (major == 12 && minor == 0) return Arch::sm_120a;
  throw Error(ErrorCode::Unsupported,
              fmt::format("device compute capability {}.{} has no qgemm target (known: {})", major,
                          minor, known_arch_list()));
}

const std::vector<KernelFamily>& kernel_families() {
  static const std::vector<KernelFamily> families = {
      {"dequantize_weight",
       "util/dequantize.cuh",
       "qgemm::kernels::dequantize_weight_kernel",
       "qgemm::kernels::DequantizeWeightArgs",
       {{"weight", ParamKind::Format, {}},
        {"scale", ParamKind::Format, {}},
        // Order = kernels::ZeroPointCode.
        {"zero", ParamKind::Choice, {"none", "mid", "int", "float"}},
        // Order = kernels::HalfTypeCode.
        {"out", ParamKind::Choice, {"bf16", "fp16"}}},
       false},
      // kernels/util/quantize_activation.cuh: the three kernels of quantized activations.
      {"quantize_activation",
       "util/quantize_activation.cuh",
       "qgemm::kernels::quantize_activation_kernel",
       "qgemm::kernels::QuantizeActivationArgs",
       {{"code", ParamKind::Format, {}},
        // Order = kernels::ActivationScalingCode.
        {"scaling", ParamKind::Choice, {"static", "token", "group", "mx", "nv"}},
        {"scale", ParamKind::Format, {}},
        {"in", ParamKind::Choice, {"bf16", "fp16"}},
        // Order = kernels::ActivationEmitCode.
        {"emit", ParamKind::Choice, {"codes", "operand", "operand8"}},
        {"operand", ParamKind::Choice, {"bf16", "fp16"}}},
       false},
      {"expand_activation",
       "util/quantize_activation.cuh",
       "qgemm::kernels::expand_activation_kernel",
       "qgemm::kernels::ExpandActivationArgs",
       {{"code", ParamKind::Format, {}},
        {"scaling", ParamKind::Choice, {"static", "token", "group", "mx", "nv"}},
        {"scale", ParamKind::Format, {}},
        // bf16 / fp16 (kernels::HalfTypeCode), or the 8-bit codes as the mma's operand.
        {"operand", ParamKind::Choice, {"bf16", "fp16", "bytes"}}},
       false},
      // kernels/util/quantize_weight.cuh: round-to-nearest weight quantization, in three steps.
      {"quantize_weight",
       "util/quantize_weight.cuh",
       "qgemm::kernels::quantize_weight_kernel",
       "qgemm::kernels::QuantizeWeightArgs",
       {{"weight", ParamKind::Format, {}},
        {"scale", ParamKind::Format, {}},
        // Order = kernels::ZeroPointCode.
        {"zero", ParamKind::Choice, {"none", "mid", "int", "float"}},
        // Order = kernels::WeightInputCode.
        {"in", ParamKind::Choice, {"bf16", "fp16", "fp32"}},
        // Order = kernels::WeightQuantizeStep.
        {"step", ParamKind::Choice, {"stats", "cells", "codes"}}},
       false},
      {"tensor_absmax",
       "util/quantize_activation.cuh",
       "qgemm::kernels::tensor_absmax_kernel",
       "qgemm::kernels::TensorAbsmaxArgs",
       {{"in", ParamKind::Choice, {"bf16", "fp16"}}},
       false},
      // kernels/moe/routing.cuh: top-k ids -> the indexed layout, in three steps.
      {"moe_routing",
       "moe/routing.cuh",
       "qgemm::kernels::moe_routing_kernel",
       "qgemm::kernels::MoeRoutingArgs",
       // Order = kernels::MoeRoutingStep.
       {{"step", ParamKind::Choice, {"count", "offsets", "scatter", "small"}}},
       false},
      // kernels/moe/routing.cuh: rows the caller grouped by expert -> top-1 ids for the routing.
      {"moe_group_ids",
       "moe/routing.cuh",
       "qgemm::kernels::moe_group_ids_kernel",
       "qgemm::kernels::MoeGroupIdsArgs",
       {},
       false},
      // kernels/moe/routing.cuh: rows the caller grouped by expert -> the token-block table the
      // grouped kernels read them in place with.
      {"moe_row_blocks",
       "moe/routing.cuh",
       "qgemm::kernels::moe_row_blocks_kernel",
       "qgemm::kernels::MoeRowBlocksArgs",
       {},
       false},
      // kernels/moe/glue.cuh: gather before the grouped GEMM, combine after it.
      {"moe_glue",
       "moe/glue.cuh",
       "qgemm::kernels::moe_glue_kernel",
       "qgemm::kernels::MoeGlueArgs",
       // Orders = kernels::MoeGlueStep, kernels::MoeGlueType (rows: gather copies 16-bit rows;
       // combine reads the GEMM's rows; out: combine's output).
       {{"step", ParamKind::Choice, {"gather", "combine", "glu"}},
        {"rows", ParamKind::Choice, {"bf16", "fp16", "fp32"}},
        {"out", ParamKind::Choice, {"bf16", "fp16", "fp32"}}},
       false},
      // kernels/gemm/sm80_dense.cuh; configs in src/dispatch/mma_family.cpp.
      {"dense_gemm_sm80",
       "gemm/sm80_dense.cuh",
       "qgemm::kernels::dense_gemm_sm80",
       "qgemm::kernels::DenseGemmParams",
       {{"m_tiles", ParamKind::Int, {}},
        {"warps_m", ParamKind::Int, {}},
        {"warps_n", ParamKind::Int, {}},
        {"warps_k", ParamKind::Int, {}},
        {"block_k", ParamKind::Int, {}},
        {"stages", ParamKind::Int, {}},
        {"weight", ParamKind::Format, {}},
        // Order = kernels::MmaZeroMode.
        {"zero", ParamKind::Choice, {"none", "constant", "int", "float"}},
        {"group", ParamKind::Int, {}},
        // The mma's activation operand: 16-bit, or 8-bit (mma.m16n8k32).
        {"act", ParamKind::Choice, {"bf16", "fp16", "int8", "e4m3"}},
        // Order = kernels::OutputType.
        {"out", ParamKind::Choice, {"fp16", "bf16", "fp32"}},
        {"split_k", ParamKind::Bool, {}},
        // Order = the kernel's kDequant: 16-bit activations take generic fp32 math or packed
        // 16-bit pairs; 8-bit ones the codes as bytes, or e4m3 through an unscaled fp16
        // dequantization (2 + kernels::ByteDequant).
        {"dequant",
         ParamKind::Choice,
         {"fp32", "packed16", "bytes", "bytes_int16", "bytes_float16"}},
        // __launch_bounds__ minimum blocks per SM (caps registers per thread).
        {"min_blocks", ParamKind::Int, {}}},
       false},
      // kernels/gemm/sm80_decode.cuh (M <= 16); configs in src/dispatch/mma_family.cpp.
      {"dense_decode_sm80",
       "gemm/sm80_decode.cuh",
       "qgemm::kernels::dense_decode_sm80",
       "qgemm::kernels::DenseGemmParams",
       {{"rows", ParamKind::Int, {}},
        {"warps", ParamKind::Int, {}},
        {"stage_blocks", ParamKind::Int, {}},
        {"stages", ParamKind::Int, {}},
        {"weight", ParamKind::Format, {}},
        {"zero", ParamKind::Choice, {"none", "constant", "int", "float"}},
        {"group", ParamKind::Int, {}},
        {"act", ParamKind::Choice, {"bf16", "fp16"}},
        {"out", ParamKind::Choice, {"fp16", "bf16", "fp32"}},
        {"split_k", ParamKind::Bool, {}},
        // Order = kernels::UnscaledDequant.
        {"dequant", ParamKind::Choice, {"int16", "int_f32", "float16"}},
        {"min_blocks", ParamKind::Int, {}},
        // Grouped (MoE): grid.y walks token blocks, each block's expert from the routing.
        {"grouped", ParamKind::Bool, {}},
        // Which prepared weight it reads. Order = layout::FragmentOrder.
        {"order", ParamKind::Choice, {"mma", "wgmma"}},
        // The GLU fused into a grouped gate_up GEMM (an interleaved weight): none, or
        // kernels::MoeGluKind + 1.
        {"glu", ParamKind::Choice, {"none", "silu", "gelu", "clamped-swiglu"}}},
       false},
      // kernels/gemm/sm90_wgmma.cuh (sm_90a); configs in src/dispatch/wgmma_family.cpp. Its
      // parameter is __grid_constant__ (TMA reads the tensor map from parameter space).
      {"wgmma_gemm_sm90",
       "gemm/sm90_wgmma.cuh",
       "qgemm::kernels::wgmma_gemm_sm90",
       "const __grid_constant__ qgemm::kernels::WgmmaGemmParams",
       {{"consumers", ParamKind::Int, {}},
        {"tokens", ParamKind::Int, {}},
        {"stage_chunks", ParamKind::Int, {}},
        {"stages", ParamKind::Int, {}},
        {"transform", ParamKind::Bool, {}},
        {"weight", ParamKind::Format, {}},
        {"zero", ParamKind::Choice, {"none", "constant", "int", "float"}},
        {"group", ParamKind::Int, {}},
        // The activation operand: 16-bit, or e4m3 codes (the FP8 tiles, m64nNk32) with one
        // scale per row (applied in the epilogue) or per 1x128 group (promoted in the loop), or
        // int8 codes with one scale per row (the INT8 tiles).
        {"act", ParamKind::Choice, {"bf16", "fp16", "e4m3", "e4m3_g128", "int8"}},
        {"out", ParamKind::Choice, {"fp16", "bf16", "fp32"}},
        {"split_k", ParamKind::Bool, {}},
        // Order = kernels::WgmmaDequant ("e4m3" / "s8": the weight as exact e4m3 / s8 codes,
        // for the FP8 / INT8 tiles only).
        {"dequant", ParamKind::Choice, {"fp32", "packed16", "float16", "e4m3", "s8"}},
        // Grouped (MoE): the expert of each token block from the routing.
        {"grouped", ParamKind::Bool, {}},
        // As the decode kernel's.
        {"glu", ParamKind::Choice, {"none", "silu", "gelu", "clamped-swiglu"}}},
       false},
      // kernels/gemm/mma_dequantize.cuh: the weight chunks of the dequantize + cuBLAS path;
      // specs come from jit::mma_dequantize_spec.
      {"mma_dequantize",
       "gemm/mma_dequantize.cuh",
       "qgemm::kernels::mma_dequantize_kernel",
       "qgemm::kernels::MmaDequantizeArgs",
       {{"weight", ParamKind::Format, {}},
        {"zero", ParamKind::Choice, {"none", "constant", "int", "float"}},
        // K values per scale row (a multiple of 16), 0: one row for all of K.
        {"group", ParamKind::Int, {}},
        // How the exact value is made, order = kernels::MmaDequantizeValue: fp32 math, or an
        // unscaled 16-bit dequantization of the decode kernel (kernels::UnscaledDequant).
        {"dequant", ParamKind::Choice, {"fp32", "int16", "int_f32", "float16"}},
        // How the scale is applied, order = kernels::MmaDequantizeScale: in fp32 rounded to odd,
        // or in the 16-bit type (every scale exact there).
        {"scale", ParamKind::Choice, {"fp32", "half"}},
        // Order = kernels::OutputType (16-bit only).
        {"out", ParamKind::Choice, {"fp16", "bf16"}},
        // Which prepared weight it reads. Order = layout::FragmentOrder.
        {"order", ParamKind::Choice, {"mma", "wgmma"}}},
       false},
      {"finish_gemm",
       "gemm/dequant_cublas.cuh",
       "qgemm::kernels::finish_gemm_kernel",
       "qgemm::kernels::FinishGemmArgs",
       {{"out", ParamKind::Choice, {"fp16", "bf16", "fp32"}}},
       false},
      // kernels/gemm/mma_repack.cuh: canonical weight -> the dense GEMM's layout on the GPU.
      {"mma_repack",
       "gemm/mma_repack.cuh",
       "qgemm::kernels::mma_repack_kernel",
       "qgemm::kernels::MmaRepackArgs",
       {{"weight", ParamKind::Format, {}},
        {"scale", ParamKind::Format, {}},
        {"zero", ParamKind::Choice, {"none", "int", "float"}},
        // Order = layout::FragmentOrder.
        {"order", ParamKind::Choice, {"mma", "wgmma"}}},
       false},
      {"repack_weight",
       "util/repack.cuh",
       "qgemm::kernels::repack_weight_kernel",
       "qgemm::kernels::RepackWeightArgs",
       {{"bits", ParamKind::Int, {}}},
       false},
  };
  return families;
}

const KernelFamily& find_kernel_family(std::string_view name) {
  std::string known;
  for (const auto& family : kernel_families()) {
    if (family.name == name) return family;
    known += (known.empty() ? "" : ", ") + family.name;
  }
  throw Error(
      ErrorCode::InvalidArgument,
      fmt::format("kernel spec: family '{}' is not a kernel family (known: {})", name, known));
}

SpecParam SpecParam::integer(std::string name, std::int64_t value) {
  SpecParam p;
  p.name = std::move(name);
  p.kind = ParamKind::Int;
  p.value = value;
  return p;
}
SpecParam SpecParam::boolean(std::string name, bool value) {
  SpecParam p;
  p.name = std::move(name);
  p.kind = ParamKind::Bool;
  p.value = value ? 1 : 0;
  return p;
}
SpecParam SpecParam::chosen(std::string name, std::string choice) {
  SpecParam p;
  p.name = std::move(name);
  p.kind = ParamKind::Choice;
  p.choice = std::move(choice);
  return p;
}
SpecParam SpecParam::number_format(std::string name, const Format& format) {
  SpecParam p;
  p.name = std::move(name);
  p.kind = ParamKind::Format;
  p.format = format;
  return p;
}

std::string SpecParam::value_text() const {
  switch (kind) {
    case ParamKind::Int: return std::to_string(value);
    case ParamKind::Bool: return value ? "true" : "false";
    case ParamKind::Choice: return choice;
    case ParamKind::Format: return format.name();
  }
  return "?";
}

bool operator==(const SpecParam& a, const SpecParam& b) {
  if (a.name != b.name || a.kind != b.kind) return false;
  switch (a.kind) {
    case ParamKind::Int:
    case ParamKind::Bool: return a.value == b.value;
    case ParamKind::Choice: return a.choice == b.choice;
    case ParamKind::Format: return a.format == b.format;
  }
  return false;
}

const SpecParam& KernelSpec::param(std::string_view name) const {
  for (const auto& p : params) {
    if (p.name == name) return p;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("kernel spec {}: has no parameter '{}'", family, name));
}

void validate(const KernelSpec& spec) {
  const KernelFamily& family = find_kernel_family(spec.family);
  if (spec.params.size() != family.params.size()) {
    std::string names;
    for (const auto& p : family.params) names += (names.empty() ? "" : ",") + p.name;
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("kernel spec {}: {} parameters given, the family takes {} ({})",
                            spec.family, spec.params.size(), family.params.size(), names));
  }
  for (std::size_t i = 0; i < family.params.size(); ++i) {
    const ParamSchema& schema = family.params[i];
    const SpecParam& param = spec.params[i];
    require(param.name == schema.name,
            "kernel spec {}: parameter {} is '{}', expected '{}' (rule: the family's "
            "order)",
            spec.family, i, param.name, schema.name);
    require(param.kind == schema.kind, "kernel spec {}: parameter '{}' is a {}, expected a {}",
            spec.family, param.name, kind_name(param.kind), kind_name(schema.kind));
    if (schema.kind == ParamKind::Choice) {
      require(std::find(schema.choices.begin(), schema.choices.end(), param.choice) !=
                  schema.choices.end(),
              "kernel spec {}: {} = '{}' is not one of {}", spec.family, param.name, param.choice,
              fmt::join(schema.choices, "|"));
    }
    if (schema.kind == ParamKind::Format) packed_format_code(param.format);  // range check
  }
  if (spec.family == "quantize_activation" || spec.family == "expand_activation") {
    const Format& code = spec.param("code").format;
    require(code.bits == 8 || code.bits == 4,
            "kernel spec {}: code = {} has {} bits (rule: activation codes of 4 or 8 "
            "bits)",
            spec.family, code.name(), code.bits);
    const Format& scale = spec.param("scale").format;
    require(scale.is_float() && (scale.bits == 32 || scale.bits <= 8),
            "kernel spec {}: scale = {} (rule: fp32 or a float format of <= 8 bits)", spec.family,
            scale.name());
  }
  if (spec.family == "dequantize_weight") {
    const Format& weight = spec.param("weight").format;
    require(weight.bits >= 1 && weight.bits <= 8,
            "kernel spec dequantize_weight: weight = {} has {} bits (rule: 1..8)", weight.name(),
            weight.bits);
    const Format& scale = spec.param("scale").format;
    require(scale.is_float(), "kernel spec dequantize_weight: scale = {} (rule: a float format)",
            scale.name());
  }
  if (spec.family == "quantize_weight") {
    const Format& weight = spec.param("weight").format;
    const Format& scale = spec.param("scale").format;
    const std::string& zero = spec.param("zero").choice;
    require(weight.bits >= 1 && weight.bits <= 8 &&
                (weight.is_integer() ||
                 (weight.specials != FloatSpecials::ExponentOnly && weight.mantissa_bits >= 1)),
            "kernel spec quantize_weight: weight = {} (rule: 1..8 bits, an integer or a float "
            "format with a mantissa)",
            weight.name());
    require(scale.is_float() && scale.bits <= 32 &&
                (scale.specials == FloatSpecials::ExponentOnly || scale.mantissa_bits >= 1),
            "kernel spec quantize_weight: scale = {} (rule: a float format with a mantissa, or "
            "exponent-only)",
            scale.name());
    require(zero == "none" || weight.is_integer(),
            "kernel spec quantize_weight: zero = {} with weight {} (rule: zero points need an "
            "integer weight)",
            zero, weight.name());
    require(zero != "float" || scale.specials != FloatSpecials::ExponentOnly,
            "kernel spec quantize_weight: zero = float with scale {} (rule: float zero points "
            "need a scale format with a mantissa)",
            scale.name());
  }
  if (spec.family == "mma_dequantize") {
    const Format& weight = spec.param("weight").format;
    require(weight.bits >= 1 && weight.bits <= 8,
            "kernel spec mma_dequantize: weight = {} has {} bits (rule: 1..8)", weight.name(),
            weight.bits);
    const auto group = spec.param("group").value;
    require(group >= 0 && group % 16 == 0 && group <= 0x7fffffff,
            "kernel spec mma_dequantize: group = {} (rule: 0 or a positive multiple of 16)", group);
    const std::string& dequant = spec.param("dequant").choice;
    require(dequant != "fp32" || spec.param("scale").choice == "fp32",
            "kernel spec mma_dequantize: dequant = fp32 with scale = {} (rule: fp32 values take "
            "fp32 scales)",
            spec.param("scale").choice);
    require(dequant == "fp32" || spec.param("zero").choice != "float",
            "kernel spec mma_dequantize: dequant = {} with float zeros (rule: dequant = fp32, "
            "u - zero is not exact in 16 bits)",
            dequant);
  }
  if (spec.family == "repack_weight") {
    const auto bits = spec.param("bits").value;
    require(bits >= 1 && bits <= 8, "kernel spec repack_weight: bits = {} (rule: 1..8)", bits);
  }
  const int threads = spec.launch.threads_per_block;
  require(threads >= 32 && threads <= 1024 && threads % 32 == 0,
          "kernel spec {}: threads = {} (rule: a multiple of 32 in [32, 1024])", spec.family,
          threads);
  const int smem = spec.launch.dynamic_smem_bytes;
  require(smem >= 0 && smem <= kMaxDynamicSmemBytes,
          "kernel spec {}: smem = {} (rule: 0 .. {} bytes)", spec.family, smem,
          kMaxDynamicSmemBytes);
}

std::string to_string(const KernelSpec& spec) {
  std::string text = spec.family;
  text += '<';
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    if (i) text += ',';
    text += spec.params[i].name;
    text += '=';
    text += spec.params[i].value_text();
  }
  text += ">[threads=";
  text += std::to_string(spec.launch.threads_per_block);
  text += ",smem=";
  text += std::to_string(spec.launch.dynamic_smem_bytes);
  text += "]@";
  text += arch_name(spec.arch);
  return text;
}

KernelSpec parse_kernel_spec(std::string_view text) {
  const auto fail = [&](std::string_view rule) {
    return Error(ErrorCode::InvalidArgument,
                 fmt::format("kernel spec '{}': {} (form: family<name=value,...>[threads=T,smem=S]"
                             "@arch)",
                             text, rule));
  };
  const auto open = text.find('<');
  const auto close = text.find('>');
  const auto at = text.rfind('@');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    throw fail("no <...> parameter list");
  if (at == std::string_view::npos || at < close) throw fail("no @arch suffix");

  KernelSpec spec;
  spec.family = std::string(text.substr(0, open));
  if (!is_identifier(spec.family)) throw fail("the family is not an identifier");
  const KernelFamily& family = find_kernel_family(spec.family);
  spec.arch = parse_arch(text.substr(at + 1));

  std::string_view list = text.substr(open + 1, close - open - 1);
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    const auto equals = item.find('=');
    if (equals == std::string_view::npos) throw fail(fmt::format("'{}' is not name=value", item));
    const std::string name(item.substr(0, equals));
    const std::string_view value = item.substr(equals + 1);
    const auto schema = std::find_if(family.params.begin(), family.params.end(),
                                     [&](const ParamSchema& s) { return s.name == name; });
    if (schema == family.params.end()) {
      throw fail(fmt::format("'{}' is not a parameter of {}", name, family.name));
    }
    switch (schema->kind) {
      case ParamKind::Int:
        spec.params.push_back(SpecParam::integer(name, parse_integer(value, name)));
        break;
      case ParamKind::Bool:
        if (value != "true" && value != "false") {
          throw fail(fmt::format("{} = '{}' is not true|false", name, value));
        }
        spec.params.push_back(SpecParam::boolean(name, value == "true"));
        break;
      case ParamKind::Choice:
        spec.params.push_back(SpecParam::chosen(name, std::string(value)));
        break;
      case ParamKind::Format:
        spec.params.push_back(SpecParam::number_format(name, parse_format(value)));
        break;
    }
  }

  std::string_view launch = text.substr(close + 1, at - close - 1);
  if (!launch.empty()) {
    if (launch.front() != '[' || launch.back() != ']') throw fail("launch shape is not [...]");
    launch = launch.substr(1, launch.size() - 2);
    while (!launch.empty()) {
      const auto comma = launch.find(',');
      const std::string_view item = launch.substr(0, comma);
      launch = comma == std::string_view::npos ? std::string_view() : launch.substr(comma + 1);
      const auto equals = item.find('=');
      if (equals == std::string_view::npos) throw fail(fmt::format("'{}' is not name=value", item));
      const std::string_view name = item.substr(0, equals);
      const auto value = parse_integer(item.substr(equals + 1), name);
      if (name == "threads")
        spec.launch.threads_per_block = static_cast<int>(value);
      else if (name == "smem")
        spec.launch.dynamic_smem_bytes = static_cast<int>(value);
      else
        throw fail(fmt::format("launch constant '{}' is not threads|smem", name));
    }
  }
  validate(spec);
  return spec;
}

Hash128 spec_hash(const KernelSpec& spec) { return hash128(to_string(spec)); }

std::uint64_t packed_format_code(const Format& format) {
  const kernels::FormatCode code{static_cast<int>(format.kind),
                                 format.is_signed,
                                 format.bits,
                                 format.exponent_bits,
                                 format.mantissa_bits,
                                 static_cast<int>(format.specials),
                                 format.bias,
                                 format.min_int,
                                 format.max_int};
  require(kernels::format_code_fits(code),
          "format {}: a field is out of the range a kernel parameter holds (bits "
          "1..32, exponent ≤ 15, mantissa ≤ 31, |bias| < 512)",
          format.name());
  return code.pack();
}

}  // namespace qgemm::jit
