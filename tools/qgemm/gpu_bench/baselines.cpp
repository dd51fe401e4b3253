#include "gpu_bench/baselines.hpp"

#include <fmt/format.h>

#include <limits>

#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

// Enough for cuBLAS's largest split-K and stream-K kernels on Hopper.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

int as_int(std::int64_t value, const char* name) {
  require(value >= 1 && value <= std::numeric_limits<int>::max(),
          "cuBLAS baseline: {} = {} (rule: 1 <= {} <= 2^31 - 1)", name, value, name);
  return static_cast<int>(value);
}

}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::CudaError, fmt::format("{}: {}: {}", what, cublasGetStatusName(status),
                                                cublasGetStatusString(status)));
}

std::string cublas_version_text() { return runtime::CublasLt::version_text(); }

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
    : fast_accumulation_(fast_accumulation), workspace_(runtime::kFp8MatmulWorkspaceBytes) {}

void CublasLtFp8Gemm::prepare(std::int64_t m, std::int64_t n, std::int64_t k, const float* a_scale,
                              const float* w_scale) {
  matmul_.reset();
  runtime::Fp8MatmulShape shape;
  shape.m = as_int(m, "m"), shape.n = as_int(n, "n"), shape.k = as_int(k, "k");
  shape.fast_accumulation = fast_accumulation_;
  shape.alignment = 256;  // the bench's buffers come from cuMemAlloc
  matmul_ = runtime::Fp8Matmul::prepare(cublaslt_, shape);
  a_scale_ = a_scale;
  w_scale_ = w_scale;
}

void CublasLtFp8Gemm::gemm(cudaStream_t stream, const void* a, const void* w, void* c) {
  require(matmul_.has_value(), "cuBLASLt FP8 baseline: prepare() first");
  matmul_->run({a, a_scale_, w, w_scale_, c, 1.0f}, workspace_.as<void>(), workspace_.bytes(),
               stream);
}

std::string CublasLtFp8Gemm::description() const {
  return matmul_ ? matmul_->description() : "cublasLtMatmul (not prepared)";
}

}  // namespace qgemm::bench
