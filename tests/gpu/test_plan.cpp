// The plan API on the GPU (include/qgemm/plan.hpp): plans of every path captured into CUDA
// graphs and replayed on fresh inputs, one Engine used by 8 threads on 4 streams at once, range
// plans across their M buckets, the run path's checks, and the negative control of the
// element-wise output check every GPU test relies on. Fresh random inputs (the seed is printed),
// outputs poisoned before every launch, every element compared with the CPU reference.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/gpu_limits.hpp"
#include "gemm_check.hpp"
#include "gpu_test_util.hpp"
#include "jit/catalog.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "scoped_env.hpp"

namespace qgemm {
namespace {

std::uint32_t fresh_seed() {
  static const std::uint32_t seed = std::random_device{}();
  return seed;
}

// One weight of `scheme` ([n, k], random) prepared on `engine`, with its exact values.
struct Weight {
  Scheme scheme;
  PackedWeight packed;
  std::vector<double> values;
  QuantWeight prepared;
};

Weight make_weight(Engine& engine, const std::string& scheme_text, std::int64_t n, std::int64_t k,
                   std::mt19937& rng) {
  Weight w;
  w.scheme = parse_scheme(scheme_text);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> values(static_cast<std::size_t>(n * k));
  for (float& x : values) x = normal(rng);
  w.packed = quantize_weight(w.scheme.weight, values.data(), n, k);
  w.values = dequantize_weight(w.packed);
  w.prepared = engine.prepare_weight(w.packed, w.scheme.activation);
  return w;
}

// Activations for a call of M rows: bf16 on the device, and what the GEMM must multiply (the
// scheme's quantization of them, exactly), with the reference product and its bounds.
struct Call {
  std::int64_t m = 0;
  runtime::DeviceBuffer a;
  std::vector<std::uint16_t> a_bits;
  std::vector<double> expected, bounds;
};

Call make_call(const Weight& w, std::int64_t m, std::mt19937& rng) {
  Call call;
  call.m = m;
  const std::int64_t k = w.packed.k;
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> a(static_cast<std::size_t>(m * k));
  call.a_bits.resize(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    call.a_bits[i] = static_cast<std::uint16_t>(encode(formats::bf16, normal(rng)));
    a[i] = static_cast<float>(decode(formats::bf16, call.a_bits[i]));
  }
  call.a = runtime::DeviceBuffer::from(call.a_bits);
  const ActivationQuant& quant = w.scheme.activation;
  ActivationQuant bf16;
  const PackedActivation q = quantize_activation(quant.is_quantized() ? quant : bf16, a.data(), m, k);
  const std::vector<double> a_values = dequantize_activation(q);
  call.expected = reference::matmul_nt(a_values.data(), w.values.data(), m, w.packed.n, k);
  const Format operand = quant.is_quantized() ? jit::activation_operand_format(quant) : formats::bf16;
  // cuBLASLt FP8 accumulates fast (fewer significant bits than fp32 partial sums): 2^-10 per
  // product bounds it (src/runtime/cublaslt.hpp's tests measure that).
  check::OperandRounding rounding = test::operand_rounding(quant, operand);
  if (w.scheme.weight.format.bits == 8 && w.scheme.weight.format.is_float() && quant.is_quantized())
    rounding.accumulator = std::ldexp(1.0, -10);
  call.bounds = test::gemm_bounds(a_values, w.packed, w.values, m, rounding, w.scheme.output,
                                  call.expected);
  return call;
}

// Redraws the activations of `call` in place (same device buffer: what a graph replays on).
void refresh(Call& call, const Weight& w, std::mt19937& rng) {
  Call fresh = make_call(w, call.m, rng);
  call.a.upload(fresh.a_bits.data(), fresh.a_bits.size() * 2);
  call.a_bits = std::move(fresh.a_bits);
  call.expected = std::move(fresh.expected);
  call.bounds = std::move(fresh.bounds);
}

test::OutputCheck check_c(const runtime::DeviceBuffer& c, const Weight& w, const Call& call) {
  return test::check_output(check::read_device_values(c, w.scheme.output, call.expected.size()),
                            call.expected, call.bounds, w.packed.n);
}

struct Stream {
  CUstream stream = nullptr;
  Stream() {
    const auto& driver = runtime::Driver::get();
    driver.check(driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  ~Stream() { runtime::Driver::get().cuStreamDestroy(stream); }
  void synchronize() const {
    const auto& driver = runtime::Driver::get();
    driver.check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize");
  }
};

// Captures `enqueue` on `stream` into a graph, instantiated.
struct Graph {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  template <typename Enqueue>
  Graph(CUstream stream, Enqueue enqueue) {
    const auto& driver = runtime::Driver::get();
    driver.check(driver.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                 "cuStreamBeginCapture");
    enqueue();
    driver.check(driver.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    driver.check(driver.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
  }
  ~Graph() {
    const auto& driver = runtime::Driver::get();
    if (exec) driver.cuGraphExecDestroy(exec);
    if (graph) driver.cuGraphDestroy(graph);
  }
  void replay(CUstream stream) const {
    const auto& driver = runtime::Driver::get();
    driver.check(driver.cuGraphLaunch(exec, stream), "cuGraphLaunch");
  }
};

// Every path, through run() and through gemm(), captured into a graph after one warm call and
// replayed twice on fresh activations: the streamed and tiled mma.sync kernels (16-bit and 8-bit
// operands, split-K), dequantize + cuBLAS from the mma layout and from the canonical form, with
// quantized activations, cuBLASLt FP8, and the SM90 wgmma family (register and transform paths,
// split-K; on sm_90a).
TEST(PlanGpu, EveryPathCapturesIntoAGraphAndReplaysOnFreshInputs) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);
  Stream stream;
  struct Case {
    const char* scheme;
    std::int64_t m, n, k;
    const char* candidate;
  };
  const Case cases[] = {
      {"w4a16", 1, 640, 2048, "decode"},
      {"w4a16", 64, 640, 2048, "medium"},
      {"w8a8-int8", 64, 640, 2048, "medium-a8"},
      {"w4a16", 300, 640, 2048, "qdq"},
      {"mxfp8-mxfp4", 64, 640, 2048, "qdq"},
      {"w=uint4:g48:s=bf16:zp=int;a=bf16;o=bf16", 17, 640, 2016, "qdq"},
      {"w8a8-fp8", 64, 640, 2048, "cublaslt-fp8"},
      {"nvfp4", 16, 640, 2048, ""},
      // The SM90 wgmma family (sm_90a only): split-K decode, a wide token block, transform warps.
      {"w4a16", 1, 640, 2048, "wgmma-8"},
      {"w4a16", 300, 640, 2048, "wgmma-256"},
      {"w4a16", 64, 640, 2048, "wgmma-64-tx"},
  };
  const bool sm90 =
      dispatch::GpuLimits::of_device(runtime::device_info(0)).arch == jit::Arch::sm_90a;
  for (const Case& c : cases) {
    const std::string label = std::string(c.scheme) + " M=" + std::to_string(c.m) + " " +
                              (*c.candidate ? c.candidate : "selector") + " seed " +
                              std::to_string(seed);
    SCOPED_TRACE(label);
    const bool wgmma = std::string(c.candidate).rfind("wgmma", 0) == 0;
    if (wgmma && !sm90) {
      std::printf("%s: skipped (the wgmma family needs sm_90a)\n", label.c_str());
      continue;
    }
    // QGEMM_WGMMA=1: prepare_weight keeps every layout, so that any config can be forced
    // (dispatch/wgmma_family.hpp).
    const Weight w = [&] {
      const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");
      return make_weight(engine, c.scheme, c.n, c.k, rng);
    }();
    GemmProblem problem = gemm_problem(w.prepared, c.m, formats::bf16, w.scheme.output);
    problem.candidate = c.candidate;
    GemmPlan plan;
    try {
      plan = engine.plan(problem, w.prepared, stream.stream);
    } catch (const Error& error) {
      // cuBLASLt FP8 needs an FP8 GPU; everything else serves everywhere.
      ASSERT_EQ(std::string(c.candidate), "cublaslt-fp8") << error.what();
      std::printf("%s: skipped (%s)\n", label.c_str(), error.what());
      continue;
    }
    std::printf("%s\n", plan.to_string().c_str());
    Call call = make_call(w, c.m, rng);
    runtime::DeviceBuffer out(static_cast<std::size_t>(c.m * c.n) *
                              w.scheme.output.storage_bytes());
    const DeviceMatrix a{call.a.as<void>(), c.m, c.k, c.k, formats::bf16};
    const DeviceMatrix cm{out.as<void>(), c.m, c.n, c.n, w.scheme.output};
    GemmOptions options;
    options.candidate = c.candidate;
    // Warm calls: the plan's run, and gemm()'s own plan for this shape and stream.
    engine.run(plan, a, w.prepared, cm, stream.stream);
    engine.gemm(a, w.prepared, cm, stream.stream, options);
    stream.synchronize();
    for (const bool through_gemm : {false, true}) {
      const Graph graph(stream.stream, [&] {
        if (through_gemm)
          engine.gemm(a, w.prepared, cm, stream.stream, options);
        else
          engine.run(plan, a, w.prepared, cm, stream.stream);
      });
      for (int replay = 0; replay < 2; ++replay) {
        refresh(call, w, rng);
        out.fill_bytes(0xFF);
        graph.replay(stream.stream);
        stream.synchronize();
        const test::OutputCheck check = check_c(out, w, call);
        EXPECT_TRUE(check.ok()) << (through_gemm ? "gemm" : "run") << " replay " << replay << ": "
                                << check.describe();
      }
    }
  }
}

// One Engine, 8 host threads, 4 streams (two threads per stream), mixed shapes and paths at
// once: every output within its bounds, and where the plan's arithmetic is deterministic (no
// split-K atomics) bit for bit the output a lone call gave.
TEST(PlanGpu, EightThreadsOnFourStreamsGiveExactResults) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed + 1);
  Engine engine(0);
  struct Job {
    const char* scheme;
    std::int64_t m, n, k;
  };
  const Job jobs[] = {{"w4a16", 1, 4096, 4096},   {"w4a16", 64, 1280, 2048},
                      {"w4a16", 300, 640, 2048},  {"w8a8-int8", 96, 640, 2048},
                      {"mxfp4-a16", 7, 2880, 2880}, {"w8a8-fp8", 256, 1024, 2048},
                      {"w4a16-zp", 33, 640, 4096}, {"nvfp4", 16, 1024, 2048}};
  std::vector<std::unique_ptr<Stream>> streams;
  for (int s = 0; s < 4; ++s) streams.push_back(std::make_unique<Stream>());
  struct Thread {
    Weight w;
    Call call;
    runtime::DeviceBuffer out;
    std::vector<double> alone;  // a lone call's output
    bool deterministic = false;
    std::atomic<int> failures{0};
    std::string first_failure;
  };
  std::vector<std::unique_ptr<Thread>> threads;
  for (int t = 0; t < 8; ++t) {
    auto th = std::make_unique<Thread>();
    const Job& job = jobs[t];
    th->w = make_weight(engine, job.scheme, job.n, job.k, rng);
    th->call = make_call(th->w, job.m, rng);
    th->out = runtime::DeviceBuffer(static_cast<std::size_t>(job.m * job.n) *
                                    th->w.scheme.output.storage_bytes());
    const GemmPlan plan = engine.plan(
        gemm_problem(th->w.prepared, job.m, formats::bf16, th->w.scheme.output), th->w.prepared);
    th->deterministic = plan.choice_for(job.m).kernel.find("split_k=true") == std::string::npos;
    // The lone call (also plans and sizes the workspace of its stream: the threads then only run).
    th->out.fill_bytes(0xFF);
    CUstream stream = streams[t % 4]->stream;
    engine.gemm({th->call.a.as<void>(), job.m, job.k, job.k, formats::bf16}, th->w.prepared,
                {th->out.as<void>(), job.m, job.n, job.n, th->w.scheme.output}, stream);
    streams[t % 4]->synchronize();
    th->alone = check::read_device_values(th->out, th->w.scheme.output, th->call.expected.size());
    const test::OutputCheck check =
        test::check_output(th->alone, th->call.expected, th->call.bounds, job.n);
    ASSERT_TRUE(check.ok()) << job.scheme << " alone: " << check.describe();
    threads.push_back(std::move(th));
  }
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t)
    workers.emplace_back([&, t] {
      Thread& th = *threads[t];
      const Job& job = jobs[t];
      const Stream& stream = *streams[t % 4];
      for (int iteration = 0; iteration < 20; ++iteration) {
        engine.gemm({th.call.a.as<void>(), job.m, job.k, job.k, formats::bf16}, th.w.prepared,
                    {th.out.as<void>(), job.m, job.n, job.n, th.w.scheme.output}, stream.stream);
        stream.synchronize();
        const std::vector<double> got =
            check::read_device_values(th.out, th.w.scheme.output, th.call.expected.size());
        const test::OutputCheck check =
            test::check_output(got, th.call.expected, th.call.bounds, job.n);
        const bool same = !th.deterministic || got == th.alone;
        if ((!check.ok() || !same) && th.failures++ == 0)
          th.first_failure = "iteration " + std::to_string(iteration) + ": " + check.describe() +
                             (same ? "" : "; differs from the lone call");
      }
    });
  for (std::thread& worker : workers) worker.join();
  for (int t = 0; t < 8; ++t)
    EXPECT_EQ(threads[t]->failures.load(), 0)
        << jobs[t].scheme << " M=" << jobs[t].m << " (stream " << t % 4
        << ", seed " << seed << "): " << threads[t]->first_failure;
}

// A plan for an M range holds one choice per power-of-two bucket and serves every M in it.
TEST(PlanGpu, RangePlansServeEveryBucket) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed + 2);
  Engine engine(0);
  Stream stream;
  const Weight w = make_weight(engine, "w4a16", 1280, 2048, rng);
  GemmProblem problem = gemm_problem(w.prepared, 1, formats::bf16, formats::bf16);
  problem.m_max = 300;
  const GemmPlan plan = engine.warm_up(problem, w.prepared, stream.stream);
  EXPECT_EQ(plan.choices().size(), 10u);  // 1, 2, 4, ..., 256, and 257..300
  std::printf("%s\n", plan.to_string().c_str());
  for (std::int64_t m : {1, 3, 9, 16, 17, 100, 129, 300}) {
    SCOPED_TRACE("M=" + std::to_string(m) + " seed " + std::to_string(seed));
    Call call = make_call(w, m, rng);
    runtime::DeviceBuffer out(static_cast<std::size_t>(m * 1280) * 2);
    out.fill_bytes(0xFF);
    engine.run(plan, {call.a.as<void>(), m, 2048, 2048, formats::bf16}, w.prepared,
               {out.as<void>(), m, 1280, 1280, formats::bf16}, stream.stream);
    stream.synchronize();
    const test::OutputCheck check = check_c(out, w, call);
    EXPECT_TRUE(check.ok()) << check.describe() << " (" << plan.choice_for(m).candidate << ")";
  }
}

