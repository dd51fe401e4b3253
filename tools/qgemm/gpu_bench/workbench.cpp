#include "gpu_bench/workbench.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "dispatch/tuned_config.hpp"
#include "host_info.hpp"
#include "jit/compiler.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

std::string version_text(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

bool uses_fp8(const std::vector<Backend>& backends) {
  return uses(backends, Backend::CublasLtFp8) || uses(backends, Backend::CublasLtFp8Exact);
}

// Median of a warm timing loop (the peaks run long enough that L2 does not matter).
double median_warm_us(const GpuCall& call, GpuBench& gpu) {
  call(gpu.stream());  // first call: handles, heuristics
  check_cuda(cudaStreamSynchronize(gpu.stream()), "cudaStreamSynchronize");
  return summarize(time_call(call, {TimingMode::Warm, 3, 10}, gpu.stream(), gpu.flusher()))
      .median_us;
}

}  // namespace

ActivationQuant unquantized(const Format& format) {
  ActivationQuant quant;
  quant.format = format;
  return quant;
}

std::int64_t packed_bytes(const PackedWeight& weight) {
  return static_cast<std::int64_t>(weight.codes.size() + weight.scales.size() +
                                   weight.zeros.size());
}

bool uses(const std::vector<Backend>& backends, Backend backend) {
  return std::find(backends.begin(), backends.end(), backend) != backends.end();
}

std::string error_message(const Error& error) {
  const std::string text = error.what();
  const std::string prefix = std::string(error_code_name(error.code())) + ": ";
  return text.rfind(prefix, 0) == 0 ? text.substr(prefix.size()) : text;
}

MachineInfo read_machine_info(int device) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  MachineInfo machine;
  machine.gpu = properties.name;
  machine.compute_capability = fmt::format("{}.{}", properties.major, properties.minor);
  machine.sm_count = properties.multiProcessorCount;
  machine.l2_bytes = properties.l2CacheSize;
  machine.memory_bytes = static_cast<std::int64_t>(properties.totalGlobalMem);
  machine.memory_bus_bits = properties.memoryBusWidth;
  int khz = 0;
  check_cuda(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute");
  machine.sm_clock_mhz = khz / 1000.0;
  check_cuda(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device),
             "cudaDeviceGetAttribute");
  machine.memory_clock_mhz = khz / 1000.0;
  int version = 0;
  check_cuda(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
  machine.cuda_runtime = version_text(version);
  check_cuda(cudaDriverGetVersion(&version), "cudaDriverGetVersion");
  machine.cuda_driver = version_text(version);
  machine.driver = dispatch::driver_release();
  machine.nvrtc = jit::nvrtc_version_text();
  machine.cublas = cublas_version_text();
  machine.qgemm = dispatch::qgemm_version();
  machine.host_cpu = cli::cpu_model();
  return machine;
}

GpuBench::GpuBench(int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaFree(nullptr), "cudaFree (runtime initialization)");
  machine_ = read_machine_info(device);
  // The Engine makes the same primary context current: runtime and driver calls share it.
  engine_ = std::make_unique<Engine>(device);
  stream_ = std::make_unique<Stream>();
  flusher_ = std::make_unique<L2Flusher>(machine_.l2_bytes);
}

CublasBf16Gemm& GpuBench::cublas_bf16() {
  if (!cublas_bf16_) cublas_bf16_ = std::make_unique<CublasBf16Gemm>();
  return *cublas_bf16_;
}

CublasLtFp8Gemm& GpuBench::cublaslt_fp8(bool fast_accumulation) {
  auto& slot = fast_accumulation ? fp8_fast_ : fp8_exact_;
  if (!slot) slot = std::make_unique<CublasLtFp8Gemm>(fast_accumulation);
  return *slot;
}

