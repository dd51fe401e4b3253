// qgemm_dense_bench: times the dense GEMM (the heuristic's choice and the candidates) against
// cuBLAS BF16 on the shapes, L2 flushed before every timed run, median of the repeats;
// prints one table row per case.
// (The full bake-off tool is `qgemm bench`; this is the kernel-development bench.)
//
//   build/bench/qgemm_dense_bench [--quick | --a8 | --decode | --wgmma | --wgmma-quick | --fp8]
//                                 [--case SCHEME:M:N:K] [--config NAME]
// --case runs that one case (in the mode's configs); --config runs only that config (its launches
// then are one warm-up and the timed repeats, so `ncu --launch-skip 1 --launch-count 1` profiles
// it).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check_cuda.hpp"
#include "gpu_bench/l2_flusher.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"

namespace {

struct Case {
  std::string scheme;
  long long m, n, k;
};

// Median of `repeats` timed runs of `run`, each after an L2 flush.
template <typename Run>
double median_us(Run&& run, qgemm::bench::L2Flusher& flusher, int repeats) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  run();  // warm-up (JIT, handles)
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    flusher.flush(nullptr);
    CHECK_CUDA(cudaEventRecord(start));
    run();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> out(count);
  for (auto& v : out)
    v = static_cast<std::uint16_t>(qgemm::encode(qgemm::formats::bf16, normal(rng)));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  // --a8: int8 activations, the 8-bit mma configs against the 16-bit operand's.
  const bool a8 = argc > 1 && std::strcmp(argv[1], "--a8") == 0;
  // --decode: the M <= 16 cases only, every decode config (no dequant + cuBLAS).
  const bool decode = argc > 1 && std::strcmp(argv[1], "--decode") == 0;
  // --wgmma: the SM90 issue's W4A16 rows, every wgmma config that fits M against the choice.
  // --wgmma-quick: the rows where split-K, the four-consumer decode and the transform warps
  // decide (M 1 on both weights, M 64 and 256 on 28672×8192, M 1024 and 4096 on 8192²).
  const bool wgmma_quick = argc > 1 && std::strcmp(argv[1], "--wgmma-quick") == 0;
  // --fp8: issue #16's rows (w4a8-fp8, w8a8-fp8, fp8-block; w8a8-int8 and int4 × int8), every
  // 8-bit wgmma config of the activation's codes that fits M (held back until timed: forced
  // here) against the choice, dequantize + cuBLAS, and cuBLASLt FP8 (e4m3) or the 8-bit
  // mma.sync tiles (int8) where they serve; bf16 A quantized in the same call.
  const bool fp8 = argc > 1 && std::strcmp(argv[1], "--fp8") == 0;
  const bool wgmma = wgmma_quick || (argc > 1 && std::strcmp(argv[1], "--wgmma") == 0);
  // Every weight keeps every layout, so that each config below can be forced (the selector's
  // choice is the same: a kept layout only drops what no M would pick).
  setenv("QGEMM_WGMMA", "1", 1);
  std::vector<Case> cases = {
      {"w4a16", 1, 28672, 8192},
      {"w4a16", 1, 8192, 28672},
      {"w4a16", 1, 8192, 8192},
      {"w4a16", 16, 28672, 8192},
      {"w3a16", 1, 28672, 8192},
      {"w3a16", 16, 28672, 8192},
      {"w8a16", 1, 28672, 8192},
      {"w8a16", 16, 28672, 8192},
      {"mxfp4-a16", 1, 28672, 8192},
      {"w4a16", 64, 8192, 8192},
      {"w4a16", 256, 8192, 8192},
      {"w4a16", 512, 8192, 8192},
      {"w4a16", 4096, 8192, 8192},
      {"w4a16", 4096, 28672, 8192},
      // Quantized activations (bf16 A quantized on the GPU in the same call).
      {"w4a8-fp8", 1, 28672, 8192},
      {"w4a8-fp8", 16, 28672, 8192},
      {"nvfp4", 1, 28672, 8192},
      {"w8a8-fp8", 4096, 8192, 8192},
  };
  if (quick) cases.resize(3);
  if (wgmma) {
    cases.clear();
    for (long long m : {1, 16, 64, 256, 1024, 4096}) {
      cases.push_back({"w4a16", m, 8192, 8192});
      cases.push_back({"w4a16", m, 28672, 8192});
    }
    for (long long m : {1, 16, 4096}) cases.push_back({"w4a16", m, 8192, 28672});
    for (const char* s : {"w3a16", "w8a16", "mxfp4-a16"})
      for (long long m : {1, 4096}) cases.push_back({s, m, 28672, 8192});
    for (long long m : {1, 4096}) cases.push_back({"mxfp4-a16", m, 8192, 8192});
    if (wgmma_quick)
      cases = {{"w4a16", 1, 28672, 8192},
               {"w4a16", 1, 8192, 8192},
               {"w4a16", 64, 28672, 8192},
               {"w4a16", 256, 28672, 8192},
               {"w4a16", 1024, 8192, 8192},
               {"w4a16", 4096, 8192, 8192}};
  }
  if (fp8) {
    cases.clear();
    for (long long m : {1, 16, 256, 1024, 4096}) cases.push_back({"w4a8-fp8", m, 8192, 8192});
    for (long long m : {1, 16, 4096}) cases.push_back({"w4a8-fp8", m, 28672, 8192});
    for (long long m : {1, 256, 4096}) cases.push_back({"w8a8-fp8", m, 8192, 8192});
    for (long long m : {1, 256, 4096}) cases.push_back({"fp8-block", m, 7168, 18432});
    for (long long m : {1, 256, 1024, 4096}) cases.push_back({"w8a8-int8", m, 8192, 8192});
    for (long long m : {256, 4096})
      cases.push_back({"w=int4:g128:s=bf16;a=int8:tok;o=bf16", m, 8192, 8192});
  }
  if (decode)
    cases.erase(std::remove_if(cases.begin(), cases.end(), [](const Case& c) { return c.m > 16; }),
                cases.end());
  if (a8)
    cases = {{"w8a8-int8", 32, 8192, 8192},
             {"w8a8-int8", 64, 8192, 8192},
             {"w8a8-int8", 128, 8192, 8192},
             {"w8a8-int8", 256, 8192, 8192},
             {"w8a8-int8", 1024, 8192, 8192},
             {"w=int4:g128:s=bf16;a=int8:t;o=bf16", 64, 8192, 8192},
             {"w=int4:g128:s=bf16;a=int8:t;o=bf16", 128, 8192, 8192}};
  std::string only_config;
  bool config_given = false;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--case") == 0) {
      Case one;
      char scheme[128] = {};
      if (std::sscanf(argv[i + 1], "%127[^:]:%lld:%lld:%lld", scheme, &one.m, &one.n, &one.k) != 4) {
        std::fprintf(stderr, "--case %s: expected SCHEME:M:N:K\n", argv[i + 1]);
        return 2;
      }
      one.scheme = scheme;
      cases = {one};
    } else if (std::strcmp(argv[i], "--config") == 0) {
      only_config = argv[i + 1];  // "" (the selector's choice) is "auto"
      if (only_config == "auto") only_config.clear();
      config_given = true;
    }
  }
  std::mt19937 rng(std::random_device{}());
  qgemm::Engine engine(0);
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return 1;
  // The L2 flush of `qgemm bench`: a read of twice the L2, not a memset (whose dirty lines the
  // timed call wrote back: this bench did so until the third session of 2026-12-03 and read
  // ~7 µs slower on decode shapes; bench/NOTES.md).
  int l2_bytes = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  qgemm::bench::L2Flusher flusher(l2_bytes);

  std::printf("%-10s %6s %6s %6s | %9s %8s %8s | %9s %8s | %6s | %s\n", "scheme", "M", "N", "K",
              "qgemm_us", "TB/s", "TFLOPS", "cublas_us", "TFLOPS", "ratio", "kernel");
  for (const Case& c : cases) {
    const qgemm::Scheme scheme = qgemm::parse_scheme(c.scheme);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> w(static_cast<std::size_t>(c.n * c.k));
    for (float& x : w) x = normal(rng);
    const qgemm::PackedWeight packed = qgemm::quantize_weight(scheme.weight, w.data(), c.n, c.k);
    const qgemm::QuantWeight weight = engine.prepare_weight(packed, scheme.activation);
    // Bytes a decode call must read at least: the canonical codes and scales (and zeros).
    const double weight_bytes =
        static_cast<double>(packed.codes.size() + packed.scales.size() + packed.zeros.size());

    auto a_host = random_bf16(static_cast<std::size_t>(c.m * c.k), rng);
    auto w_bf16 = random_bf16(static_cast<std::size_t>(c.n * c.k), rng);
    void *a = nullptr, *c_out = nullptr, *w_dense = nullptr;
    CHECK_CUDA(cudaMalloc(&a, a_host.size() * 2));
    CHECK_CUDA(cudaMalloc(&c_out, static_cast<std::size_t>(c.m * c.n) * 2));
    CHECK_CUDA(cudaMalloc(&w_dense, w_bf16.size() * 2));
    CHECK_CUDA(cudaMemcpy(a, a_host.data(), a_host.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(w_dense, w_bf16.data(), w_bf16.size() * 2, cudaMemcpyHostToDevice));

    const int repeats = c.m >= 1024 ? 10 : 30;
    const float alpha = 1.0f, beta = 0.0f;
    const double cublas_us = median_us(
        [&] {
          cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(c.n),
                       static_cast<int>(c.m), static_cast<int>(c.k), &alpha, w_dense, CUDA_R_16BF,
                       static_cast<int>(c.k), a, CUDA_R_16BF, static_cast<int>(c.k), &beta, c_out,
                       CUDA_R_16BF, static_cast<int>(c.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        },
        flusher, repeats);
    // The heuristic's choice, then the candidates of src/dispatch: (decode) occupancy,
    // (prefill) tile shapes, and dequant + cuBLAS everywhere (the path never to be slower than).
    std::vector<std::string> configs = {""};
    if (c.m <= 16 && !quick)
      configs.insert(configs.end(),
                     {"decode", "decode-k64", "decode-s4", "decode-w8", "decode-tiled"});
    if (c.m > 128 && !quick)
      configs.insert(configs.end(), {"prefill", "prefill-n256", "prefill-m256"});
    if (a8) configs = {"", "medium-a8", "medium-a8-m32", "prefill-a8", "medium"};
    if (wgmma) {
      configs = {""};
      for (int tokens : {8, 16, 32, 64, 128, 256})
        if (tokens <= 2 * std::max<long long>(c.m, 8) && (c.m < 256 || tokens >= 128)) {
          configs.push_back("wgmma-" + std::to_string(tokens));
          if (tokens >= 64) configs.push_back("wgmma-" + std::to_string(tokens) + "-tx");
        }
      if (c.m <= 16) configs.insert(configs.end(), {"wgmma-8-k256", "wgmma-8-c4"});
      if (c.m == 16) configs.push_back("wgmma-16-k256");
      configs.push_back(c.m <= 16 ? "decode" : c.m <= 256 ? "medium" : "prefill");
    }
    if (fp8) {
      const bool int8 = c.scheme.find("int8") != std::string::npos;
      const std::string tiles = int8 ? "wgmma-int8-" : "wgmma-fp8-";
      configs = {""};
      for (int tokens : {8, 16, 32, 64, 128})
        if (tokens <= 2 * std::max<long long>(c.m, 8) && (c.m < 256 || tokens >= 64))
          configs.push_back(tiles + std::to_string(tokens));
      if (c.m <= 16) configs.insert(configs.end(), {tiles + "8-k256", tiles + "16-k256"});
      configs.push_back("qdq");
      if (int8)
        configs.push_back(c.m <= 256 ? "medium-a8" : "prefill-a8");
      else
        configs.push_back("cublaslt-fp8");
    }
    if (!quick && !decode && !wgmma && !fp8) configs.push_back("qdq");
    if (config_given) configs = {only_config};
    for (const std::string& config : configs) {
      qgemm::GemmOptions options;
      options.candidate = config;
      qgemm::GemmProblem problem =
          qgemm::gemm_problem(weight, c.m, qgemm::formats::bf16, qgemm::formats::bf16);
      problem.candidate = config;
      std::string kernel;
      try {  // a forced candidate may not serve this weight (shared memory, groups)
        kernel = engine.warm_up(problem, weight).choice_for(c.m).kernel;
      } catch (const qgemm::Error& e) {
        std::printf("%-10s %6lld %6lld %6lld | %s: %s\n", c.scheme.c_str(), c.m, c.n, c.k,
                    config.c_str(), e.what());
        continue;
      }
      const double qgemm_us = median_us(
          [&] {
            engine.gemm({a, c.m, c.k, c.k, qgemm::formats::bf16}, weight,
                        {c_out, c.m, c.n, c.n, qgemm::formats::bf16}, nullptr, options);
          },
          flusher, repeats);
      const double flops = 2.0 * c.m * c.n * c.k;
      std::printf(
          "%-10s %6lld %6lld %6lld | %9.1f %8.2f %8.1f | %9.1f %8.1f | %6.2f | %s\n",
          c.scheme.c_str(), c.m, c.n, c.k, qgemm_us, weight_bytes / qgemm_us / 1e6,
          flops / qgemm_us / 1e6, cublas_us, flops / cublas_us / 1e6, cublas_us / qgemm_us,
          kernel.c_str());
      std::fflush(stdout);
    }
    cudaFree(a);
    cudaFree(c_out);
    cudaFree(w_dense);
  }
  cublasDestroy(cublas);
  return 0;
}