// SM90 holds a weight once where the M range reaches the wgmma family: the decode kernel and
// dequantize + cuBLAS read the wgmma order (its memory is the mma layout's, one copy), the
// decode plan says so, and both paths and Engine::dequantize give the right values (the latter
// bit for bit: each value rounded once to bf16).
TEST(PlanGpu, Sm90KeepsOneLayoutForDecodeAndPrefill) {
  QGEMM_REQUIRE_GPU();
  if (test::device_arch() != jit::Arch::sm_90a) GTEST_SKIP() << "the wgmma order is SM90's";
  const test::ScopedEnv by_default("QGEMM_WGMMA_ORDER_READERS", nullptr);
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed + 7);
  Engine engine(0);
  Stream stream;
  const std::int64_t n = 1280, k = 2048;
  const Weight w = make_weight(engine, "w4a16", n, k, rng);  // max_rows 65536
  const QuantWeight decode_only = engine.prepare_weight(w.packed, w.scheme.activation, 0.0, 8);
  EXPECT_EQ(w.prepared.device_bytes(), decode_only.device_bytes())
      << "the whole range holds one layout, as a decode-only weight does";
  for (const auto& [m, candidate] : std::vector<std::pair<std::int64_t, std::string>>{
           {1, ""}, {1, "decode"}, {5, ""}, {16, "decode"}, {64, "qdq"}, {256, ""}}) {
    SCOPED_TRACE("M=" + std::to_string(m) + " " + candidate + " seed " + std::to_string(seed));
    GemmProblem problem = gemm_problem(w.prepared, m, formats::bf16, formats::bf16);
    problem.candidate = candidate;
    const GemmPlan plan = engine.plan(problem, w.prepared, stream.stream);
    const std::string kernel = plan.choice_for(m).kernel;
    if (kernel.find("dense_decode") != std::string::npos || candidate == "qdq")
      EXPECT_NE(kernel.find("order=wgmma"), std::string::npos) << kernel;
    if (candidate == "decode") EXPECT_NE(kernel.find("dense_decode"), std::string::npos) << kernel;
    Call call = make_call(w, m, rng);
    runtime::DeviceBuffer out(static_cast<std::size_t>(m * n) * 2);
    out.fill_bytes(0xFF);
    engine.run(plan, {call.a.as<void>(), m, k, k, formats::bf16}, w.prepared,
               {out.as<void>(), m, n, n, formats::bf16}, stream.stream);
    stream.synchronize();
    const test::OutputCheck check = check_c(out, w, call);
    EXPECT_TRUE(check.ok()) << check.describe() << " (" << kernel << ")";
  }
  runtime::DeviceBuffer dense(static_cast<std::size_t>(n * k) * 2);
  dense.fill_bytes(0xFF);
  engine.dequantize(w.prepared, {dense.as<void>(), n, k, k, formats::bf16}, stream.stream);
  stream.synchronize();
  const auto got = dense.to_vector<std::uint16_t>(static_cast<std::size_t>(n * k));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != static_cast<std::uint16_t>(encode(formats::bf16, w.values[i])) && ++wrong <= 4)
      ADD_FAILURE() << "dequantize: element " << i << " is 0x" << std::hex << got[i];
  EXPECT_EQ(wrong, 0u);
}