PeakRates measure_peaks(GpuBench& gpu, std::uint64_t seed) {
  PeakRates peaks;
  // Copies many times the L2, so that they stream from and to HBM.
  peaks.copy_bytes = std::max<std::int64_t>(std::int64_t{512} << 20, 16 * gpu.machine().l2_bytes);
  try {
    runtime::DeviceBuffer from(static_cast<std::size_t>(peaks.copy_bytes));
    runtime::DeviceBuffer to(static_cast<std::size_t>(peaks.copy_bytes));
    from.fill_bytes(0x5A);
    const double us = median_warm_us(
        [&](cudaStream_t stream) {
          check_cuda(cudaMemcpyAsync(to.as<void>(), from.as<void>(), from.bytes(),
                                     cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpyAsync (copy peak)");
        },
        gpu);
    peaks.copy_gbps = 2.0 * static_cast<double>(peaks.copy_bytes) / us * 1e-3;  // read + write
  } catch (const Error& error) {
    peaks.problems.push_back("copy bandwidth: " + error_message(error));
  }

  // One random matrix serves as both operands: the rate does not depend on which values.
  peaks.gemm_size = 8192;
  const std::int64_t size = peaks.gemm_size;
  const double flops = 2.0 * static_cast<double>(size) * size * size;
  const std::vector<float> values = random_normal(size * size, derive_seed(seed, kPeakTensor), 1.0);
  runtime::DeviceBuffer output(static_cast<std::size_t>(size * size * 2));
  try {
    const PackedActivation bf16 =
        quantize_activation(unquantized(formats::bf16), values.data(), size, size);
    const runtime::DeviceBuffer operand = runtime::DeviceBuffer::from(bf16.codes);
    CublasBf16Gemm& blas = gpu.cublas_bf16();
    const double us = median_warm_us(
        [&](cudaStream_t stream) {
          blas.gemm(stream, size, size, size, operand.as<void>(), operand.as<void>(),
                    output.as<void>());
        },
        gpu);
    peaks.bf16_tflops = flops / us * 1e-6;
  } catch (const Error& error) {
    peaks.problems.push_back("cuBLAS BF16 rate: " + error_message(error));
  }
  try {
    const PackedActivation fp8 =
        quantize_activation(fp8_tensor_activation_quant(), values.data(), size, size);
    const runtime::DeviceBuffer operand = runtime::DeviceBuffer::from(fp8.codes);
    const runtime::DeviceBuffer scale = runtime::DeviceBuffer::from(fp8.scales);
    CublasLtFp8Gemm& blas = gpu.cublaslt_fp8(true);
    blas.prepare(size, size, size, scale.as<float>(), scale.as<float>());
    const double us = median_warm_us(
        [&](cudaStream_t stream) {
          blas.gemm(stream, operand.as<void>(), operand.as<void>(), output.as<void>());
        },
        gpu);
    peaks.fp8_tflops = flops / us * 1e-6;
  } catch (const Error& error) {
    peaks.problems.push_back("cuBLASLt FP8 rate: " + error_message(error));
  }
  return peaks;
}

CaseWeights::CaseWeights(const RecipeCase& recipe_case, std::size_t case_index, std::uint64_t seed,
                         const std::vector<Backend>& backends)
    : case_(&recipe_case), case_index_(case_index) {
  const std::int64_t n = recipe_case.n, k = recipe_case.k;
  const std::vector<float> values =
      random_normal(n * k, derive_seed(seed, kWeightTensor, case_index), kWeightSigma);
  packed_ = quantize_weight(recipe_case.scheme.weight, values.data(), n, k);
  if (uses(backends, Backend::CublasBf16))
    // Rounding to bf16 is what quantize_activation does for an unquantized format.
    bf16_codes_ = quantize_activation(unquantized(formats::bf16), values.data(), n, k).codes;
  if (uses_fp8(backends)) fp8_ = quantize_weight(fp8_tensor_weight_quant(), values.data(), n, k);
}

const QuantWeight& CaseWeights::prepared(Engine& engine) {
  if (prepared_.error) throw *prepared_.error;
  if (!prepared_.weight) {
    try {
      prepared_.weight = engine.prepare_weight(packed_, case_->scheme.activation);
    } catch (const Error& error) {
      prepared_.error = error;
      throw;
    }
  }
  return *prepared_.weight;
}

const runtime::DeviceBuffer& CaseWeights::bf16_device() {
  require(!bf16_codes_.empty(), "bench: bf16 weights were not made for this case");
  if (!bf16_device_.bytes()) bf16_device_ = runtime::DeviceBuffer::from(bf16_codes_);
  return bf16_device_;
}

const runtime::DeviceBuffer& CaseWeights::fp8_device() {
  require(!fp8_.codes.empty(), "bench: e4m3 weights were not made for this case");
  if (!fp8_device_.bytes()) fp8_device_ = runtime::DeviceBuffer::from(fp8_.codes);
  return fp8_device_;
}

const float* CaseWeights::fp8_scale_device() {
  require(fp8_.scales.size() == 4, "bench: the e4m3 weight needs one fp32 scale");
  if (!fp8_scale_device_.bytes()) fp8_scale_device_ = runtime::DeviceBuffer::from(fp8_.scales);
  return fp8_scale_device_.as<float>();
}

Problem::Problem(CaseWeights& weights, std::int64_t m, std::uint64_t seed,
                 const std::vector<Backend>& backends)
    : weights_(weights),
      case_(weights.recipe_case()),
      m_(m),
      activation_seed_(derive_seed(seed, kActivationTensor * 0x100000000ull + weights.case_index(),
                                   static_cast<std::uint64_t>(m))) {
  const std::int64_t k = case_.k, n = case_.n;
  const std::vector<float> values = random_normal(m * k, activation_seed_, 1.0);
  // The Engine gets the scheme's own 16-bit activations, or bf16 ones it quantizes itself.
  const Scheme& scheme = case_.scheme;
  input_ = quantize_activation(
      scheme.activation.is_quantized() ? unquantized(formats::bf16) : scheme.activation,
      values.data(), m, k);
  input_device_ = runtime::DeviceBuffer::from(input_.codes);
  if (uses(backends, Backend::CublasBf16) || uses_fp8(backends)) {
    bf16_ = input_.quant.format == formats::bf16
                ? input_
                : quantize_activation(unquantized(formats::bf16), values.data(), m, k);
    bf16_device_ = runtime::DeviceBuffer::from(bf16_.codes);
  }
  if (uses_fp8(backends)) {
    // The same bf16 activations an FP8 pipeline would quantize, per tensor.
    const std::vector<float> rounded = decode_to_float(bf16_.codes, formats::bf16);
    fp8_ = quantize_activation(fp8_tensor_activation_quant(), rounded.data(), m, k);
    // cuBLASLt's FP8 kernels need M in multiples of 16: the rows are padded, as serving
    // engines pad them, with copies of real rows (timed work is never on zeros).
    std::vector<std::uint8_t> padded = fp8_.codes;
    for (std::int64_t row = m; row < fp8_rows(); ++row)
      padded.insert(padded.end(), fp8_.codes.begin() + (row % m) * k,
                    fp8_.codes.begin() + (row % m + 1) * k);
    fp8_device_ = runtime::DeviceBuffer::from(padded);
    fp8_scale_device_ = runtime::DeviceBuffer::from(fp8_.scales);
  }
  // Room for an fp32 output, and for the FP8 baselines' padded bf16 one.
  output_ =
      runtime::DeviceBuffer(static_cast<std::size_t>(std::max(m * n * 4, fp8_rows() * n * 2)));
  sample_ = sample_output(m, n, scale_row_alignment(weights_.packed()));
}

const PackedActivation& Problem::codes() {
  if (codes_.codes.empty()) {
    // The scheme's quantization of the bf16 input, as the Engine's GPU quantizer computes it.
    const std::vector<float> rounded = decode_to_float(input_.codes, formats::bf16);
    codes_ = quantize_activation(case_.scheme.activation, rounded.data(), m_, case_.k);
  }
  return codes_;
}

const std::vector<double>& Problem::qgemm_reference() {
  if (!qgemm_expected_) {
    const Scheme& scheme = case_.scheme;
    if (scheme.activation.is_quantized()) {
      // What the Engine must compute: the scheme's quantization of the bf16 input it got.
      qgemm_expected_ = sampled_reference(scheme, codes(), weights_.packed(), sample_);
    } else {
      qgemm_expected_ = sampled_reference(scheme, input_, weights_.packed(), sample_);
    }
  }
  return *qgemm_expected_;
}

const std::vector<double>& Problem::bf16_reference() {
  if (!bf16_expected_)
    bf16_expected_ = sampled_bf16_product(bf16_.codes, weights_.bf16_codes(), case_.k, sample_);
  return *bf16_expected_;
}

const std::vector<double>& Problem::fp8_reference() {
  if (!fp8_expected_)
    fp8_expected_ = sampled_reference(fp8_baseline_scheme(), fp8_, weights_.fp8(), sample_);
  return *fp8_expected_;
}

void Problem::prepare_reference(Backend backend) {
  switch (backend) {
    case Backend::Qgemm:
    case Backend::QgemmCodes:
    case Backend::Qdq: qgemm_reference(); return;
    case Backend::CublasBf16: bf16_reference(); return;
    case Backend::CublasLtFp8:
    case Backend::CublasLtFp8Exact: fp8_reference(); return;
  }
}

std::function<double()> Problem::error_function(
    const Format& output, std::function<const std::vector<double>&()> expected) {
  return [this, output, expected] {
    const std::vector<double> actual =
        read_sampled_output(output_.as<void>(), output, case_.n, sample_);
    return relative_frobenius_error(actual, expected());
  };
}

BackendCall Problem::call(Backend backend, GpuBench& gpu, const GemmOptions& options) {
  const std::int64_t m = m_, n = case_.n, k = case_.k;
  BackendCall out;
  out.output = output_.as<void>();
  out.tolerance = error_tolerance(backend);
  switch (backend) {
    case Backend::Qgemm:
    case Backend::Qdq: {
      // qdq: the Engine's dequantize + cuBLAS candidate on the same call (activations quantized
      // as the scheme says): what computing the scheme without a fused kernel costs.
      const bool qdq = backend == Backend::Qdq;
      Engine& engine = gpu.engine();
      const QuantWeight& weight = weights_.prepared(engine);
      GemmOptions chosen = options;
      if (qdq) chosen.candidate = "qdq";
      const Format input = input_.quant.format, output = case_.scheme.output;
      GemmProblem call_problem = gemm_problem(weight, m, input, output);
      call_problem.candidate = chosen.candidate;
      out.kernel = engine.plan(call_problem, weight, gpu.stream()).choice_for(m).kernel;
      void* a = input_device_.as<void>();
      void* c = output_.as<void>();
      out.call = [&engine, &weight, a, c, m, n, k, input, output, chosen](cudaStream_t stream) {
        engine.gemm({a, m, k, k, input}, weight, {c, m, n, n, output}, stream, chosen);
      };
      out.output_bytes = m * n * output.storage_bytes();
      out.error_now = error_function(
          output, [this]() -> const std::vector<double>& { return qgemm_reference(); });
      out.weight_bytes = packed_bytes(weights_.packed());
      out.weight_device_bytes = static_cast<std::int64_t>(weight.device_bytes());
      out.activation_bytes = m * k * input.storage_bytes();
      if (qdq && k % 8 == 0) {
        const Format wide = input;  // bf16 or fp16, as the GEMM's operand
        if (dequantized_.bytes() < static_cast<std::size_t>(n * k * 2))
          dequantized_ = runtime::DeviceBuffer(static_cast<std::size_t>(n * k * 2));
        void* w16 = dequantized_.as<void>();
        out.dequantize = [&engine, &weight, w16, n, k, wide](cudaStream_t stream) {
          engine.dequantize(weight, {w16, n, k, k, wide}, stream);
        };
      }
      return out;
    }
    case Backend::QgemmCodes: {
      // The Engine given the host quantizer's codes and scales, as a fused norm + quantize
      // kernel would hand them over (and as the FP8 baselines get theirs).
      const ActivationQuant& quant = case_.scheme.activation;
      if (!quant.is_quantized())
        throw Error(ErrorCode::Unsupported,
                    fmt::format("{} activations are not quantized: qgemm takes them as they are",
                                quant.format.name()));
      Engine& engine = gpu.engine();
      const QuantWeight& weight = weights_.prepared(engine);
      const PackedActivation& q = codes();
      if (!codes_device_.bytes()) {
        codes_device_ = runtime::DeviceBuffer::from(q.codes);
        code_scales_device_ = runtime::DeviceBuffer::from(q.scales);
      }
      const DeviceActivation a{quant, codes_device_.as<void>(), code_scales_device_.as<void>(), m,
                               k, q.tensor_scale};
      const Format output = case_.scheme.output;
      GemmProblem call_problem = gemm_problem(weight, m, quant.format, output);
      call_problem.scheme.activation = quant;
      call_problem.prequantized = true;
      call_problem.candidate = options.candidate;
      out.kernel = engine.plan(call_problem, weight, gpu.stream()).choice_for(m).kernel;
      void* c = output_.as<void>();
      const GemmOptions chosen = options;
      out.call = [&engine, &weight, a, c, m, n, output, chosen](cudaStream_t stream) {
        engine.gemm(a, weight, {c, m, n, n, output}, stream, chosen);
      };
      out.output_bytes = m * n * output.storage_bytes();
      out.error_now = error_function(
          output, [this]() -> const std::vector<double>& { return qgemm_reference(); });
      out.weight_bytes = packed_bytes(weights_.packed());
      out.weight_device_bytes = static_cast<std::int64_t>(weight.device_bytes());
      out.activation_bytes = static_cast<std::int64_t>(q.codes.size() + q.scales.size());
      return out;
    }
    case Backend::CublasBf16: {
      CublasBf16Gemm& blas = gpu.cublas_bf16();
      const void* a = bf16_device_.as<void>();
      const void* w = weights_.bf16_device().as<void>();
      void* c = output_.as<void>();
      out.kernel = CublasBf16Gemm::description();
      out.call = [&blas, a, w, c, m, n, k](cudaStream_t stream) {
        blas.gemm(stream, m, n, k, a, w, c);
      };
      out.output_bytes = m * n * 2;
      out.error_now = error_function(
          formats::bf16, [this]() -> const std::vector<double>& { return bf16_reference(); });
      out.weight_bytes = 2 * n * k;
      out.weight_device_bytes = out.weight_bytes;
      out.activation_bytes = 2 * m * k;
      return out;
    }
    case Backend::CublasLtFp8:
    case Backend::CublasLtFp8Exact: {
      CublasLtFp8Gemm& blas = gpu.cublaslt_fp8(backend == Backend::CublasLtFp8);
      blas.prepare(fp8_rows(), n, k, fp8_scale_device_.as<float>(), weights_.fp8_scale_device());
      const void* a = fp8_device_.as<void>();
      const void* w = weights_.fp8_device().as<void>();
      void* c = output_.as<void>();
      out.kernel = blas.description();
      out.call = [&blas, a, w, c](cudaStream_t stream) { blas.gemm(stream, a, w, c); };
      out.output_bytes = fp8_rows() * n * 2;
      out.error_now = error_function(
          formats::bf16, [this]() -> const std::vector<double>& { return fp8_reference(); });
      out.weight_bytes = n * k + 4;  // codes and the fp32 tensor scale
      out.weight_device_bytes = out.weight_bytes;
      out.activation_bytes = fp8_rows() * k;
      return out;
    }
  }
  throw Error(ErrorCode::Internal, "backend out of range");
}

}  // namespace qgemm::bench
