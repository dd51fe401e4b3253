#include "runtime/cublaslt.hpp"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "qgemm/error.hpp"
#include "quant/block_quant.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm::runtime {
namespace {

bool is_fp8(const Format& format) { return format == formats::e4m3 || format == formats::e5m2; }

bool is_block(Fp8ScaleMode mode) {
  return mode == Fp8ScaleMode::Block1x128 || mode == Fp8ScaleMode::Block128x128;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

const char* scaling_name(ActivationScaling scaling) {
  switch (scaling) {
    case ActivationScaling::None: return "no";
    case ActivationScaling::StaticTensor: return "static";
    case ActivationScaling::DynamicToken: return "per-token";
    case ActivationScaling::DynamicGroup: return "per-group";
    case ActivationScaling::MX: return "MX";
    case ActivationScaling::NV: return "NV";
  }
  return "?";
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::CudaError, fmt::format("{}: {} ({})", what, cublasGetStatusName(status),
                                                  cublasGetStatusString(status)));
}

cudaDataType_t data_type(const Format& format) {
  if (format == formats::e4m3) return CUDA_R_8F_E4M3;
  if (format == formats::e5m2) return CUDA_R_8F_E5M2;
  if (format == formats::bf16) return CUDA_R_16BF;
  if (format == formats::fp16) return CUDA_R_16F;
  return CUDA_R_32F;  // fp32: the shape rules admit nothing else
}

std::int32_t lt_scale_mode(Fp8ScaleMode mode) {
  switch (mode) {
    case Fp8ScaleMode::Tensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8ScaleMode::OuterVector: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case Fp8ScaleMode::Block1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8ScaleMode::Block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// Whether each scale of `layout` lies inside one cell of the canonical `grid` (along rows and
// along K), so that it can be filled from that cell's scale.
bool grid_covers(const ScaleGrid& grid, const Fp8ScaleLayout& layout) {
  const bool rows = grid.rows == 1 || grid.rows_per % layout.rows_per_scale == 0;
  const bool cols = grid.cols == 1 || grid.cols_per % layout.cols_per_scale == 0;
  return rows && cols;
}

// The canonical grid's scales (`codes` in `scale_format`, row-major) in `mode`'s layout for
// rows × k; padding 0.
std::vector<float> scales_in_layout(const std::vector<std::uint8_t>& codes,
                                    const Format& scale_format, const ScaleGrid& grid,
                                    std::int64_t rows, std::int64_t k, Fp8ScaleMode mode,
                                    const char* what) {
  const Fp8ScaleLayout layout = fp8_scale_layout(mode, rows, k);
  require(grid_covers(grid, layout),
          "{}: its {} x {} scale cells are finer than cuBLASLt's {} scales (rule: each {} x {} "
          "scale of the mode lies inside one cell of the grid)",
          what, grid.rows_per, grid.cols_per, fp8_scale_mode_name(mode), layout.rows_per_scale,
          layout.cols_per_scale);
  const std::size_t bytes = static_cast<std::size_t>(scale_format.storage_bytes());
  require(codes.size() == static_cast<std::size_t>(grid.count()) * bytes,
          "{}: {} scale bytes (rule: {} scales of {} bytes)", what, codes.size(), grid.count(),
          bytes);
  std::vector<float> out(static_cast<std::size_t>(layout.count), 0.0f);
  for (std::int64_t row = 0; row < rows; row += layout.rows_per_scale)
    for (std::int64_t block = 0; block < layout.blocks; ++block) {
      const std::int64_t cell =
          row / grid.rows_per * grid.cols + block * layout.cols_per_scale / grid.cols_per;
      std::uint32_t code = 0;
      for (std::size_t byte = 0; byte < bytes; ++byte)  // little-endian codes
        code |= std::uint32_t{codes[static_cast<std::size_t>(cell) * bytes + byte]} << (8 * byte);
      // Every qgemm scale format (≤ 32 bits: fp32, bf16, fp16, e8m0, ue4m3) is exact in fp32.
      out[static_cast<std::size_t>(row / layout.rows_per_scale * layout.row_stride +
                                   block * layout.block_stride)] =
          static_cast<float>(decode(scale_format, code));
    }
  return out;
}

}  // namespace

const char* fp8_scale_mode_name(Fp8ScaleMode mode) {
  switch (mode) {
    case Fp8ScaleMode::Tensor: return "tensor";
    case Fp8ScaleMode::OuterVector: return "outer-vector";
    case Fp8ScaleMode::Block1x128: return "1x128";
    case Fp8ScaleMode::Block128x128: return "128x128";
  }
  return "?";
}

std::int64_t fp8_block1x128_stride(std::int64_t rows) { return rows; }

Fp8ScaleLayout fp8_scale_layout(Fp8ScaleMode mode, std::int64_t rows, std::int64_t k) {
  require(rows >= 1 && k >= 1, "fp8_scale_layout: rows = {}, k = {} (rule: both >= 1)", rows, k);
  Fp8ScaleLayout layout;
  switch (mode) {
    case Fp8ScaleMode::Tensor: layout = {rows, k, 0, 0, 1, 1}; break;
    case Fp8ScaleMode::OuterVector: layout = {1, k, 1, 0, 1, rows}; break;
    case Fp8ScaleMode::Block1x128: {
      const std::int64_t blocks = ceil_div(k, kFp8ScaleBlock);
      const std::int64_t stride = fp8_block1x128_stride(rows);
      layout = {1, kFp8ScaleBlock, 1, stride, blocks, blocks * stride};
      break;
    }
    case Fp8ScaleMode::Block128x128: {
      const std::int64_t blocks = ceil_div(k, kFp8ScaleBlock);
      const std::int64_t padded = ceil_div(blocks, 4) * 4;  // L4
      layout = {kFp8ScaleBlock, kFp8ScaleBlock,
                padded,         1,
                blocks,         ceil_div(rows, kFp8ScaleBlock) * padded};
      break;
    }
  }
  return layout;
}

std::string fp8_matmul_unsupported_reason(const Fp8MatmulShape& s) {
  constexpr std::int64_t kMaxDim = std::numeric_limits<std::int32_t>::max();
  for (auto [name, value] : {std::pair{"m", s.m}, std::pair{"n", s.n}, std::pair{"k", s.k}})
    if (!(value >= 1 && value <= kMaxDim))
      return fmt::format("{} = {} (rule: 1 <= {} <= 2^31 - 1)", name, value, name);
  if (!is_fp8(s.a_format))
    return fmt::format("activation codes {} (rule: e4m3 or e5m2)", s.a_format.name());
  if (!is_fp8(s.w_format))
    return fmt::format("weight codes {} (rule: e4m3 or e5m2)", s.w_format.name());
  if (s.a_format == formats::e5m2 && s.w_format == formats::e5m2)
    return "e5m2 x e5m2 codes (rule: cuBLASLt's FP8 kernels take e4m3 on one side at least)";
  if (!(s.c_format == formats::bf16 || s.c_format == formats::fp16 || s.c_format == formats::fp32))
    return fmt::format("output {} (rule: bf16, fp16 or fp32)", s.c_format.name());
  if (s.k % 16 != 0)
    return fmt::format(
        "k = {} (rule: k % 16 == 0: the rows of A and W, k bytes each, must be "
        "16-byte aligned)",
        s.k);
  if (s.n % 16 != 0)
    return fmt::format(
        "n = {} (rule: n % 16 == 0: cuBLASLt FP8 takes its m, our n, in "
        "multiples of 16)",
        s.n);
  const std::int64_t ldc = s.ldc ? s.ldc : s.n;
  if (ldc < s.n || ldc > kMaxDim || ldc * s.c_format.storage_bytes() % 16 != 0)
    return fmt::format(
        "ldc = {} (rule: n = {} <= ldc <= 2^31 - 1, and rows of C 16-byte "
        "aligned: ldc · {} bytes % 16 == 0)",
        ldc, s.n, s.c_format.storage_bytes());
  if (!(s.alignment >= 16 && s.alignment <= 256 && (s.alignment & (s.alignment - 1)) == 0))
    return fmt::format("alignment = {} (rule: a power of two from 16 to 256 bytes)", s.alignment);
  if (s.a_scale == Fp8ScaleMode::Block128x128)
    return "activation scales 128x128 (rule: tensor, outer-vector or 1x128: 128 x 128 blocks "
           "are the weight's)";
  const bool served_pair =
      (s.a_scale == Fp8ScaleMode::Tensor && s.w_scale == Fp8ScaleMode::Tensor) ||
      (s.a_scale == Fp8ScaleMode::OuterVector && s.w_scale == Fp8ScaleMode::OuterVector) ||
      (s.a_scale == Fp8ScaleMode::Block1x128 && is_block(s.w_scale));
  if (!served_pair)
    return fmt::format(
        "scales {} x {} (rule: cuBLASLt pairs tensor x tensor, outer-vector x "
        "outer-vector, 1x128 x 128x128 and 1x128 x 1x128; fp8_scale_modes "
        "expands the coarser side)",
        fp8_scale_mode_name(s.a_scale), fp8_scale_mode_name(s.w_scale));
  const bool block = is_block(s.a_scale);
  if (block && !(s.a_format == formats::e4m3 && s.w_format == formats::e4m3))
    return fmt::format("{} x {} codes with block scales (rule: block scaling takes e4m3 codes)",
                       s.a_format.name(), s.w_format.name());
  if (block && s.fast_accumulation)
    return "fast accumulation with block scales (rule: cuBLASLt's block-scaled kernels promote "
           "the accumulation to fp32: fast_accumulation = false)";
  if (s.compute_capability != 0) {
    const int major = s.compute_capability / 10, minor = s.compute_capability % 10;
    if (s.compute_capability < 89)
      return fmt::format("compute capability {}.{} (rule: FP8 tensor cores need 8.9 or later)",
                         major, minor);
    if (s.a_scale != Fp8ScaleMode::Tensor && s.compute_capability != 90)
      return fmt::format(
          "{} scales on compute capability {}.{} (rule: cuBLASLt 13.1 serves "
          "outer-vector and block scales on 9.0 only)",
          fp8_scale_mode_name(s.a_scale), major, minor);
  }
  // Measured on the H200 (CUDA 13.0, cuBLASLt 13.1): no block-scaled algorithm for m = 1 or 7,
  // every shape tried from m = 16 on.
  if (block && s.m < 16)
    return fmt::format("m = {} with block scales (rule: m >= 16: cuBLASLt's block-scaled kernels "
                       "take at least 16 tokens)",
                       s.m);
  return "";
}

std::optional<Fp8ScaleModes> fp8_scale_modes(const Scheme& scheme, std::string* why_not) {
  auto refuse = [why_not](std::string reason) -> std::optional<Fp8ScaleModes> {
    if (why_not) *why_not = std::move(reason);
    return std::nullopt;
  };
  const WeightQuant& w = scheme.weight;
  const ActivationQuant& a = scheme.activation;
  if (!is_fp8(w.format))
    return refuse(fmt::format("weight codes {} (rule: cuBLASLt FP8 takes e4m3 or e5m2 weights)",
                              w.format.name()));
  if (w.zero_point != ZeroPoint::None)
    return refuse("weight zero points (rule: none: cuBLASLt multiplies codes by scales only)");
  if (!a.is_quantized() || !is_fp8(a.format))
    return refuse(
        fmt::format("activations {} (rule: e4m3 or e5m2 codes: cuBLASLt FP8 "
                    "multiplies 8-bit floats on both sides)",
                    a.format.name()));
  Fp8ScaleMode weight_mode = Fp8ScaleMode::Tensor;
  switch (w.granularity) {
    case WeightGranularity::PerTensor: weight_mode = Fp8ScaleMode::Tensor; break;
    case WeightGranularity::PerChannel: weight_mode = Fp8ScaleMode::OuterVector; break;
    case WeightGranularity::Group:
      if (w.group != kFp8ScaleBlock)
        return refuse(
            fmt::format("weight groups of {} (rule: 128, cuBLASLt's 1x128 blocks)", w.group));
      weight_mode = Fp8ScaleMode::Block1x128;
      break;
    case WeightGranularity::Block:
      if (w.block_n != kFp8ScaleBlock || w.block_k != kFp8ScaleBlock)
        return refuse(
            fmt::format("weight blocks of {} x {} (rule: 128 x 128, cuBLASLt's 2-D "
                        "blocks)",
                        w.block_n, w.block_k));
      weight_mode = Fp8ScaleMode::Block128x128;
      break;
  }
  Fp8ScaleMode activation_mode = Fp8ScaleMode::Tensor;
  switch (a.scaling) {
    case ActivationScaling::StaticTensor: activation_mode = Fp8ScaleMode::Tensor; break;
    case ActivationScaling::DynamicToken: activation_mode = Fp8ScaleMode::OuterVector; break;
    case ActivationScaling::DynamicGroup:
      if (a.group != kFp8ScaleBlock)
        return refuse(
            fmt::format("activation groups of {} (rule: 128, cuBLASLt's 1x128 "
                        "blocks)",
                        a.group));
      activation_mode = Fp8ScaleMode::Block1x128;
      break;
    default:  // their scales (e8m0, ue4m3 and a tensor scale) have no cuBLASLt FP8 mode
      return refuse("MX / NV activation scales (rule: static, per-token or g128 fp32 scales)");
  }
  // cuBLASLt's pairs: a block mode on either side makes A 1x128 (W keeps 128 x 128 blocks or
  // becomes 1x128); otherwise both sides take the finer of tensor and outer-vector.
  if (is_block(activation_mode) || is_block(weight_mode))
    return Fp8ScaleModes{Fp8ScaleMode::Block1x128, weight_mode == Fp8ScaleMode::Block128x128
                                                       ? Fp8ScaleMode::Block128x128
                                                       : Fp8ScaleMode::Block1x128};
  const Fp8ScaleMode both = std::max(activation_mode, weight_mode);  // Tensor < OuterVector
  return Fp8ScaleModes{both, both};
}

std::vector<float> fp8_weight_scales(const PackedWeight& weight, Fp8ScaleMode mode) {
  quant_detail::check_packed_weight_metadata(weight, "fp8_weight_scales");  // reads scales only
  require(weight.quant.zero_point == ZeroPoint::None,
          "fp8_weight_scales: weight with zero points (rule: none: cuBLASLt applies scales only)");
  return scales_in_layout(weight.scales, weight.quant.scale_format, weight.scale_grid(), weight.n,
                          weight.k, mode, "fp8_weight_scales: the weight");
}

std::vector<float> fp8_activation_scales(const PackedActivation& activation, Fp8ScaleMode mode) {
  require(activation.quant.is_quantized(),
          "fp8_activation_scales: {} activations are not quantized",
          activation.quant.format.name());
  require(mode != Fp8ScaleMode::Block128x128,
          "fp8_activation_scales: mode 128x128 (rule: activations take tensor, outer-vector or "
          "1x128 scales)");
  const ActivationQuant& quant = activation.quant;
  require(quant.scaling != ActivationScaling::NV,
          "fp8_activation_scales: NV activations (rule: their tensor scale has no cuBLASLt mode)");
  return scales_in_layout(activation.scales, quant.scale_format, activation.scale_grid(),
                          activation.m, activation.k, mode, "fp8_activation_scales: A");
}

kernels::QuantizeActivationArgs fp8_quantize_activation_args(const ActivationQuant& quant,
                                                             Fp8ScaleMode mode, std::int64_t m,
                                                             std::int64_t k, CUdeviceptr input,
                                                             std::int64_t lda,
                                                             double static_scale) {
  require(is_fp8(quant.format) && quant.scale_format == formats::fp32,
          "fp8_quantize_activation_args: codes {} with {} scales (rule: e4m3 or e5m2 codes, "
          "fp32 scales)",
          quant.format.name(), quant.scale_format.name());
  kernels::QuantizeActivationArgs args =
      quantize_activation_args(quant, m, k, input, lda, static_scale);
  const Fp8ScaleLayout layout = fp8_scale_layout(mode, m, k);
  const bool row_wide = quant.scaling == ActivationScaling::StaticTensor ||
                        quant.scaling == ActivationScaling::DynamicToken;
  // A row's one scale is repeated into every scale of the layout it covers; a group's scale
  // goes to the one 1x128 block it is.
  const bool fits =
      mode != Fp8ScaleMode::Block128x128 &&
      (row_wide ? grid_covers(activation_scale_grid(quant, m, k), layout)
                : quant.scaling == ActivationScaling::DynamicGroup &&
                      mode == Fp8ScaleMode::Block1x128 && quant.group == kFp8ScaleBlock);
  require(fits,
          "fp8_quantize_activation_args: {} scales from {} scaling{} (rule: static into any "
          "activation mode, per token into outer-vector or 1x128, g128 into 1x128)",
          fp8_scale_mode_name(mode), scaling_name(quant.scaling),
          quant.group > 0 ? fmt::format(" in groups of {}", quant.group) : "");
  args.scale_row_stride = layout.row_stride;
  args.scale_cell_stride = layout.block_stride;
  args.scale_copies = row_wide ? layout.blocks : 1;
  return args;
}

CublasLt::CublasLt() : placeholder_scales_(256) {
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  handle_ = handle;
}

CublasLt::~CublasLt() {
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

std::string CublasLt::version_text() {
  const std::size_t version = cublasLtGetVersion();  // major · 10000 + minor · 100 + patch
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

struct Fp8Matmul::Plan {
  Fp8MatmulShape shape;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, a_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace_bytes = 0;
  std::string description;

  ~Plan() {
    if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
    if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
    if (w_layout) cublasLtMatrixLayoutDestroy(w_layout);
    if (operation) cublasLtMatmulDescDestroy(operation);
  }

  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value, const char* what) {
    check(cublasLtMatmulDescSetAttribute(operation, attribute, &value, sizeof value), what);
  }
};

Fp8Matmul::Fp8Matmul(std::unique_ptr<Plan> plan) : plan_(std::move(plan)) {}
Fp8Matmul::~Fp8Matmul() = default;
Fp8Matmul::Fp8Matmul(Fp8Matmul&&) noexcept = default;
Fp8Matmul& Fp8Matmul::operator=(Fp8Matmul&&) noexcept = default;

const Fp8MatmulShape& Fp8Matmul::shape() const { return plan_->shape; }
std::size_t Fp8Matmul::workspace_bytes() const { return plan_->workspace_bytes; }
const std::string& Fp8Matmul::description() const { return plan_->description; }

Fp8Matmul Fp8Matmul::prepare(const CublasLt& cublaslt, const Fp8MatmulShape& requested) {
  Fp8MatmulShape shape = requested;
  if (shape.ldc == 0) shape.ldc = shape.n;
  require(shape.m >= 1 && shape.n >= 1 && shape.k >= 1 && shape.ldc >= shape.n,
          "cuBLASLt FP8: m = {}, n = {}, k = {}, ldc = {} (rule: sizes >= 1, ldc >= n)", shape.m,
          shape.n, shape.k, shape.ldc);
  if (const std::string why = fp8_matmul_unsupported_reason(shape); !why.empty())
    throw Error(ErrorCode::Unsupported, "cuBLASLt FP8: " + why);

  auto plan = std::make_unique<Plan>();
  plan->shape = shape;
  plan->handle = static_cast<cublasLtHandle_t>(cublaslt.handle());
  check(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  // cuBLASLt's A is our W (k × n column-major, transposed), its B our A (k × m, as is).
  plan->set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "set TRANSA");
  plan->set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "set TRANSB");
  const std::int8_t fast = shape.fast_accumulation ? 1 : 0;
  plan->set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "set FAST_ACCUM");
  plan->set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(shape.w_scale), "set A_SCALE_MODE");
  plan->set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(shape.a_scale), "set B_SCALE_MODE");
  // The heuristic wants scale pointers for the vector and block modes (it refuses a null one);
  // it reads no data, so a placeholder stands in until run() sets the real ones.
  const void* placeholder_scales = cublaslt.placeholder_scales();
  plan->set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, placeholder_scales, "set A_SCALE_POINTER");
  plan->set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, placeholder_scales, "set B_SCALE_POINTER");
  const auto k = static_cast<std::uint64_t>(shape.k);
  check(cublasLtMatrixLayoutCreate(&plan->w_layout, data_type(shape.w_format), k,
                                   static_cast<std::uint64_t>(shape.n), shape.k),
        "cublasLtMatrixLayoutCreate (W)");
  check(cublasLtMatrixLayoutCreate(&plan->a_layout, data_type(shape.a_format), k,
                                   static_cast<std::uint64_t>(shape.m), shape.k),
        "cublasLtMatrixLayoutCreate (A)");
  check(cublasLtMatrixLayoutCreate(&plan->c_layout, data_type(shape.c_format),
                                   static_cast<std::uint64_t>(shape.n),
                                   static_cast<std::uint64_t>(shape.m), shape.ldc),
        "cublasLtMatrixLayoutCreate (C)");

  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t max_workspace = kFp8MatmulWorkspaceBytes;
  const auto alignment = static_cast<std::uint32_t>(shape.alignment);
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof max_workspace);
  // The algorithm must serve pointers of the promised alignment (the default assumes 256).
  for (auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    if (status == CUBLAS_STATUS_SUCCESS)
      status =
          cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(plan->handle, plan->operation, plan->w_layout,
                                            plan->a_layout, plan->c_layout, plan->c_layout,
                                            preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  const std::string call = fmt::format(
      "{} x {} -> {}, scales {} x {}, {} accumulation", shape.a_format.name(),
      shape.w_format.name(), shape.c_format.name(), fp8_scale_mode_name(shape.a_scale),
      fp8_scale_mode_name(shape.w_scale), shape.fast_accumulation ? "fast" : "fp32-promoted");
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0))
    throw Error(
        ErrorCode::Unsupported,
        fmt::format("cuBLASLt FP8: no algorithm for {} at m = {}, n = {}, k = {}, ldc = "
                    "{} on this GPU (cublasLtMatmulAlgoGetHeuristic: {})",
                    call, shape.m, shape.n, shape.k, shape.ldc, cublasGetStatusName(status)));
  check(status, "cublasLtMatmulAlgoGetHeuristic");
  check(result.state, "cublasLtMatmulAlgoGetHeuristic (result)");
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;

  std::int32_t id = -1;
  std::uint32_t tile = 0, stages = 0;
  std::int32_t split_k = 1;
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                       &written);
  cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                       sizeof tile, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof stages, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k,
                                       sizeof split_k, &written);
  plan->description = fmt::format("cublasLtMatmul {}, algo {} tile {} stages {} split-k {}", call,
                                  id, tile, stages, split_k);
  return Fp8Matmul(std::move(plan));
}