// Run checks its arguments against the plan, and a caller's workspace serves.
TEST(PlanGpu, RunRefusesWhatThePlanDoesNotDescribe) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 3);
  Engine engine(0);
  Stream stream, other;
  const Weight w = make_weight(engine, "w4a16", 640, 1024, rng);
  const Weight v = make_weight(engine, "w4a16", 640, 1024, rng);
  const GemmPlan plan =
      engine.plan(gemm_problem(w.prepared, 64, formats::bf16, formats::bf16), w.prepared,
                  stream.stream);
  Call call = make_call(w, 64, rng);
  runtime::DeviceBuffer out(64 * 640 * 4);
  const DeviceMatrix a{call.a.as<void>(), 64, 1024, 1024, formats::bf16};
  const DeviceMatrix c{out.as<void>(), 64, 640, 640, formats::bf16};
  auto expect_invalid = [](auto&& call_it, const char* words) {
    try {
      call_it();
      ADD_FAILURE() << "accepted; expected an error about " << words;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::InvalidArgument) << error.what();
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
  };
  expect_invalid([&] { engine.run(plan, {a.data, 65, 1024, 1024, formats::bf16}, w.prepared, {c.data, 65, 640, 640, formats::bf16}, stream.stream); },
                 "the plan serves M in");
  expect_invalid([&] { engine.run(plan, {a.data, 64, 1024, 1024, formats::fp16}, w.prepared, c, stream.stream); },
                 "the plan takes bf16");
  expect_invalid([&] { engine.run(plan, a, v.prepared, c, stream.stream); }, "another prepared weight");
  expect_invalid([&] { engine.run(plan, {static_cast<char*>(a.data) + 2, 64, 1024, 1024, formats::bf16}, w.prepared, c, stream.stream); },
                 "aligned");
  expect_invalid([&] { engine.run(plan, a, w.prepared, {c.data, 64, 640, 640, formats::fp32}, stream.stream); },
                 "the plan writes bf16");
  if (plan.workspace_bytes() > 0) {
    expect_invalid([&] { engine.run(plan, a, w.prepared, c, other.stream); }, "workspace");
    runtime::DeviceBuffer small(256);
    expect_invalid([&] { engine.run(plan, a, w.prepared, c, other.stream, nullptr, {small.as<void>(), 256}); },
                   "Workspace");
  }
  // A caller's workspace, zeroed once, serves a stream the engine never saw.
  runtime::DeviceBuffer workspace(plan.workspace_bytes() + 256);
  workspace.fill_bytes(0);
  out.fill_bytes(0xFF);
  engine.run(plan, a, w.prepared, c, other.stream, nullptr,
             {workspace.as<void>(), workspace.bytes()});
  other.synchronize();
  const test::OutputCheck check = check_c(out, w, call);
  EXPECT_TRUE(check.ok()) << check.describe();
}

