// CUDA runtime helpers of `qgemm bench` and `qgemm tune`: status checks that throw
// qgemm::Error, a stream, the L2 flush (l2_flusher.hpp), the timing loops of the recipe's
// timing modes, and the run-check-time procedure every backend goes through (measure).
//
// Timing is GPU time between CUDA events around the call on one stream:
//
//   cold-l2   per repeat: [stream 2 x L2 through the L2] [start] call [stop]
//             The flush evicts the weight, as running the model's other layers would; while the
//             GPU runs it the host enqueues the call, so host launch overhead is hidden.
//   warm      [e0] call [e1] call [e2] ...   back to back: the weight may stay in L2 (fits
//             when it is smaller than L2), and host overhead shows when a call is shorter than
//             its launch.
//   graph     the call captured once into a CUDA graph; per repeat: [flush] [start] replay
//             [stop]. Launch cost of a graph, L2 as cold as in cold-l2.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/inputs.hpp"
#include "bench/recipe.hpp"
#include "bench/results.hpp"
#include "gpu_bench/l2_flusher.hpp"
#include "runtime/device_memory.hpp"

namespace qgemm::bench {

// Error(CudaError) "<what>: <error name>: <description>" unless `status` is cudaSuccess.
void check_cuda(cudaError_t status, const char* what);
// Whether the CUDA context still works: after a sticky error (an illegal address, a kernel
// that faulted) every later call fails, and the rest of a run must not be attempted.
bool context_usable();

class Stream {
 public:
  Stream();  // non-blocking: never synchronizes with the legacy default stream
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

using GpuCall = std::function<void(cudaStream_t)>;

struct TimingPlan {
  TimingMode mode = TimingMode::ColdL2;
  int warmup = 3;
  int repeats = 20;
};

// GPU time (µs) of `repeats` calls after `warmup` untimed ones, as the mode above says. The
// call must have run once on `stream` already (graph capture needs its workspaces to exist).
std::vector<double> time_call(const GpuCall& call, const TimingPlan& plan, cudaStream_t stream,
                              L2Flusher& flusher);

// The same for several calls timed in turns (call 0, call 1, ..., call 0, ...), each `repeats`
// times: clock and thermal drift then fall on all of them alike, so the ratio of their medians
// compares them fairly even where two runs of one call differ by more than the ratio's margin.
// Warm mode times them back to back, the others with the L2 flushed before each (graph mode
// launches the calls themselves). Every call must have run once already.
std::vector<std::vector<double>> time_in_turns(const std::vector<GpuCall>& calls,
                                               const TimingPlan& plan, cudaStream_t stream,
                                               L2Flusher& flusher);

// Host wall time (ms) of one call and the synchronization that waits for it.
double wall_call_ms(const GpuCall& call, cudaStream_t stream);

// Reads the sampled block of a row-major [m, n] output of `format` (bf16, fp16, fp32) at
// `data` (row stride n) into [rows][columns], as OutputSample orders it.
std::vector<double> read_sampled_output(const void* data, const Format& format, std::int64_t n,
                                        const OutputSample& sample);

struct Measurement {
  double first_call_ms = 0, warm_call_ms = 0;
  double error = 0;     // relative Frobenius error of the output against the reference
  std::string failure;  // why the result is not acceptable (empty: it is)
  std::optional<TimingStats> time;
};

// The procedure every backend and candidate goes through: poison the output (NaN bytes), run
// once (first_call_ms: includes JIT compilation or loading), compare with the reference; only
// a result within `tolerance` is timed: one more call (warm_call_ms), poison again, the timed
// calls, and a second comparison (the timed calls, graph replays included, must have written
// the right output).
Measurement measure(const GpuCall& call, void* output, std::int64_t output_bytes,
                    const std::function<double()>& error_now, double tolerance,
                    const TimingPlan& plan, cudaStream_t stream, L2Flusher& flusher);

}  // namespace qgemm::bench
