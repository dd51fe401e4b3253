// cuBLASLt FP8 on the stored codes: the "never slower" alternative for 8-bit float weights
// (issue #14). The selector's candidate "cuBLASLt FP8" is this component; it computes
//
//   C[m][n] = alpha · Σ_k (A_q[m][k] · scale_a(m, k)) · (W_q[n][k] · scale_w(n, k))
//
// with alpha the weight's global scale, fp32 accumulation (fast, or promoted to fp32 at
// intervals), C rounded once to bf16 / fp16 / fp32.
//
// Operands, as qgemm stores them, are cuBLASLt's "TN" form as they are (nothing is copied):
//
//   qgemm                              cuBLASLt (column-major)
//   W_q [n][k] bytes, row-major, ld k  A: k × n, ld k, op T
//   A_q [m][k] bytes, row-major, ld k  B: k × m, ld k, op N
//   C   [m][ldc] row-major             C = D: n × m, ld ldc         (beta = 0)
//
// Scale modes (Fp8ScaleMode) and where the fp32 scale of (row r, K-block b) lives; r is a token
// for A, an output channel for W; K-blocks are 128 wide for the block modes (the last may be
// partial), the whole row otherwise:
//
//   mode          cuBLASLt                 scales[...]                     floats
//   Tensor        SCALAR_32F               [0]                              1
//   OuterVector   OUTER_VEC_32F            [r]                              rows
//   Block1x128    VEC128_32F               [b · rows + r]                   ceil(k/128) · rows
//   Block128x128  BLK128x128_32F (W only)  [(r / 128) · L4 + b]             ceil(rows/128) · L4
//                                          L4 = round_up(ceil(k/128), 4)
//
//   Block1x128 is "outer-dim-major": the scales of one K-block for consecutive rows are adjacent
//
//              b = 0        b = 1        b = 2
//     r = 0    s[0]         s[rows]      s[2·rows]
//     r = 1    s[1]         s[rows + 1]  s[2·rows + 1]
//     ...
//
//   Block128x128 is qgemm's canonical block grid [ceil(n/128)][ceil(k/128)] row-major with its
//   rows padded to a multiple of 4 blocks (pad value 0, never read): e.g. K = 2816 has 22
//   blocks per row, stored 24 apart.
//
// Sources: the cuBLAS documentation ("Scaling factors layouts"), PyTorch's _scaled_mm checks
// and tests for the same modes (1x128 scales stride [1, M]; 128x128 scales stride [1, L4]). The
// layouts are confirmed on the H200 (tests/gpu/test_cublaslt_fp8.cpp, every mode pair against
// the reference, and the wrong layouts failing, 2026-12-03).
//
// Scale-mode pairs cuBLASLt serves (A × W): Tensor × Tensor, OuterVector × OuterVector,
// Block1x128 × Block128x128, Block1x128 × Block1x128. A scheme whose natural modes are another
// pair is served by expanding the coarser side (fp8_scale_modes: a tensor scale becomes a
// vector, a per-row or per-tensor scale becomes 1x128 blocks); the other pairs are refused.
//
// What cuBLASLt FP8 requires (cublasLtMatmul's FP8 section and Tensor Core usage rules;
// fp8_matmul_unsupported_reason checks each, without a GPU):
//   - A, B row strides (k bytes) 16-byte aligned: k % 16 == 0
//   - cuBLASLt's m (our n) a multiple of 16 (PyTorch's _scaled_mm demands it for FP8; early
//     cuBLAS 12 refused other m); our m (tokens) any ≥ 1 (the torch run had M = 1)
//   - C's rows 16-byte aligned: ldc · bytes(C) % 16 == 0, ldc ≥ n
//   - every pointer aligned to the shape's `alignment` (≥ 16 bytes)
//   - e4m3 × e4m3, e4m3 × e5m2, e5m2 × e4m3 (not e5m2 × e5m2); block modes e4m3 only
//   - block modes: fp32-promoted accumulation only (no fast accumulation); k need not be a
//     multiple of 128 (ceil(k/128) scales); m ≥ 16 (H200, CUDA 13.0: no algorithm at m = 1, 7)
//   - compute capability 8.9+ for FP8; the vector and block modes on 9.0 only (cuBLAS 13.1)
// cuBLASLt's heuristic has the last word: prepare() asks it and reports Error(Unsupported) when
// it offers no algorithm.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../../kernels/util/utility_args.cuh"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::runtime {