// The negative control of the element-wise check: a correct M = 4096, N = 640 output passes,
// and the same output with one 16 x 8 tile zeroed fails it (128 of 2.6 M elements).
TEST(PlanGpu, ElementwiseBoundCatchesAZeroedTile) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed + 4);
  Engine engine(0);
  const Weight w = make_weight(engine, "w4a16", 640, 1024, rng);
  const Call call = make_call(w, 4096, rng);
  runtime::DeviceBuffer out(4096 * 640 * 2);
  out.fill_bytes(0xFF);
  engine.gemm({call.a.as<void>(), 4096, 1024, 1024, formats::bf16}, w.prepared,
              {out.as<void>(), 4096, 640, 640, formats::bf16}, nullptr);
  std::vector<double> got = check::read_device_values(out, formats::bf16, call.expected.size());
  const test::OutputCheck good = test::check_output(got, call.expected, call.bounds, 640);
  EXPECT_TRUE(good.ok()) << good.describe();
  const std::int64_t row0 = 2048 + 16, col0 = 320 + 8;
  for (std::int64_t r = row0; r < row0 + 16; ++r)
    for (std::int64_t c = col0; c < col0 + 8; ++c) got[static_cast<std::size_t>(r * 640 + c)] = 0;
  const test::OutputCheck bad = test::check_output(got, call.expected, call.bounds, 640);
  EXPECT_FALSE(bad.ok());
  EXPECT_GE(bad.outside, 100u) << "a zeroed tile of 128 elements must show: " << bad.describe();
  EXPECT_EQ(bad.first_row, row0);
  std::printf("zeroed 16x8 tile: %zu of 128 elements outside their bound; relative Frobenius "
              "error %.2e (the correct output's: %.2e)\n",
              bad.outside, bad.relative, good.relative);
}

}  // namespace
}  // namespace qgemm
