// The cuBLAS baselines of `qgemm bench`: what a user runs without qgemm.
//
//   cublas-bf16          cublasGemmEx, bf16 weights and activations (the unquantized model),
//                        fp32 accumulation, bf16 output
//   cublaslt-fp8         cublasLtMatmul, e4m3 weights and activations with one fp32 scale per
//                        tensor (the A/B scale pointers), bf16 output, fast accumulation
//                        (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1)
//   cublaslt-fp8-exact   the same with the accumulation promoted to fp32 (FAST_ACCUM = 0)
//
// The FP8 baselines pad M (tokens) to a multiple of 16 (workbench.hpp), as serving engines have
// done for cuBLASLt's FP8 kernels, and time the padded product (runtime/cublaslt.hpp, which
// runs them, serves any M).
//
// Row-major C[m, n] = A[m, k] · W[n, k]ᵀ is, in cuBLAS's column-major terms, Cᵀ (n x m, ld n) =
// op(W) · A with W seen as a k x n column-major matrix transposed (op T) and A as a k x m one
// (op N): the "TN" form, which is also the only one cuBLASLt's FP8 kernels accept.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cublaslt.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::bench {

// Error(CudaError) "<what>: <status name>: <description>" unless CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* what);

// "13.0.2": the cuBLAS this binary runs against.
std::string cublas_version_text();

class CublasBf16Gemm {
 public:
  CublasBf16Gemm();
  ~CublasBf16Gemm();
  CublasBf16Gemm(const CublasBf16Gemm&) = delete;
  CublasBf16Gemm& operator=(const CublasBf16Gemm&) = delete;

  // C = A · Wᵀ, all bf16 and row-major (A [m, k], W [n, k], C [m, n]). Asynchronous.
  void gemm(cudaStream_t stream, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
            const void* w, void* c);
  static std::string description();

  // A grouped product (MoE): for each expert e with rows[e] > 0, the rows row_start[e] ..
  // row_start[e] + rows[e] − 1 of A [*, k] times W_e [n, k]ᵀ into the same rows of C [*, n], all
  // bf16 and row-major; weights[e] is W_e's device address. One cublasGemmGroupedBatchedEx call
  // (a group per expert with rows); prepare once, run many times.
  struct Grouped {
    std::vector<int> rows, n, k, ld_w, ld_a, ld_c, group_size;
    std::vector<float> alpha, beta;
    std::vector<cublasOperation_t> op_w, op_a;
    runtime::DeviceBuffer w_pointers, a_pointers, c_pointers;  // device arrays of pointers
  };
  static Grouped prepare_grouped(const std::vector<std::int64_t>& rows,
                                 const std::vector<std::int64_t>& row_start,
                                 const std::vector<const void*>& weights, std::int64_t n,
                                 std::int64_t k, const void* a, void* c);
  void grouped_gemm(cudaStream_t stream, const Grouped& grouped);
  static std::string grouped_description();

 private:
  cublasHandle_t handle_ = nullptr;
  // A workspace of our own: cuBLAS then allocates nothing inside a graph capture.
  runtime::DeviceBuffer workspace_;
};

// The per-tensor FP8 baseline through the library's cuBLASLt component (runtime/cublaslt.hpp):
// the bench keeps its own handle and a workspace of kFp8MatmulWorkspaceBytes.
class CublasLtFp8Gemm {
 public:
  explicit CublasLtFp8Gemm(bool fast_accumulation);

  // Describes C (bf16, row-major [m, n]) = a_scale · w_scale · A · Wᵀ for e4m3 A [m, k] and
  // W [n, k], the scales device fp32 scalars, and chooses cuBLASLt's first heuristic algorithm
  // for it; Error(Unsupported) when it offers none (FP8 needs an SM89+ GPU, 16-byte aligned
  // dimensions).
  void prepare(std::int64_t m, std::int64_t n, std::int64_t k, const float* a_scale,
               const float* w_scale);
  // The prepared product. Asynchronous.
  void gemm(cudaStream_t stream, const void* a, const void* w, void* c);
  // The call and the chosen algorithm, e.g. "cublasLtMatmul e4m3 x e4m3 -> bf16, scales tensor
  // x tensor, fast accumulation, algo 52 tile 23 stages 8 split-k 1".
  std::string description() const;

 private:
  bool fast_accumulation_;
  runtime::CublasLt cublaslt_;
  runtime::DeviceBuffer workspace_;
  std::optional<runtime::Fp8Matmul> matmul_;
  const float* a_scale_ = nullptr;
  const float* w_scale_ = nullptr;
};

}  // namespace qgemm::bench
