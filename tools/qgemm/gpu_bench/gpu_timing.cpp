#include "gpu_bench/gpu_timing.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "gpu_bench/baselines.hpp"
#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

// Events of one timing loop, destroyed with it.
class EventPool {
 public:
  explicit EventPool(std::size_t count) : events_(count, nullptr) {
    for (cudaEvent_t& event : events_) check_cuda(cudaEventCreate(&event), "cudaEventCreate");
  }
  ~EventPool() {
    for (cudaEvent_t event : events_)
      if (event) cudaEventDestroy(event);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t operator[](std::size_t i) const { return events_[i]; }

  // Microseconds between events `from` and `to` (both recorded, `to` complete).
  double elapsed_us(std::size_t from, std::size_t to) const {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_[from], events_[to]), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1000.0;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

// A captured and instantiated CUDA graph of one call.
class CallGraph {
 public:
  CallGraph(const GpuCall& call, cudaStream_t stream) {
    // Global mode: any call that is not capturable (a synchronous allocation, a memset on the
    // legacy stream) invalidates the capture instead of silently running outside the graph.
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
               "cudaStreamBeginCapture");
    try {
      call(stream);
    } catch (...) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream, &partial);
      if (partial) cudaGraphDestroy(partial);
      throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph_),
               "cudaStreamEndCapture (the call is not "
               "graph-capturable)");
    check_cuda(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~CallGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  CallGraph(const CallGraph&) = delete;
  CallGraph& operator=(const CallGraph&) = delete;
  void launch(cudaStream_t stream) const {
    check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw Error(ErrorCode::CudaError, fmt::format("{}: {}: {}", what, cudaGetErrorName(status),
                                                cudaGetErrorString(status)));
}

bool context_usable() {
  cudaGetLastError();  // clears a non-sticky error; a sticky one stays and fails the sync
  return cudaDeviceSynchronize() == cudaSuccess;
}

Stream::Stream() {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}
void Stream::synchronize() const {
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

std::vector<double> time_call(const GpuCall& call, const TimingPlan& plan, cudaStream_t stream,
                              L2Flusher& flusher) {
  require(plan.repeats >= 1, "time_call: repeats = {} (rule: >= 1)", plan.repeats);
  const auto repeats = static_cast<std::size_t>(plan.repeats);
  std::vector<double> samples(repeats);
  if (plan.mode == TimingMode::Warm) {
    for (int i = 0; i < plan.warmup; ++i) call(stream);
    EventPool events(repeats + 1);
    check_cuda(cudaEventRecord(events[0], stream), "cudaEventRecord");
    for (std::size_t i = 0; i < repeats; ++i) {
      call(stream);
      check_cuda(cudaEventRecord(events[i + 1], stream), "cudaEventRecord");
    }
    check_cuda(cudaEventSynchronize(events[repeats]), "cudaEventSynchronize");
    for (std::size_t i = 0; i < repeats; ++i) samples[i] = events.elapsed_us(i, i + 1);
    return samples;
  }
  // cold-l2 and graph: flush, then the call (or its graph) between two events.
  std::optional<CallGraph> graph;
  if (plan.mode == TimingMode::Graph) graph.emplace(call, stream);
  auto run = [&] {
    if (graph)
      graph->launch(stream);
    else
      call(stream);
  };
  for (int i = 0; i < plan.warmup; ++i) {
    flusher.flush(stream);
    run();
  }
  EventPool events(2 * repeats);
  for (std::size_t i = 0; i < repeats; ++i) {
    flusher.flush(stream);
    check_cuda(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
    run();
    check_cuda(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
  }
  check_cuda(cudaEventSynchronize(events[2 * repeats - 1]), "cudaEventSynchronize");
  for (std::size_t i = 0; i < repeats; ++i) samples[i] = events.elapsed_us(2 * i, 2 * i + 1);
  return samples;
}

std::vector<std::vector<double>> time_in_turns(const std::vector<GpuCall>& calls,
                                               const TimingPlan& plan, cudaStream_t stream,
                                               L2Flusher& flusher) {
  require(plan.repeats >= 1, "time_in_turns: repeats = {} (rule: >= 1)", plan.repeats);
  const bool flush = plan.mode != TimingMode::Warm;
  const auto repeats = static_cast<std::size_t>(plan.repeats);
  for (int i = 0; i < plan.warmup; ++i)
    for (const GpuCall& call : calls) {
      if (flush) flusher.flush(stream);
      call(stream);
    }
  EventPool events(2 * repeats * calls.size());
  for (std::size_t i = 0; i < repeats; ++i)
    for (std::size_t c = 0; c < calls.size(); ++c) {
      if (flush) flusher.flush(stream);
      const std::size_t at = 2 * (i * calls.size() + c);
      check_cuda(cudaEventRecord(events[at], stream), "cudaEventRecord");
      calls[c](stream);
      check_cuda(cudaEventRecord(events[at + 1], stream), "cudaEventRecord");
    }
  check_cuda(cudaEventSynchronize(events[2 * repeats * calls.size() - 1]), "cudaEventSynchronize");
  std::vector<std::vector<double>> samples(calls.size(), std::vector<double>(repeats));
  for (std::size_t i = 0; i < repeats; ++i)
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const std::size_t at = 2 * (i * calls.size() + c);
      samples[c][i] = events.elapsed_us(at, at + 1);
    }
  return samples;
}

double wall_call_ms(const GpuCall& call, cudaStream_t stream) {
  const auto start = std::chrono::steady_clock::now();
  call(stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

std::vector<double> read_sampled_output(const void* data, const Format& format, std::int64_t n,
                                        const OutputSample& sample) {
  require(format == formats::bf16 || format == formats::fp16 || format == formats::fp32,
          "read_sampled_output: format {} (rule: bf16, fp16 or fp32)", format.name());
  const std::int64_t bytes = format.storage_bytes();
  const std::int64_t columns = sample.columns();
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(sample.size()));
  std::vector<unsigned char> row(static_cast<std::size_t>(n * bytes));
  for (std::int64_t r : sample.rows) {
    check_cuda(cudaMemcpy(row.data(), static_cast<const unsigned char*>(data) + r * n * bytes,
                          row.size(), cudaMemcpyDeviceToHost),
               "cudaMemcpy (output row)");
    for (const auto& [begin, end] : sample.bands) {
      for (std::int64_t j = begin; j < end; ++j) {
        const unsigned char* p = row.data() + j * bytes;
        if (bytes == 4) {
          float value;
          std::memcpy(&value, p, 4);
          out.push_back(value);
        } else {
          out.push_back(decode(format, p[0] | (std::uint32_t{p[1]} << 8)));
        }
      }
    }
  }
  require(static_cast<std::int64_t>(out.size()) ==
              static_cast<std::int64_t>(sample.rows.size()) * columns,
          "read_sampled_output: sample size mismatch");
  return out;
}

Measurement measure(const GpuCall& call, void* output, std::int64_t output_bytes,
                    const std::function<double()>& error_now, double tolerance,
                    const TimingPlan& plan, cudaStream_t stream, L2Flusher& flusher) {
  auto poison = [&] {
    // 0xFF bytes are NaN in bf16, fp16 and fp32: an element no call writes fails the check.
    check_cuda(cudaMemsetAsync(output, 0xFF, static_cast<std::size_t>(output_bytes), stream),
               "cudaMemsetAsync (poison)");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  // Written so that NaN fails.
  auto within = [&](double error) { return error <= tolerance; };
  Measurement result;
  poison();
  result.first_call_ms = wall_call_ms(call, stream);
  result.error = error_now();
  if (!within(result.error)) {
    result.failure = fmt::format(
        "wrong result: error {:.3g} against the reference exceeds the "
        "tolerance {:.3g}",
        result.error, tolerance);
    return result;
  }
  result.warm_call_ms = wall_call_ms(call, stream);
  poison();
  const std::vector<double> samples = time_call(call, plan, stream, flusher);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const double after = error_now();
  if (!within(after)) {
    result.failure = fmt::format(
        "wrong result after the timed calls: error {:.3g} exceeds the "
        "tolerance {:.3g}",
        after, tolerance);
    return result;
  }
  result.error = std::max(result.error, after);
  result.time = summarize(samples);
  return result;
}

}  // namespace qgemm::bench
