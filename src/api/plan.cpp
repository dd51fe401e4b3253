// GemmProblem checks and the GemmPlan accessors (include/qgemm/plan.hpp).
#include <fmt/format.h>

#include "api/plan_data.hpp"
#include "qgemm/error.hpp"

namespace qgemm {

void validate(const GemmProblem& p) {
  auto fail = [](const std::string& message) {
    throw Error(ErrorCode::InvalidArgument, "gemm problem: " + message);
  };
  constexpr std::int64_t kIndexLimit = 0x7fffffff;  // the kernels index rows and columns in int
  if (p.m < 1) fail(fmt::format("m = {} (rule: M >= 1)", p.m));
  if (p.m_max != 0 && p.m_max < p.m)
    fail(fmt::format("m_max = {} is below m = {} (rule: 0, or an M range [m, m_max])", p.m_max,
                     p.m));
  if (p.max_rows() > kIndexLimit) fail(fmt::format("M = {} exceeds 2^31 - 1", p.max_rows()));
  if (p.n < 1 || p.k < 1) fail(fmt::format("N = {}, K = {} (rule: both >= 1)", p.n, p.k));
  if (p.n > kIndexLimit || p.k > kIndexLimit)
    fail(fmt::format("N = {}, K = {} (rule: both below 2^31)", p.n, p.k));
  validate(p.scheme);
  validate_shape(p.scheme, p.m, p.n, p.k);
  const ActivationQuant& a = p.scheme.activation;
  if (p.prequantized) {
    if (!a.is_quantized())
      fail(fmt::format("prequantized input with unquantized {} activations (rule: pre-quantized "
                       "codes need a quantized scheme.activation)",
                       a.format.name()));
    if (!(p.input == a.format))
      fail(fmt::format("input = {} but the pre-quantized codes are {} (rule: input = "
                       "scheme.activation.format)",
                       p.input.name(), a.format.name()));
  } else {
    if (!(p.input == formats::bf16 || p.input == formats::fp16))
      fail(fmt::format("input = {} (rule: bf16 or fp16; quantized codes come pre-quantized)",
                       p.input.name()));
    if (!a.is_quantized() && !(a.format == p.input))
      fail(fmt::format("input = {} but the scheme's activations are {} (rule: equal for "
                       "unquantized activations)",
                       p.input.name(), a.format.name()));
  }
  if (p.ldc != 0 && p.ldc < p.n) fail(fmt::format("ldc = {} (rule: 0, or at least N = {})", p.ldc, p.n));
  const Format& out = p.scheme.output;
  if (!(out == formats::bf16 || out == formats::fp16 || out == formats::fp32))
    fail(fmt::format("output = {} (rule: bf16, fp16 or fp32)", out.name()));
  const int align = p.a_alignment;
  if (align < 1 || align > 16 || (align & (align - 1)) != 0)
    fail(fmt::format("a_alignment = {} (rule: a power of two from 1 to 16)", align));
  if (p.experts < 0 || p.experts > 4096)
    fail(fmt::format("experts = {} (rule: 0 for a dense GEMM, else 1 .. 4096)", p.experts));
  if (p.route_block != 0 && (p.experts == 0 || p.route_block < 8 || p.route_block > 256 ||
                             (p.route_block & (p.route_block - 1)) != 0))
    fail(fmt::format("route_block = {} (rule: 0, or for a grouped GEMM a power of two from 8 to "
                     "256, a multiple of the kernel's token tile)",
                     p.route_block));
  if (p.glu && (p.experts == 0 || out.storage_bytes() != 2))
    fail(
        fmt::format("glu = {} with experts = {} and output {} (rule: a fused GLU is a grouped "
                    "gate_up GEMM's, with 16-bit output)",
                    glu_kind_name(*p.glu), p.experts, out.name()));
  if (align < p.input.storage_bytes())
    fail(fmt::format("a_alignment = {} is below the {}-byte elements of A", align,
                     p.input.storage_bytes()));
  const int c_align = p.c_alignment;
  if (c_align < 1 || c_align > 16 || (c_align & (c_align - 1)) != 0)
    fail(fmt::format("c_alignment = {} (rule: a power of two from 1 to 16)", c_align));
  if (c_align < out.storage_bytes())
    fail(fmt::format("c_alignment = {} is below the {}-byte elements of C", c_align,
                     out.storage_bytes()));
}

const GemmProblem& GemmPlan::problem() const {
  if (!data_) throw Error(ErrorCode::InvalidArgument, "GemmPlan: empty plan (make one first)");
  return data_->problem;
}

std::vector<GemmPlan::Choice> GemmPlan::choices() const {
  problem();
  return data_->choices;
}

const GemmPlan::Choice& GemmPlan::choice_for(std::int64_t m) const {
  problem();
  for (const Choice& choice : data_->choices)
    if (m >= choice.m_low && m <= choice.m_high) return choice;
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("GemmPlan: M = {} is outside the plan's range [{}, {}]", m,
                          data_->problem.m, data_->problem.max_rows()));
}

std::size_t GemmPlan::workspace_bytes() const {
  problem();
  return data_->scratch_bytes + data_->zeroed_bytes;
}

std::uint64_t GemmPlan::key() const {
  problem();
  return data_->key;
}

std::string GemmPlan::to_string() const {
  if (!data_) return "GemmPlan (empty)";
  return data_->description;
}

}  // namespace qgemm
