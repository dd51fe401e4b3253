// qgemm_moe_bench: times the MoE layer (Engine::moe) and its parts on the rows of issue #17,
// each captured into a CUDA graph (one host launch: the timing is the GPU's, without the gaps
// the host would leave between a layer's ~8 launches) and replayed after an L2 flush, median of
// the repeats. Random routing: each token picks top_k distinct experts, router weights in
// (0.05, 1). Schemes: w4a16 and mxfp4-a16 on both layers, w4a8-fp8 on Qwen3's (its hidden
// states quantized by the layer, the grouped GEMMs on 16-bit tensor cores), and any preset or
// compact scheme through --case (quoted: compact forms hold ';'), e.g. issue #17's gpt-oss
// down row: --case 'gpt-oss-120b:w=int4:g64:s=bf16;a=e4m3:tok:s=fp32;o=bf16:256'.
//
//   build/bench/qgemm_moe_bench [--quick] [--case LAYER:SCHEME:M] [--layout auto|wgmma|mma]
//                               [--candidate NAME] [--decode]
//
// --layout: prepare_experts' ExpertLayout; --candidate: forces both grouped GEMMs (the layer's
// MoeOptions::gemm_candidate and the GEMMs timed alone; an 8-bit tile, e.g. wgmma-fp8-128, the
// layer's gate_up only); --decode = --layout mma --candidate
// decode (the grouped decode kernel), over M = 1, 4, 16, 64
// unless --case names one.
//
// Columns: layer = route + gather + gate_up + GLU + down + combine; gate_up = route + gather +
// the gate_up grouped GEMM (what a fused MoE kernel with its own alignment step does);
// up_gemm / down_gemm = each grouped GEMM alone on rows already in expert order (for a scheme
// with quantized activations: the same experts prepared for 16-bit rows). TFLOPS and
// TB/s of the gate_up GEMM: routed FLOPs (2 · M · top_k · N · K), and the bytes of the experts
// that receive tokens (their codes and scales, expected count under uniform routing).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
#include "qgemm/moe.hpp"

namespace {

struct Layer {
  const char* name;
  int experts, top_k;
  long long hidden, inter;
  qgemm::GluKind glu;
};

const Layer kLayers[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768, qgemm::GluKind::Silu},
    {"gpt-oss-120b", 128, 4, 2880, 2880, qgemm::GluKind::ClampedSwiglu},
    // Issue #17's fp8-block target (gate_up >= 1000 TFLOPS at M = 4096); --case only, e.g.
    // --case deepseek-v3:fp8-block:4096 --candidate wgmma-fp8-128.
    {"deepseek-v3", 256, 8, 7168, 2048, qgemm::GluKind::Silu},
};

struct Case {
  const Layer* layer;
  std::string scheme;
  long long m;
};

// A graph of what `enqueue` puts on `stream`.
struct Graph {
  cudaGraphExec_t exec = nullptr;
  template <typename Enqueue>
  Graph(cudaStream_t stream, Enqueue enqueue) {
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  ~Graph() { cudaGraphExecDestroy(exec); }
};

double median_us(const Graph& graph, cudaStream_t stream, qgemm::bench::L2Flusher& flusher,
                 int repeats) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaGraphLaunch(graph.exec, stream));  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    flusher.flush(stream);
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(graph.exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(host.size() * sizeof(T), 16)));
  CHECK_CUDA(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(p);
}

std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<std::uint16_t> out(count);
  for (auto& v : out) v = static_cast<std::uint16_t>(qgemm::encode(qgemm::formats::bf16, normal(rng)));
  return out;
}

