// Where the streamed decode kernel (kernels/gemm/sm80_decode.cuh) loses time against the read
// ceiling (bench/read_ceiling.cu): the w4a16 g128 M = 1 kernel, timed over configs and K splits.
// The production kernel carries no probe switches: to time a variant that leaves one part out
// (the dequantization, the mma, a copy, the epilogue: bench/NOTES.md, 2026-12-03 sessions), copy
// the kernel next to this file, edit the copy, and include it instead.
// Timing only: the outputs are not checked (the GPU tests check the kernel).
// Built and run by scripts/decode_probe.sh:
//   nvcc -O3 -arch=sm_90a -std=c++17 --expt-relaxed-constexpr -Ikernels bench/decode_probe.cu
#include <cuda_runtime.h>

#include <cstdio>

#include "gemm/sm80_decode.cuh"
#include "gpu_timer.cuh"

#ifndef QGEMM_PROBE_NAME
#define QGEMM_PROBE_NAME "full"
#endif

namespace {

using namespace qgemm::kernels;

constexpr unsigned long long kInt4 = FormatCode{kIntegerFormat, true, 4, 0, 0, 0, 0, -8, 7}.pack();

template <int kStageBlocks, int kStages, int kMinBlocks>
struct Probe {
  using Gemm = DecodeGemm<1, 4, kStageBlocks, kStages, kInt4, kZeroConstant, 128, true, kOutBf16,
                          true, kDequantInt16>;
  static constexpr int kShared = Gemm::Shape::kSharedBytes;
  static constexpr auto kernel =
      dense_decode_sm80<1, 4, kStageBlocks, kStages, kInt4, kZeroConstant, 128, 0, kOutBf16, true,
                        kDequantInt16, kMinBlocks, false, 0, 0, 128, kShared>;
};

struct Buffers {
  unsigned* codes;
  float* scales;
  unsigned short* a;
  unsigned short* c;
  float* workspace;
  unsigned* counters;
};

template <typename P>
void time_config(const char* name, const Buffers& buffers, int n, int k, GpuTimer& timer,
                 const char* flush_buffer, unsigned* sink, int sms) {
  cudaFuncSetAttribute(P::kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P::kShared);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, P::kernel, 128, P::kShared);
  DenseGemmParams p{};
  p.a = buffers.a, p.b = buffers.codes, p.scales = buffers.scales, p.c = buffers.c;
  p.workspace = buffers.workspace, p.counters = buffers.counters;
  p.lda = k, p.ldc = n, p.m = 1, p.n = n, p.k = k;
  p.n_padded = n, p.k_blocks = k / 16, p.groups = k / 128, p.global_scale = 1.0f;
  const double bytes = n * (k / 2.0) + static_cast<double>(n) * (k / 128) * 4;
  // The grid: slices × K splits, each warp a whole number of stages (as the host plans it,
  // src/dispatch/dense_config.cpp, which picks the split that best fills whole waves).
  const int slices = n / 64;
  for (int splits : {1, 2, 4, 8}) {
    constexpr int kStage = P::Gemm::Shape::kStageK / 16;
    const int per_warp = (p.k_blocks / (splits * 4) + kStage - 1) / kStage * kStage;
    if (per_warp < 2 * kStage) continue;
    p.blocks_per_warp = per_warp;
    const dim3 grid(slices, 1, splits);
    const float us = timer.median_us([&] { P::kernel<<<grid, 128, P::kShared>>>(p); },
                                     [&] {
                                       read_ldg<4><<<sms * 8, 256>>>(
                                           reinterpret_cast<const uint4*>(flush_buffer),
                                           (256ll << 20) / 16, sink);
                                     });
    std::printf("%-22s %6dx%-6d splits %d  %4.2f waves  %7.1f us  %6.0f GB/s\n", name, n, k, splits,
                slices * splits / double(per_sm * sms), us, bytes / (us * 1e3));
  }
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int n_max = 28672, k_max = 28672;
  Buffers buffers{};
  const long long code_words = static_cast<long long>(n_max) * 8192 / 8;  // largest N·K / 8
  cudaMalloc(&buffers.codes, code_words * 4);
  cudaMalloc(&buffers.scales, static_cast<long long>(n_max) * (k_max / 128) * 4);
  cudaMalloc(&buffers.a, k_max * 2);
  cudaMalloc(&buffers.c, n_max * 2);
  cudaMalloc(&buffers.workspace, n_max * 4);
  cudaMalloc(&buffers.counters, n_max / 64 * 4);
  cudaMemset(buffers.workspace, 0, n_max * 4);
  cudaMemset(buffers.counters, 0, n_max / 64 * 4);
  fill_words<<<sms * 8, 256>>>(buffers.codes, code_words, 5u);
  // Scales and activations: finite values of moderate size (exponent bits fixed, mantissas random).
  fill_words<<<sms, 256>>>(reinterpret_cast<unsigned*>(buffers.scales), n_max * (k_max / 128), 7u);
  fill_words<<<sms, 256>>>(reinterpret_cast<unsigned*>(buffers.a), k_max / 2, 9u);
  char* flush_buffer = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&flush_buffer, 256ll << 20);
  cudaMalloc(&sink, 64);
  fill_words<<<sms * 8, 256>>>(reinterpret_cast<unsigned*>(flush_buffer), (256ll << 20) / 4, 3u);
  GpuTimer timer;
  const char* variant = QGEMM_PROBE_NAME;
  std::printf("decode probe (%s): w4a16 g128 M=1, bf16 out, L2 flushed, median us\n", variant);
  for (auto [n, k] : {std::pair{28672, 8192}, std::pair{8192, 28672}, std::pair{8192, 8192}}) {
    // The configs of src/dispatch/dense_config.cpp: "decode" (the default), "decode-k64",
    // "decode-s4".
    time_config<Probe<8, 3, 4>>("k128 s3 (decode)", buffers, n, k, timer, flush_buffer, sink, sms);
    time_config<Probe<4, 4, 5>>("k64 s4 (decode-k64)", buffers, n, k, timer, flush_buffer, sink,
                                sms);
    time_config<Probe<8, 4, 3>>("k128 s4 (decode-s4)", buffers, n, k, timer, flush_buffer, sink,
                                sms);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(error));
  return error == cudaSuccess ? 0 : 1;
}