enum class Fp8ScaleMode { Tensor, OuterVector, Block1x128, Block128x128 };
// "tensor", "outer-vector", "1x128", "128x128".
const char* fp8_scale_mode_name(Fp8ScaleMode mode);

// The K (and, for Block128x128, row) extent of one block-mode scale.
inline constexpr std::int64_t kFp8ScaleBlock = 128;

// The workspace the caller reserves for run(): the most cuBLASLt's heuristic may ask for (its
// split-K and stream-K kernels on Hopper). Fp8Matmul::workspace_bytes() is the exact need.
inline constexpr std::size_t kFp8MatmulWorkspaceBytes = std::size_t{32} << 20;

struct Fp8MatmulShape {
  std::int64_t m = 0, n = 0, k = 0;
  Format a_format = formats::e4m3;  // activation codes: e4m3 or e5m2
  Format w_format = formats::e4m3;  // weight codes
  Fp8ScaleMode a_scale = Fp8ScaleMode::Tensor;
  Fp8ScaleMode w_scale = Fp8ScaleMode::Tensor;
  Format c_format = formats::bf16;  // bf16, fp16 or fp32
  std::int64_t ldc = 0;             // C's row stride in elements; 0: n
  bool fast_accumulation = false;   // tensor / vector modes only
  int alignment = 16;               // bytes every pointer given to run() is aligned to
  int compute_capability = 0;       // major · 10 + minor of the GPU; 0: the device rules unchecked
};

// Why cuBLASLt FP8 cannot serve `shape` (the argument, its value and the rule), or "" when
// the rules above allow it. Needs no GPU: the selector's filter and `qgemm explain` use it.
std::string fp8_matmul_unsupported_reason(const Fp8MatmulShape& shape);

// The scale modes that serve `scheme` through cuBLASLt (A's mode, W's mode):
//
//   activation          weight              modes (A × W)
//   static (t)          tensor (t)          Tensor × Tensor
//   static, token       tensor, channel     OuterVector × OuterVector   (a tensor scale is
//                                                                        repeated per row)
//   g128, static, token b128x128            Block1x128 × Block128x128   (a per-row scale is
//   g128, static, token g128, channel, t    Block1x128 × Block1x128      repeated per K-block)
//
// Codes e4m3 / e5m2 on both sides, fp32-representable scales (any qgemm scale format), no
// zero points. nullopt otherwise, with the reason in `why_not`.
struct Fp8ScaleModes {
  Fp8ScaleMode activation, weight;
};
std::optional<Fp8ScaleModes> fp8_scale_modes(const Scheme& scheme, std::string* why_not = nullptr);

// Where the scale of (row r, K-block b) of an operand of `rows` × k lives in `mode`'s layout
// (the table above): scales[(r / rows_per_scale) · row_stride + b · block_stride], for b in
// [0, blocks), each scale covering rows_per_scale rows × cols_per_scale values of K; `count`
// floats in all, padding included.
struct Fp8ScaleLayout {
  std::int64_t rows_per_scale = 1, cols_per_scale = 1;
  std::int64_t row_stride = 0, block_stride = 0;
  std::int64_t blocks = 1;  // K-blocks with a scale of their own: ceil(k / 128) or 1
  std::int64_t count = 1;
};
Fp8ScaleLayout fp8_scale_layout(Fp8ScaleMode mode, std::int64_t rows, std::int64_t k);

// The distance between the Block1x128 scales of consecutive K-blocks, for `rows` rows: `rows`
// (PyTorch's stride [1, M]). The one place to change should the GPU test show that cuBLASLt
// pads it (e.g. to a multiple of 4: the test then fails at M = 1 and 7 only).
std::int64_t fp8_block1x128_stride(std::int64_t rows);

// The weight's scales (canonical grid, any fp32-representable scale format) as `mode` wants
// them, tensor / channel scales repeated where the mode is finer: done once, on the host, when
// the weight is prepared. Error(InvalidArgument) when `mode` is coarser than the weight's grid
// (e.g. Block128x128 for per-channel scales) or the weight has zero points.
std::vector<float> fp8_weight_scales(const PackedWeight& weight, Fp8ScaleMode mode);
// The same for activations quantized on the host (canonical PackedActivation).
std::vector<float> fp8_activation_scales(const PackedActivation& activation, Fp8ScaleMode mode);

