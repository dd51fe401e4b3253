// The ceiling of mma.sync m16n8k16 (bf16 in, fp32 accumulate) on this GPU: every warp issues
// independent HMMAs on register operands, nothing else. This bounds any kernel of the mma.sync
// family (kernels/gemm/sm80_*.cuh); bench/NOTES.md compares it with cuBLAS (wgmma on Hopper).
// Built and run by scripts/gpu_session.sh:  nvcc -O3 -arch=sm_90a bench/mma_ceiling.cu
#include <cuda_runtime.h>

#include <cstdio>

constexpr int kAccumulators = 8;  // independent chains per warp: enough to cover HMMA latency
constexpr int kIterations = 4096;

__global__ void hmma_loop(float* sink, unsigned seed) {
  unsigned a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (seed * (threadIdx.x + i) & 0x00ff00ffu);
  b[0] = a[1] ^ 0x00010001u, b[1] = a[2] ^ 0x00020002u;
  float acc[kAccumulators][4] = {};
  for (int it = 0; it < kIterations; ++it) {
#pragma unroll
    for (int j = 0; j < kAccumulators; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float total = 0.0f;
  for (int j = 0; j < kAccumulators; ++j) total += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (total == 1.2345f) sink[threadIdx.x] = total;  // keeps the loop alive, never true in practice
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink = nullptr;
  cudaMalloc(&sink, 1024 * sizeof(float));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::printf("mma.sync m16n8k16 bf16 ceiling, %d SMs\n%8s %10s %10s\n", sms, "warps/SM", "ms",
              "TFLOPS");
  for (int warps : {4, 8, 16, 32}) {
    const int blocks = sms * (warps >= 8 ? warps / 8 : 1), threads = warps >= 8 ? 256 : 32 * warps;
    hmma_loop<<<blocks, threads>>>(sink, 7u);  // warm-up (clocks)
    cudaEventRecord(start);
    for (int r = 0; r < 5; ++r) hmma_loop<<<blocks, threads>>>(sink, 7u + r);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    // FLOPs of one launch over the time of one launch.
    const double flops = static_cast<double>(blocks) * (threads / 32) * kIterations * kAccumulators * 2.0 * 16 * 8 * 16;
    std::printf("%8d %10.3f %10.1f\n", warps, ms / 5, flops / (ms / 5 * 1e-3) / 1e12);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(error));
  return error == cudaSuccess ? 0 : 1;
}
