// The GPU side of `qgemm bench` and `qgemm tune`: one device with its Engine, stream and L2
// flusher (GpuBench), a case's weights (CaseWeights), one (case, M) problem with its
// activations, output buffer and sampled references (Problem), and the call of one backend on
// it (BackendCall), which bench and tune both put through measure() (gpu_timing.hpp).
//
// Inputs are drawn fresh and seeded: a case's weights from (seed, case), its activations from
// (seed, case, M); the seed is printed and recorded, so a run can be repeated exactly. Every
// backend of a (case, M) sees the same values: the unquantized weights become the scheme's
// packed weight (qgemm, qdq), bf16 (cublas-bf16) and per-tensor e4m3 (cuBLASLt FP8).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/inputs.hpp"
#include "bench/recipe.hpp"
#include "bench/results.hpp"
#include "gpu_bench/baselines.hpp"
#include "gpu_bench/gpu_timing.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::bench {

// Tensors of a run, for derive_seed.
enum : std::uint64_t { kWeightTensor = 1, kActivationTensor = 2, kPeakTensor = 3 };
// The weights' spread: typical of trained LLM linear layers (so scales are realistic).
inline constexpr double kWeightSigma = 0.02;

// 16-bit activations of `format` (no quantization).
ActivationQuant unquantized(const Format& format);
// The bytes of a packed weight's codes, scales and zeros.
std::int64_t packed_bytes(const PackedWeight& weight);
bool uses(const std::vector<Backend>& backends, Backend backend);

class GpuBench {
 public:
  explicit GpuBench(int device = 0);
  Engine& engine() { return *engine_; }
  cudaStream_t stream() const { return stream_->get(); }
  L2Flusher& flusher() { return *flusher_; }
  const MachineInfo& machine() const { return machine_; }
  CublasBf16Gemm& cublas_bf16();
  CublasLtFp8Gemm& cublaslt_fp8(bool fast_accumulation);

 private:
  MachineInfo machine_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<L2Flusher> flusher_;
  std::unique_ptr<CublasBf16Gemm> cublas_bf16_;
  std::unique_ptr<CublasLtFp8Gemm> fp8_fast_, fp8_exact_;
};

// The machine record of `device` (the CUDA runtime must be initialized on it).
MachineInfo read_machine_info(int device);

// Copy bandwidth, cuBLAS BF16 and cuBLASLt FP8 rates on this GPU, now (operands drawn from
// `seed`). A peak that cannot be measured is left empty, with the reason in `problems`.
PeakRates measure_peaks(GpuBench& gpu, std::uint64_t seed);

// The weights of one case, drawn from (seed, case index) and quantized on the host; on the
// device per backend, made when first asked for.
class CaseWeights {
 public:
  CaseWeights(const RecipeCase& recipe_case, std::size_t case_index, std::uint64_t seed,
              const std::vector<Backend>& backends);
  std::size_t case_index() const { return case_index_; }
  const RecipeCase& recipe_case() const { return *case_; }
  const PackedWeight& packed() const { return packed_; }
  // The Engine's prepared weight, with the scheme's activation part. Its Error (e.g.
  // Unsupported) is thrown again at every call.
  const QuantWeight& prepared(Engine& engine);
  const std::vector<std::uint8_t>& bf16_codes() const { return bf16_codes_; }
  const runtime::DeviceBuffer& bf16_device();
  const PackedWeight& fp8() const { return fp8_; }
  const runtime::DeviceBuffer& fp8_device();
  const float* fp8_scale_device();

 private:
  const RecipeCase* case_;
  std::size_t case_index_;
  PackedWeight packed_;
  std::vector<std::uint8_t> bf16_codes_;  // empty unless cublas-bf16 runs
  PackedWeight fp8_;                      // empty unless a cuBLASLt FP8 backend runs
  struct Prepared {
    std::optional<QuantWeight> weight;
    std::optional<Error> error;
  };
  Prepared prepared_;
  runtime::DeviceBuffer bf16_device_, fp8_device_, fp8_scale_device_;
};

// What measure() needs to run and check one backend, and what the result records about it.
struct BackendCall {
  GpuCall call;
  void* output = nullptr;
  std::int64_t output_bytes = 0;
  std::function<double()> error_now;  // reads the sampled output, returns its error
  double tolerance = 0;
  std::string kernel;
  std::int64_t weight_bytes = 0;
  std::optional<std::int64_t> weight_device_bytes;
  std::int64_t activation_bytes = 0;
  // qdq: the dequantization alone (the whole weight into 16 bits), timed apart; else empty.
  GpuCall dequantize;
};

// One case at one M: activations for every backend, an output buffer, the sample of the
// output that is checked and the references on it (computed when first needed).
class Problem {
 public:
  Problem(CaseWeights& weights, std::int64_t m, std::uint64_t seed,
          const std::vector<Backend>& backends);
  std::int64_t m() const { return m_; }
  std::uint64_t activation_seed() const { return activation_seed_; }
  const OutputSample& sample() const { return sample_; }
  // The rows the FP8 baselines multiply: M rounded up to a multiple of 16.
  std::int64_t fp8_rows() const { return (m_ + 15) / 16 * 16; }
  // `options` applies to qgemm (the tuner forces candidates through it); qdq forces the "qdq"
  // candidate. Error(Unsupported) when the backend cannot run this problem.
  BackendCall call(Backend backend, GpuBench& gpu, const GemmOptions& options = {});
  // Computes the backend's reference now (else its first check does).
  void prepare_reference(Backend backend);

 private:
  const std::vector<double>& qgemm_reference();
  const PackedActivation& codes();  // the scheme's host quantization of the input
  const std::vector<double>& bf16_reference();
  const std::vector<double>& fp8_reference();
  std::function<double()> error_function(const Format& output,
                                         std::function<const std::vector<double>&()> expected);

  CaseWeights& weights_;
  const RecipeCase& case_;
  std::int64_t m_;
  std::uint64_t activation_seed_;
  PackedActivation input_;  // what the Engine is given (bf16 / fp16 codes)
  PackedActivation bf16_;   // the baselines' bf16 activations (empty unless needed)
  PackedActivation fp8_;    // per-tensor e4m3, M rows (empty unless needed)
  PackedActivation codes_;  // qgemm-codes: the scheme's quantization of input_ (host)
  runtime::DeviceBuffer input_device_, bf16_device_, fp8_device_, fp8_scale_device_, output_;
  runtime::DeviceBuffer dequantized_;
  runtime::DeviceBuffer codes_device_, code_scales_device_;  // qgemm-codes  // qdq's 16-bit weight, for its dequantization timed apart
  OutputSample sample_;
  std::optional<std::vector<double>> qgemm_expected_, bf16_expected_, fp8_expected_;
};

// The message of an Error without its "<code name>: " prefix (the status says it already).
std::string error_message(const Error& error);

}  // namespace qgemm::bench