// quantize_activation's arguments (emit = codes) writing A's codes [m][k] (ld k: cuBLASLt's B as
// it is) and its scales in `mode`'s layout; the caller sets codes, scales (fp8_scale_layout(mode,
// m, k).count floats) and, where needs_tensor_absmax says so, tensor_absmax. Error
// (InvalidArgument) when `quant` cannot fill `mode` (e.g. g64 into Block1x128).
kernels::QuantizeActivationArgs fp8_quantize_activation_args(const ActivationQuant& quant,
                                                             Fp8ScaleMode mode, std::int64_t m,
                                                             std::int64_t k, CUdeviceptr input,
                                                             std::int64_t lda, double static_scale);

// One cuBLASLt handle (per engine / device). cuBLASLt uses the context current on the thread,
// which must be current when the handle is made (it allocates a little device memory).
class CublasLt {
 public:
  CublasLt();  // Error(CudaError) naming the status when the handle cannot be made
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  void* handle() const { return handle_; }
  // 256 bytes of device memory that stand in for scale pointers while prepare() asks the
  // heuristic (it refuses a null one and reads none); run() sets the real ones.
  const void* placeholder_scales() const { return placeholder_scales_.as<void>(); }
  // "13.1.0": the cuBLASLt this process runs against.
  static std::string version_text();

 private:
  void* handle_ = nullptr;
  DeviceBuffer placeholder_scales_;
};

// A prepared FP8 product of one shape: cuBLASLt's descriptors and the algorithm its heuristic
// chose. prepare() may allocate and takes milliseconds; run() allocates nothing, synchronizes
// nothing and builds no strings (graph-capturable). run() sets the scale pointers on the
// prepared descriptor: one Fp8Matmul is run by one thread at a time.
class Fp8Matmul {
 public:
  // Error(InvalidArgument) for a shape outside the rules (fp8_matmul_unsupported_reason, except
  // the device rules); Error(Unsupported) with the reason when the device rules or cuBLASLt's
  // heuristic refuse it.
  static Fp8Matmul prepare(const CublasLt& cublaslt, const Fp8MatmulShape& shape);
  ~Fp8Matmul();
  Fp8Matmul(Fp8Matmul&&) noexcept;
  Fp8Matmul& operator=(Fp8Matmul&&) noexcept;

  struct Operands {
    const void* a = nullptr;          // A_q [m][k]
    const float* a_scales = nullptr;  // shape.a_scale's layout for m × k
    const void* w = nullptr;          // W_q [n][k]
    const float* w_scales = nullptr;  // shape.w_scale's layout for n × k
    void* c = nullptr;                // C [m][ldc]
    float alpha = 1.0f;               // the weight's global scale
  };
  // Enqueues the product on `stream`. `workspace` holds at least workspace_bytes() (any
  // 256-byte aligned device memory; null when that is 0). Error(InvalidArgument) for a null or
  // misaligned pointer or a short workspace.
  void run(const Operands& operands, void* workspace, std::size_t workspace_bytes, CUstream stream);

  const Fp8MatmulShape& shape() const;
  std::size_t workspace_bytes() const;
  // e.g. "cublasLtMatmul e4m3 x e4m3 -> bf16, scales 1x128 x 128x128, fp32-promoted
  // accumulation, algo 66 tile 20 stages 9 split-k 1".
  const std::string& description() const;

 private:
  struct Plan;
  explicit Fp8Matmul(std::unique_ptr<Plan> plan);
  std::unique_ptr<Plan> plan_;
};

// Pre-quantized activations carry g128 scales in the canonical grid, row-major [rows][blocks]
// (include/qgemm/quant.hpp); cuBLASLt reads Block1x128 scales [b · stride + r] (the table above).
// One cublasLtMatrixTransform per call turns the first into the second (a transpose of
// rows · blocks floats: microseconds beside the product). Like Fp8Matmul, prepare() makes the
// descriptors once and run() only enqueues (graph-capturable).
class Block1x128ScaleTranspose {
 public:
  static Block1x128ScaleTranspose prepare(const CublasLt& cublaslt, std::int64_t rows,
                                          std::int64_t k);
  ~Block1x128ScaleTranspose();
  Block1x128ScaleTranspose(Block1x128ScaleTranspose&&) noexcept;
  Block1x128ScaleTranspose& operator=(Block1x128ScaleTranspose&&) noexcept;

  // canonical: fp32 [rows][ceil(k/128)]; out: fp8_scale_layout(Block1x128, rows, k).count floats.
  void run(const float* canonical, float* out, CUstream stream) const;

 private:
  struct Plan;
  explicit Block1x128ScaleTranspose(std::unique_ptr<Plan> plan);
  std::unique_ptr<Plan> plan_;
};

}  // namespace qgemm::runtime
