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

CublasBf16Gemm::Grouped CublasBf16Gemm::prepare_grouped(const std::vector<std::int64_t>& rows,
                                                        const std::vector<std::int64_t>& row_start,
                                                        const std::vector<const void*>& weights,
                                                        std::int64_t n, std::int64_t k,
                                                        const void* a, void* c) {
  require(rows.size() == row_start.size() && rows.size() == weights.size(),
          "cuBLAS grouped baseline: {} row counts, {} starts, {} weights (rule: one each per "
          "expert)",
          rows.size(), row_start.size(), weights.size());
  Grouped g;
  const int columns = as_int(n, "n"), depth = as_int(k, "k");
  std::vector<const void*> w_pointers, a_pointers;
  std::vector<void*> c_pointers;
  for (std::size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    // Column-major per group, as gemm(): Cᵀ [n x rows] = op(W_e) · A_e.
    g.rows.push_back(as_int(rows[e], "rows"));
    g.n.push_back(columns);
    g.k.push_back(depth);
    g.ld_w.push_back(depth);
    g.ld_a.push_back(depth);
    g.ld_c.push_back(columns);
    g.group_size.push_back(1);
    g.alpha.push_back(1.0f);
    g.beta.push_back(0.0f);
    g.op_w.push_back(CUBLAS_OP_T);
    g.op_a.push_back(CUBLAS_OP_N);
    w_pointers.push_back(weights[e]);
    a_pointers.push_back(static_cast<const char*>(a) + row_start[e] * k * 2);
    c_pointers.push_back(static_cast<char*>(c) + row_start[e] * n * 2);
  }
  require(!g.rows.empty(), "cuBLAS grouped baseline: no expert has rows");
  g.w_pointers = runtime::DeviceBuffer::from(w_pointers);
  g.a_pointers = runtime::DeviceBuffer::from(a_pointers);
  g.c_pointers = runtime::DeviceBuffer::from(c_pointers);
  return g;
}

void CublasBf16Gemm::grouped_gemm(cudaStream_t stream, const Grouped& g) {
  check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      handle_, g.op_w.data(), g.op_a.data(), g.n.data(), g.rows.data(), g.k.data(),
      g.alpha.data(), g.w_pointers.as<const void* const>(), CUDA_R_16BF, g.ld_w.data(),
      g.a_pointers.as<const void* const>(), CUDA_R_16BF, g.ld_a.data(), g.beta.data(),
      g.c_pointers.as<void* const>(), CUDA_R_16BF, g.ld_c.data(), static_cast<int>(g.rows.size()),
      g.group_size.data(), CUBLAS_COMPUTE_32F);
  // A cuBLAS (or GPU) without this call for bf16: the baseline cannot run here, nothing broke.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH)
    throw Error(ErrorCode::Unsupported,
                fmt::format("cublasGemmGroupedBatchedEx (bf16): {}", cublasGetStatusString(status)));
  check_cublas(status, "cublasGemmGroupedBatchedEx (bf16)");
}

std::string CublasBf16Gemm::grouped_description() {
  return "cublasGemmGroupedBatchedEx bf16 x bf16 -> bf16, fp32 accumulation, a group per expert";
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