// `experts` expert weights [n, k]: four distinct random quantized matrices repeated (each expert
// still has its own copy on the device, so every expert's bytes are read).
std::vector<qgemm::PackedWeight> random_experts(const qgemm::Scheme& scheme, int experts,
                                                long long n, long long k, std::mt19937& rng) {
  std::vector<qgemm::PackedWeight> distinct;
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
  for (int d = 0; d < 4; ++d) {
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    distinct.push_back(qgemm::quantize_weight(scheme.weight, w.data(), n, k));
  }
  std::vector<qgemm::PackedWeight> out;
  for (int e = 0; e < experts; ++e) out.push_back(distinct[static_cast<std::size_t>(e % 4)]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Case> cases;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  for (const Layer& layer : kLayers)
    for (const char* scheme : {"w4a16", "mxfp4-a16", "w4a8-fp8"}) {
      if (std::strcmp(layer.name, "gpt-oss-120b") == 0 && std::strcmp(scheme, "mxfp4-a16") != 0)
        continue;
      if (std::strcmp(layer.name, "deepseek-v3") == 0) continue;
      for (long long m : {1LL, 16LL, 256LL, 4096LL}) cases.push_back({&layer, scheme, m});
    }
  if (quick) cases = {{&kLayers[0], "w4a16", 1}, {&kLayers[0], "w4a16", 256}};
  qgemm::ExpertLayout expert_layout = qgemm::ExpertLayout::Auto;
  std::string candidate;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--decode") == 0) {
      expert_layout = qgemm::ExpertLayout::Mma;
      candidate = "decode";
      cases.clear();
      for (const Layer& layer : kLayers)
        for (const char* scheme : {"w4a16", "mxfp4-a16"}) {
          if (std::strcmp(layer.name, "gpt-oss-120b") == 0 && std::strcmp(scheme, "w4a16") == 0)
            continue;
          for (long long m : {1LL, 4LL, 16LL, 64LL}) cases.push_back({&layer, scheme, m});
        }
    } else if (std::strcmp(argv[i], "--layout") == 0 && i + 1 < argc) {
      const std::string name = argv[++i];
      if (name == "auto") {
        expert_layout = qgemm::ExpertLayout::Auto;
      } else if (name == "wgmma") {
        expert_layout = qgemm::ExpertLayout::Wgmma;
      } else if (name == "mma") {
        expert_layout = qgemm::ExpertLayout::Mma;
      } else {
        std::fprintf(stderr, "--layout %s: expected auto, wgmma or mma\n", name.c_str());
        return 2;
      }
    } else if (std::strcmp(argv[i], "--candidate") == 0 && i + 1 < argc) {
      candidate = argv[++i];
    }
  }
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--case") == 0) {
      // LAYER:SCHEME:M, split at the first and the last colon (compact schemes hold colons,
      // e.g. gpt-oss's down row 'gpt-oss-120b:w=int4:g64:s=bf16;a=e4m3:tok:s=fp32;o=bf16:256').
      const std::string text = argv[i + 1];
      const std::size_t first = text.find(':'), last = text.rfind(':');
      char* end = nullptr;
      const long long m = first != last ? std::strtoll(text.c_str() + last + 1, &end, 10) : 0;
      if (first == last || end == text.c_str() + last + 1 || *end != '\0' || m < 1) {
        std::fprintf(stderr, "--case %s: expected LAYER:SCHEME:M\n", argv[i + 1]);
        return 2;
      }
      const std::string layer_name = text.substr(0, first);
      const std::string scheme = text.substr(first + 1, last - first - 1);
      cases.clear();
      for (const Layer& layer : kLayers)
        if (layer_name == layer.name) cases.push_back({&layer, scheme, m});
      if (cases.empty()) {
        std::fprintf(stderr, "--case: no layer '%s'\n", layer_name.c_str());
        return 2;
      }
    }

  std::mt19937 rng(std::random_device{}());
  qgemm::Engine engine(0);
  int l2_bytes = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  qgemm::bench::L2Flusher flusher(l2_bytes);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("%-14s %-10s %5s | %9s %9s %9s %9s | %8s %7s | %s\n", "layer", "scheme", "M",
              "layer_us", "gate_up", "up_gemm", "down_gemm", "TFLOPS", "TB/s", "gate_up kernel");
  const Layer* built_layer = nullptr;
  std::string built_scheme;
  // The layer's experts, and the same prepared for the grouped GEMMs timed alone (plain, for
  // the 16-bit rows they take).
  qgemm::QuantWeight gate_up, down, gate_up_rows, down_rows_weight;
  double up_expert_bytes = 0;
  for (const Case& c : cases) {
    const Layer& L = *c.layer;
    try {
      const qgemm::Scheme scheme = qgemm::parse_scheme(c.scheme);  // names a bad --case scheme
      if (built_layer != &L || built_scheme != c.scheme) {
        const auto up_experts = random_experts(scheme, L.experts, 2 * L.inter, L.hidden, rng);
        const auto down_experts = random_experts(scheme, L.experts, L.hidden, L.inter, rng);
        // The layer's gate_up set for the fused GLU (QGEMM_FUSED_GLU=0: the separate pass);
        // the GEMM timed alone writes gate_up's rows, so it takes a plain set.
        gate_up = engine.prepare_experts(up_experts, scheme.activation, expert_layout,
                                         qgemm::ExpertRole::GateUp);
        down = engine.prepare_experts(down_experts, scheme.activation, expert_layout);
        gate_up_rows = engine.prepare_experts(up_experts, {}, expert_layout);
        down_rows_weight = down;
        if (scheme.activation.is_quantized())
          down_rows_weight = engine.prepare_experts(down_experts, {}, expert_layout);
        const qgemm::PackedWeight& one = up_experts.front();
        up_expert_bytes = static_cast<double>(one.codes.size() + one.scales.size() + one.zeros.size());
        built_layer = &L;
        built_scheme = c.scheme;
      }
      const long long slots = c.m * L.top_k;
      // Routing: distinct experts per token.
      std::vector<std::int32_t> ids(static_cast<std::size_t>(slots));
      std::vector<float> weights(ids.size());
      std::uniform_real_distribution<float> weight(0.05f, 1.0f);
      std::vector<int> order(static_cast<std::size_t>(L.experts));
      for (long long t = 0; t < c.m; ++t) {
        for (int e = 0; e < L.experts; ++e) order[static_cast<std::size_t>(e)] = e;
        std::shuffle(order.begin(), order.end(), rng);
        for (int j = 0; j < L.top_k; ++j) {
          ids[static_cast<std::size_t>(t * L.top_k + j)] = order[static_cast<std::size_t>(j)];
          weights[static_cast<std::size_t>(t * L.top_k + j)] = weight(rng);
        }
      }
      std::int32_t* ids_d = device_copy(ids);
      float* weights_d = device_copy(weights);
      std::uint16_t* hidden_d =
          device_copy(random_bf16(static_cast<std::size_t>(c.m * L.hidden), rng, 1.0f));
      void* out_d = nullptr;
      CHECK_CUDA(cudaMalloc(&out_d, static_cast<std::size_t>(c.m * L.hidden) * 2));
      qgemm::MoeOptions options;
      options.activation.kind = L.glu;
      options.gemm_candidate = candidate;
      const qgemm::DeviceMatrix hidden{hidden_d, c.m, L.hidden, L.hidden, qgemm::formats::bf16};
      const qgemm::DeviceMatrix out{out_d, c.m, L.hidden, L.hidden, qgemm::formats::bf16};
      auto layer_call = [&] {
        engine.moe(hidden, ids_d, weights_d, L.top_k, gate_up, down, out, stream, options);
      };
      layer_call();  // plans, sizes the workspace
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const int repeats = c.m >= 1024 ? 15 : 30;
      const double layer_us = median_us(Graph(stream, layer_call), stream, flusher, repeats);

      // The gate_up GEMM alone and with its routing and gather; the down GEMM alone. (An 8-bit
      // tile forced for the layer's gate_up takes its rows quantized in Engine::moe; the GEMMs
      // alone multiply 16-bit rows, so they run as the selector chooses then.)
      const bool eight_bit =
          candidate.find("fp8") != std::string::npos || candidate.find("int8") != std::string::npos;
      const std::string alone = eight_bit ? "" : candidate;
      qgemm::GemmProblem up_problem =
          qgemm::gemm_problem(gate_up_rows, slots, qgemm::formats::bf16, qgemm::formats::bf16);
      up_problem.candidate = alone;
      const qgemm::GemmPlan up_plan = engine.plan(up_problem, gate_up_rows, stream);
      const qgemm::GemmPlan::Choice& up_choice = up_plan.choice_for(slots);
      qgemm::GemmProblem down_problem =
          qgemm::gemm_problem(down_rows_weight, slots, qgemm::formats::bf16, qgemm::formats::fp32);
      down_problem.route_block = up_choice.route_block;
      down_problem.candidate = alone;
      const qgemm::GemmPlan down_plan = engine.plan(down_problem, down_rows_weight, stream);
      qgemm::MoeRoutingShape shape;
      shape.tokens = c.m;
      shape.top_k = L.top_k;
      shape.global_experts = shape.local_experts = L.experts;
      shape.block = up_choice.route_block;
      const long long capacity = qgemm::moe_routing_capacity(shape);
      void *routing_space = nullptr, *rows_in = nullptr, *rows_up = nullptr, *rows_act = nullptr,
           *rows_down = nullptr;
      const std::size_t routing_bytes = qgemm::moe_routing_workspace_bytes(shape);
      CHECK_CUDA(cudaMalloc(&routing_space, routing_bytes));
      const auto rows_in_host = random_bf16(static_cast<std::size_t>(capacity * L.hidden), rng, 1.0f);
      rows_in = device_copy(rows_in_host);
      const auto act_host = random_bf16(static_cast<std::size_t>(capacity * L.inter), rng, 0.5f);
      rows_act = device_copy(act_host);
      CHECK_CUDA(cudaMalloc(&rows_up, static_cast<std::size_t>(capacity * 2 * L.inter) * 2));
      CHECK_CUDA(cudaMalloc(&rows_down, static_cast<std::size_t>(capacity * L.hidden) * 4));
      const qgemm::MoeIndexedRouting routing =
          engine.route_moe(shape, ids_d, nullptr, routing_space, routing_bytes, stream);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const qgemm::DeviceMatrix in_rows{rows_in, capacity, L.hidden, L.hidden, qgemm::formats::bf16};
      const qgemm::DeviceMatrix up_rows{rows_up, capacity, 2 * L.inter, 2 * L.inter,
                                        qgemm::formats::bf16};
      const qgemm::DeviceMatrix act_rows{rows_act, capacity, L.inter, L.inter, qgemm::formats::bf16};
      const qgemm::DeviceMatrix down_rows{rows_down, capacity, L.hidden, L.hidden,
                                          qgemm::formats::fp32};
      auto up_gemm = [&] {
        engine.moe_gemm(up_plan, routing, in_rows, gate_up_rows, up_rows, stream);
      };
      auto down_gemm = [&] {
        engine.moe_gemm(down_plan, routing, act_rows, down_rows_weight, down_rows, stream);
      };
      auto gate_up_call = [&] {
        engine.route_moe(shape, ids_d, nullptr, routing_space, routing_bytes, stream);
        up_gemm();
      };
      up_gemm();
      down_gemm();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const double up_us = median_us(Graph(stream, up_gemm), stream, flusher, repeats);
      const double down_us = median_us(Graph(stream, down_gemm), stream, flusher, repeats);
      const double gate_up_us = median_us(Graph(stream, gate_up_call), stream, flusher, repeats);

      const double active =
          L.experts * (1.0 - std::pow(1.0 - 1.0 / L.experts, static_cast<double>(slots)));
      const double flops = 2.0 * slots * (2 * L.inter) * L.hidden;
      std::printf("%-14s %-10s %5lld | %9.2f %9.2f %9.2f %9.2f | %8.1f %7.2f | %s\n", L.name,
                  c.scheme.c_str(), c.m, layer_us, gate_up_us, up_us, down_us,
                  flops / (up_us * 1e-6) / 1e12, active * up_expert_bytes / (up_us * 1e-6) / 1e12,
                  up_choice.kernel.c_str());
      std::fflush(stdout);
      for (void* p : {routing_space, rows_in, rows_up, rows_act, rows_down, out_d,
                      static_cast<void*>(ids_d), static_cast<void*>(weights_d),
                      static_cast<void*>(hidden_d)})
        cudaFree(p);
    } catch (const qgemm::Error& error) {
      std::printf("%-14s %-10s %5lld | FAILED: %s\n", L.name, c.scheme.c_str(), c.m, error.what());
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}
