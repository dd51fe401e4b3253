// How fast this GPU reads a weight-sized buffer once, by access pattern: the ceiling of the
// streamed decode kernel (kernels/gemm/sm80_decode.cuh), which reads each prepared weight once.
//   ldg       every thread loads 16-byte vectors, grid-stride, kUnroll loads in flight
//   cp.async  each warp streams its own contiguous run through a ring of shared-memory stages
//             (the decode kernel's pattern: cp.async per lane and 16 bytes, wait_group,
//             __syncwarp), then reads every stage back once
//   bulk      the same ring filled by one lane with cp.async.bulk (SM90 copy engine) and an
//             mbarrier per stage
// "persistent" grids run one stream per resident warp; "waves" grids run 2.7 waves of shorter
// streams (what the decode kernel's wave-filling split does). The L2 is flushed by reading
// another 256 MB buffer before every timed launch.
// Built and run by scripts/gpu_session.sh:  nvcc -O3 -arch=sm_90a -Ikernels bench/read_ceiling.cu
#include <cuda_runtime.h>

#include <cstdio>

#include "gpu_timer.cuh"
#include "ptx/async_copy.cuh"
#include "ptx/bulk_copy.cuh"

namespace {
namespace ptx = qgemm::ptx;

// Stage s of warp w's stream: stages [w · per_warp, + per_warp) of the buffer.
template <int kStageBytes, int kStages, bool kBulk>
__global__ void read_stream(const char* data, long long stages_total, int per_warp,
                            unsigned* sink) {
  extern __shared__ __align__(128) char shared[];
  constexpr int kWarps = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long stream = static_cast<long long>(blockIdx.x) * kWarps + warp;
  const long long first = stream * per_warp;
  const long long left = stages_total - first;
  const int stages = left <= 0 ? 0 : (left < per_warp ? static_cast<int>(left) : per_warp);
  char* ring = shared + warp * (kStages * kStageBytes + 64);
  const unsigned ring_address = ptx::shared_address(ring);
  const unsigned barriers = ptx::shared_address(ring + kStages * kStageBytes);
  const char* src = data + first * kStageBytes;
  if constexpr (kBulk) {
    if (lane < kStages) ptx::mbarrier_init(barriers + lane * 8, 1);
    ptx::fence_barrier_init();
    __syncwarp();
  }
  auto load = [&](int s) {
    const unsigned dst = ring_address + (s % kStages) * kStageBytes;
    if constexpr (kBulk) {
      if (lane == 0) {
        const unsigned barrier = barriers + (s % kStages) * 8;
        ptx::mbarrier_arrive_expect_tx(barrier, kStageBytes);
        ptx::bulk_copy(dst, src + static_cast<long long>(s) * kStageBytes, kStageBytes, barrier);
      }
    } else {
#pragma unroll
      for (int c = 0; c < kStageBytes / 512; ++c)
        ptx::cp_async_16(dst + c * 512 + lane * 16,
                         src + static_cast<long long>(s) * kStageBytes + c * 512 + lane * 16, 16);
    }
  };
  unsigned x = 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) load(s);
    if constexpr (!kBulk) ptx::cp_async_commit();
  }
  for (int s = 0; s < stages; ++s) {
    if constexpr (kBulk) {
      ptx::mbarrier_wait_parity(barriers + (s % kStages) * 8, (s / kStages) % 2);
    } else {
      ptx::cp_async_wait<kStages - 2>();
    }
    __syncwarp();  // stage s landed for every lane; every lane is done with stage s − 1
    if (s + kStages - 1 < stages) {
      if constexpr (kBulk) ptx::fence_proxy_async_shared();
      load(s + kStages - 1);
    }
    if constexpr (!kBulk) ptx::cp_async_commit();
    const uint4* stage = reinterpret_cast<const uint4*>(ring + (s % kStages) * kStageBytes);
#pragma unroll
    for (int c = 0; c < kStageBytes / 512; ++c) {
      const uint4 v = stage[c * 32 + lane];
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (x == 0x9e3779b9u) sink[0] = x;
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const long long flush_bytes = 256ll << 20;
  const long long sizes[] = {117440512ll, 33554432ll};  // w4 codes of 28672×8192 and 8192×8192
  char *data = nullptr, *flush_buffer = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&data, sizes[0]);
  cudaMalloc(&flush_buffer, flush_bytes);
  cudaMalloc(&sink, 64);
  fill_words<<<sms * 8, 256>>>(reinterpret_cast<unsigned*>(data), sizes[0] / 4, 17u);
  fill_words<<<sms * 8, 256>>>(reinterpret_cast<unsigned*>(flush_buffer), flush_bytes / 4, 29u);
  GpuTimer timer;
  auto flush = [&] {
    read_ldg<4>
        <<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(flush_buffer), flush_bytes / 16, sink);
  };
  std::printf("read ceiling, %d SMs (µs, GB/s of the buffer read once)\n", sms);
  std::printf("%-34s %10s %10s %10s %10s\n", "pattern", "117MB us", "GB/s", "33.5MB us", "GB/s");
  auto report = [&](const char* name, auto launch) {
    float us[2];
    for (int i = 0; i < 2; ++i) us[i] = timer.median_us([&] { launch(sizes[i]); }, flush);
    std::printf("%-34s %10.1f %10.0f %10.1f %10.0f\n", name, us[0], sizes[0] / (us[0] * 1e3), us[1],
                sizes[1] / (us[1] * 1e3));
  };
  report("ldg x4, 8x256 blocks/SM", [&](long long bytes) {
    read_ldg<4><<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(data), bytes / 16, sink);
  });
  report("ldg x8, 8x256 blocks/SM", [&](long long bytes) {
    read_ldg<8><<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(data), bytes / 16, sink);
  });
  auto stream = [&](const char* name, auto kernel, int stage_bytes, int stages, double waves) {
    const int shared = 4 * (stages * stage_bytes + 64);
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, shared);
    char label[64];
    std::snprintf(label, sizeof label, "%s %dKBx%d %s %dw/SM", name, stage_bytes / 1024, stages,
                  waves > 1 ? "waves" : "persist", per_sm * 4);
    report(label, [&](long long bytes) {
      const long long total = bytes / stage_bytes;
      const long long warps = static_cast<long long>(per_sm * sms * 4 * waves);
      const int per_warp = static_cast<int>((total + warps - 1) / warps);
      const long long used = (total + per_warp - 1) / per_warp;
      kernel<<<(used + 3) / 4, 128, shared>>>(data, total, per_warp, sink);
    });
  };
  stream("cp.async", read_stream<2048, 4, false>, 2048, 4, 2.7);
  stream("cp.async", read_stream<2048, 4, false>, 2048, 4, 1.0);
  stream("cp.async", read_stream<4096, 4, false>, 4096, 4, 1.0);
  stream("cp.async", read_stream<8192, 4, false>, 8192, 4, 1.0);
  stream("bulk", read_stream<2048, 4, true>, 2048, 4, 2.7);
  stream("bulk", read_stream<2048, 4, true>, 2048, 4, 1.0);
  stream("bulk", read_stream<4096, 4, true>, 4096, 4, 1.0);
  stream("bulk", read_stream<8192, 4, true>, 8192, 4, 1.0);
  stream("bulk", read_stream<4096, 8, true>, 4096, 8, 1.0);
  stream("bulk", read_stream<16384, 3, true>, 16384, 3, 1.0);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(error));
  return error == cudaSuccess ? 0 : 1;
}