namespace {

bool aligned(const void* pointer, std::uintptr_t alignment) {
  return pointer != nullptr && reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

}  // namespace

void Fp8Matmul::run(const Operands& operands, void* workspace, std::size_t workspace_bytes,
                    CUstream stream) {
  Plan& plan = *plan_;
  const auto alignment = static_cast<std::uintptr_t>(plan.shape.alignment);
  require(aligned(operands.a, alignment) && aligned(operands.w, alignment) &&
              aligned(operands.c, alignment),
          "cuBLASLt FP8: a = {}, w = {}, c = {} (rule: non-null, {}-byte aligned)",
          fmt::ptr(operands.a), fmt::ptr(operands.w), fmt::ptr(operands.c), alignment);
  // A scalar scale is one float; vectors and blocks are read 16 bytes at a time.
  auto scale_alignment = [](Fp8ScaleMode mode) -> std::uintptr_t {
    return mode == Fp8ScaleMode::Tensor ? 4 : 16;
  };
  require(aligned(operands.a_scales, scale_alignment(plan.shape.a_scale)) &&
              aligned(operands.w_scales, scale_alignment(plan.shape.w_scale)),
          "cuBLASLt FP8: a_scales = {}, w_scales = {} (rule: non-null, 16-byte aligned; 4 for a "
          "tensor scale)",
          fmt::ptr(operands.a_scales), fmt::ptr(operands.w_scales));
  require(workspace_bytes >= plan.workspace_bytes && (plan.workspace_bytes == 0 || workspace),
          "cuBLASLt FP8: workspace of {} bytes at {} (rule: >= {} bytes, non-null)",
          workspace_bytes, fmt::ptr(workspace), plan.workspace_bytes);
  const void* w_scales = operands.w_scales;
  const void* a_scales = operands.a_scales;
  plan.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales, "set A_SCALE_POINTER");
  plan.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scales, "set B_SCALE_POINTER");
  const float beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(plan.handle, plan.operation, &operands.alpha, operands.w, plan.w_layout,
                     operands.a, plan.a_layout, &beta, operands.c, plan.c_layout, operands.c,
                     plan.c_layout, &plan.algo, workspace, workspace_bytes, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    throw Error(ErrorCode::Unsupported,
                fmt::format("cublasLtMatmul: {} refused at launch (m = {}, n = {}, k = {})",
                            plan.description, plan.shape.m, plan.shape.n, plan.shape.k));
  check(status, "cublasLtMatmul (FP8)");
}

