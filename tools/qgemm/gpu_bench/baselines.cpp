#include "gpu_bench/baselines.hpp"

#include <fmt/format.h>

#include <limits>

#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

// Enough for cuBLAS's and cuBLASLt's largest split-K and stream-K kernels on Hopper.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

int as_int(std::int64_t value, const char* name) {
  require(value >= 1 && value <= std::numeric_limits<int>::max(),
          "cuBLAS baseline: {} = {} (rule: 1 <= {} <= 2^31 - 1)", name, value, name);
  return static_cast<int>(value);
}

template <typename T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const T& value, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value), what);
}

}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::CudaError, fmt::format("{}: {}: {}", what, cublasGetStatusName(status),
                                                cublasGetStatusString(status)));
}

std::string cublas_version_text() {
  const std::size_t version = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

CublasBf16Gemm::CublasBf16Gemm() : workspace_(kWorkspaceBytes) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  try {
    check_cublas(cublasSetWorkspace(handle_, workspace_.as<void>(), workspace_.bytes()),
                 "cublasSetWorkspace");
  } catch (...) {
    cublasDestroy(handle_);
    throw;
  }
}

CublasBf16Gemm::~CublasBf16Gemm() {
  if (handle_) cublasDestroy(handle_);
}

void CublasBf16Gemm::gemm(cudaStream_t stream, std::int64_t m, std::int64_t n, std::int64_t k,
                          const void* a, const void* w, void* c) {
  const int rows = as_int(m, "m"), columns = as_int(n, "n"), depth = as_int(k, "k");
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  // Column-major: Cᵀ [n x m] = op(W) · A, op(W) = T on the k x n view of W (see the header).
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, columns, rows, depth, &alpha, w,
                            CUDA_R_16BF, depth, a, CUDA_R_16BF, depth, &beta, c, CUDA_R_16BF,
                            columns, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16)");
}

std::string CublasBf16Gemm::description() {
  return "cublasGemmEx bf16 x bf16 -> bf16, fp32 accumulation";
}

CublasLtFp8Gemm::CublasLtFp8Gemm(bool fast_accumulation)
    : fast_accumulation_(fast_accumulation), workspace_(kWorkspaceBytes) {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
}

CublasLtFp8Gemm::~CublasLtFp8Gemm() {
  release_problem();
  if (handle_) cublasLtDestroy(handle_);
}

void CublasLtFp8Gemm::release_problem() {
  if (c_layout_) cublasLtMatrixLayoutDestroy(c_layout_);
  if (a_layout_) cublasLtMatrixLayoutDestroy(a_layout_);
  if (w_layout_) cublasLtMatrixLayoutDestroy(w_layout_);
  if (operation_) cublasLtMatmulDescDestroy(operation_);
  c_layout_ = a_layout_ = w_layout_ = nullptr;
  operation_ = nullptr;
  m_ = n_ = k_ = 0;
  algo_text_.clear();
}

void CublasLtFp8Gemm::prepare(std::int64_t m, std::int64_t n, std::int64_t k, const float* a_scale,
                              const float* w_scale) {
  release_problem();
  as_int(m, "m"), as_int(n, "n"), as_int(k, "k");
  check_cublas(cublasLtMatmulDescCreate(&operation_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  // cuBLASLt's A is our W (k x n column-major, transposed), its B our A (k x m, as is).
  set_attribute(operation_, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "set TRANSA");
  set_attribute(operation_, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "set TRANSB");
  const std::int8_t fast = fast_accumulation_ ? 1 : 0;
  set_attribute(operation_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "set FAST_ACCUM");
  const void* w_scale_pointer = w_scale;
  const void* a_scale_pointer = a_scale;
  set_attribute(operation_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale_pointer,
                "set A_SCALE_POINTER");
  set_attribute(operation_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale_pointer,
                "set B_SCALE_POINTER");
  check_cublas(cublasLtMatrixLayoutCreate(&w_layout_, CUDA_R_8F_E4M3, k, n, k),
               "cublasLtMatrixLayoutCreate (W)");
  check_cublas(cublasLtMatrixLayoutCreate(&a_layout_, CUDA_R_8F_E4M3, k, m, k),
               "cublasLtMatrixLayoutCreate (A)");
  check_cublas(cublasLtMatrixLayoutCreate(&c_layout_, CUDA_R_16BF, n, m, n),
               "cublasLtMatrixLayoutCreate (C)");

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t workspace_bytes = workspace_.bytes();
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof workspace_bytes);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, operation_, w_layout_, a_layout_, c_layout_,
                                            c_layout_, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    release_problem();
    throw Error(ErrorCode::Unsupported,
                fmt::format("cuBLASLt has no e4m3 algorithm for m = {}, n = {}, k = {} on this "
                            "GPU",
                            m, n, k));
  }
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
  check_cublas(result.state, "cublasLtMatmulAlgoGetHeuristic (result)");
  algo_ = result.algo;
  m_ = m, n_ = n, k_ = k;
  std::int32_t id = -1;
  std::uint32_t tile = 0;
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                       &written);
  algo_text_ = fmt::format("algo {} tile {}", id, tile);
}

void CublasLtFp8Gemm::gemm(cudaStream_t stream, const void* a, const void* w, void* c) {
  require(operation_ != nullptr, "cuBLASLt FP8 baseline: prepare() first");
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(handle_, operation_, &alpha, w, w_layout_, a, a_layout_, &beta, c, c_layout_,
                     c, c_layout_, &algo_, workspace_.as<void>(), workspace_.bytes(), stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    throw Error(ErrorCode::Unsupported,
                fmt::format("cublasLtMatmul: e4m3 with m = {}, n = {}, k = {} is not supported "
                            "on this GPU",
                            m_, n_, k_));
  check_cublas(status, "cublasLtMatmul (e4m3)");
}

std::string CublasLtFp8Gemm::description() const {
  return fmt::format("cublasLtMatmul e4m3 x e4m3 -> bf16, {} accumulation, {}",
                     fast_accumulation_ ? "fast" : "fp32-promoted", algo_text_);
}

}  // namespace qgemm::bench
