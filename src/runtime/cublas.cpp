#include "runtime/cublas.hpp"

#include <cublas_v2.h>
#include <fmt/format.h>

#include "qgemm/error.hpp"

namespace qgemm::runtime {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::CudaError,
                fmt::format("{}: {} ({})", what, cublasGetStatusName(status),
                            cublasGetStatusString(status)));
}

cudaDataType_t data_type(const Format& f, const char* what) {
  if (f == formats::bf16) return CUDA_R_16BF;
  if (f == formats::fp16) return CUDA_R_16F;
  if (f == formats::fp32) return CUDA_R_32F;
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("cublas gemm: {} = {} (rule: bf16, fp16 or fp32)", what, f.name()));
}

}  // namespace

Cublas::Cublas() {
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "cublasCreate");
  handle_ = handle;
}

Cublas::~Cublas() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void Cublas::gemm_nt(void* stream, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                     const void* a, std::int64_t lda, const void* w, std::int64_t ldw,
                     const Format& input, void* c, std::int64_t ldc, const Format& c_type,
                     void* workspace, std::size_t workspace_bytes) {
  const cudaDataType_t in = data_type(input, "input");
  const cudaDataType_t out = data_type(c_type, "output");
  if (in == CUDA_R_32F || !(out == in || out == CUDA_R_32F))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("cublas gemm: input {} with output {} (rule: 16-bit input; output of "
                            "the same type or fp32)",
                            input.name(), c_type.name()));
  auto handle = static_cast<cublasHandle_t>(handle_);
  check(cublasSetStream(handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  check(cublasSetWorkspace(handle, workspace, workspace_bytes), "cublasSetWorkspace");
  // Column-major view: Cᵀ[n][m] = W[n][k] (Wᵀ stored k × n, transposed) · Aᵀ (k × m).
  const float beta = 0.0f;
  check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, w, in, static_cast<int>(ldw), a, in,
                     static_cast<int>(lda), &beta, c, out, static_cast<int>(ldc),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace qgemm::runtime