struct Block1x128ScaleTranspose::Plan {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatrixTransformDesc_t transform = nullptr;
  cublasLtMatrixLayout_t canonical = nullptr, out = nullptr;
  ~Plan() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (canonical) cublasLtMatrixLayoutDestroy(canonical);
    if (transform) cublasLtMatrixTransformDescDestroy(transform);
  }
};

Block1x128ScaleTranspose::Block1x128ScaleTranspose(std::unique_ptr<Plan> plan)
    : plan_(std::move(plan)) {}
Block1x128ScaleTranspose::~Block1x128ScaleTranspose() = default;
Block1x128ScaleTranspose::Block1x128ScaleTranspose(Block1x128ScaleTranspose&&) noexcept = default;
Block1x128ScaleTranspose& Block1x128ScaleTranspose::operator=(Block1x128ScaleTranspose&&) noexcept =
    default;

Block1x128ScaleTranspose Block1x128ScaleTranspose::prepare(const CublasLt& cublaslt,
                                                           std::int64_t rows, std::int64_t k) {
  const Fp8ScaleLayout layout = fp8_scale_layout(Fp8ScaleMode::Block1x128, rows, k);
  auto plan = std::make_unique<Plan>();
  plan->handle = static_cast<cublasLtHandle_t>(cublaslt.handle());
  check(cublasLtMatrixTransformDescCreate(&plan->transform, CUDA_R_32F),
        "cublasLtMatrixTransformDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T;
  check(cublasLtMatrixTransformDescSetAttribute(
            plan->transform, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, &transpose, sizeof(transpose)),
        "set TRANSA");
  // Column-major views: the canonical [rows][blocks] is blocks × rows (ld blocks); its transpose
  // rows × blocks, ld = the layout's block stride, is [b · stride + r].
  check(cublasLtMatrixLayoutCreate(&plan->canonical, CUDA_R_32F,
                                   static_cast<std::uint64_t>(layout.blocks),
                                   static_cast<std::uint64_t>(rows), layout.blocks),
        "cublasLtMatrixLayoutCreate (canonical scales)");
  check(cublasLtMatrixLayoutCreate(&plan->out, CUDA_R_32F, static_cast<std::uint64_t>(rows),
                                   static_cast<std::uint64_t>(layout.blocks), layout.block_stride),
        "cublasLtMatrixLayoutCreate (1x128 scales)");
  return Block1x128ScaleTranspose(std::move(plan));
}

void Block1x128ScaleTranspose::run(const float* canonical, float* out, CUstream stream) const {
  require(canonical != nullptr && out != nullptr,
          "Block1x128ScaleTranspose: scales = {}, out = {} (rule: non-null)", fmt::ptr(canonical),
          fmt::ptr(out));
  const float one = 1.0f, zero = 0.0f;
  // beta = 0: no B operand (null B and layout, as cuBLASLt allows).
  check(cublasLtMatrixTransform(plan_->handle, plan_->transform, &one, canonical, plan_->canonical,
                                &zero, nullptr, nullptr, out, plan_->out, stream),
        "cublasLtMatrixTransform (1x128 scales)");
}

}  // namespace qgemm::runtime
