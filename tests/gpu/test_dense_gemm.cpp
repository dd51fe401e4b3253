// The mma.sync dense GEMM on the GPU against the CPU reference: every bf16/fp16-activation
// scheme this path serves × M ∈ {1, 3, 16, 17, 64, 255, 1024, 4096} × unaligned N and K.
// Fresh random data every run (the seed is printed), outputs poisoned before each launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "check/error_bounds.hpp"
#include "dispatch/mma_family.hpp"
#include "dispatch/wgmma_family.hpp"
#include "gemm_check.hpp"
#include "jit/catalog.hpp"
#include "jit/kernel_spec.hpp"
#include "layout/mma_repack_gpu.hpp"
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

bool have_gpu() {
  std::string why;
  if (!runtime::Driver::available(&why) || runtime::device_count() == 0) {
    std::printf("no usable GPU: %s\n", why.empty() ? "no CUDA device" : why.c_str());
    return false;
  }
  return true;
}

// Relative tolerance: the kernel rounds each dequantized weight to the activation type and
// the result to the output type (half an ulp each, relative), on top of the exact reference.
double tolerance(const Format& activation, const Format& output) {
  auto unit = [](const Format& f) {
    return f == formats::fp32 ? 0.0 : std::ldexp(1.0, -(f.mantissa_bits + 1));
  };
  return unit(activation) + unit(output) + 1e-6;
}

struct Case {
  std::string scheme;
  std::vector<std::int64_t> ms;
  std::int64_t n, k;
};

// K values of the issue (640, 10944, 2880) where the scheme's groups (weight and activation)
// divide them.
std::int64_t pick_k(const Scheme& s) {
  for (std::int64_t k : {2880, 10944, 640, 1024})
    if ((s.weight.granularity != WeightGranularity::Group || k % s.weight.group == 0) &&
        (s.activation.group == 0 || k % s.activation.group == 0))
      return k;
  return 1024;
}

std::vector<Case> cases() {
  const std::vector<std::int64_t> decode_to_medium = {1, 3, 16, 17, 64, 255};
  const std::vector<std::string> schemes = {
      "w4a16",
      "w4a16-zp",
      "w2a16",
      "w3a16",
      "w8a16",
      "gptq-w4a16-g128",
      "awq-w4a16-g128",
      "mxfp4-a16",
      "nvfp4-a16",
      "w=int4:g128:s=bf16;a=bf16;o=bf16",
      "w=int8:ch:s=fp32;a=bf16;o=fp32",
      "w=e4m3:ch:s=fp32;a=bf16;o=bf16",
      "w=e4m3:b128x128:s=fp32;a=bf16;o=bf16",
      "w=e5m2:g64:s=bf16;a=fp16;o=fp16",
      "w=e3m2:g32:s=e8m0;a=bf16;o=bf16",
      "w=e2m3:g32:s=e8m0;a=bf16;o=bf16",
      "w=ternary:t:s=fp32;a=bf16;o=bf16",
      "w=uint1:g64:s=bf16:zp=int;a=bf16;o=bf16",
      "w=uint5:g128:s=bf16:zp=int;a=bf16;o=bf16",
      "w=uint6:g128:s=fp16:zp=float;a=fp16;o=fp16",
      "w=uint7:ch:s=fp32:zp=mid;a=bf16;o=bf16",
      "w=int3:g32:s=bf16;a=bf16;o=bf16",
  };
  std::vector<Case> out;
  // QGEMM_GPU_TEST_SUBSET=1: a few cases covering both dequant paths, split-K, zero points and
  // float formats, for slow tools (compute-sanitizer).
  if (const char* subset = std::getenv("QGEMM_GPU_TEST_SUBSET"); subset && *subset == '1') {
    for (const char* text : {"w4a16", "w4a16-zp", "mxfp4-a16", "w=ternary:t:s=fp32;a=bf16;o=bf16"})
      out.push_back({text, {1, 16, 17, 64, 255}, 640, 1024});
    return out;
  }
  const std::int64_t ns[] = {4000, 5472, 640};
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    Scheme s = parse_scheme(schemes[i]);
    out.push_back({schemes[i], decode_to_medium, ns[i % 3], pick_k(s)});
    // Prefill sizes of every scheme on the narrowest unaligned N (the CPU reference's cost).
    out.push_back({schemes[i], {1024, 4096}, 640, pick_k(s)});
  }
  out.push_back({"w4a16", {1024, 4096}, 640, 640});
  out.push_back({"nvfp4-a16", {1024}, 5472, 640});
  out.push_back({"w=int8:ch:s=fp32;a=bf16;o=fp32", {1024}, 4000, 2880});
  return out;
}

std::vector<std::uint16_t> to_codes(const Format& f, const std::vector<double>& values) {
  std::vector<std::uint16_t> codes(values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    codes[i] = static_cast<std::uint16_t>(encode(f, values[i]));
  return codes;
}

// The plan a gemm() call with `options` makes, as text (for failure messages).
std::string plan_text(Engine& engine, const QuantWeight& weight, std::int64_t m,
                      const Format& input, const Format& out, const GemmOptions& options = {}) {
  GemmProblem problem = gemm_problem(weight, m, input, out);
  problem.candidate = options.candidate;
  problem.bias = options.bias != nullptr;
  return engine.plan(problem, weight).to_string();
}

// A fresh random A for C = A · Wᵀ (plus a fresh random fp32 bias with `with_bias`), its double
// reference and every element's bound (gemm_check.hpp), ready for any number of GPU runs.
struct ReferenceProblem {
  std::int64_t m = 0;
  std::vector<double> a, expected, bounds;
  runtime::DeviceBuffer a_device, bias_device;
};

ReferenceProblem make_reference(const Scheme& scheme, const PackedWeight& packed,
                                const std::vector<double>& w_ref, std::int64_t m,
                                std::mt19937& rng, bool with_bias) {
  const Format act = scheme.activation.format, out = scheme.output;
  const std::int64_t n = packed.n, k = packed.k;
  ReferenceProblem r;
  r.m = m;
  std::normal_distribution<double> normal(0.0, 1.0);
  r.a.resize(static_cast<std::size_t>(m * k));
  for (double& x : r.a) x = round_to(act, normal(rng));
  r.expected = reference::matmul_nt(r.a.data(), w_ref.data(), m, n, k);
  if (with_bias) {
    std::vector<float> bias(static_cast<std::size_t>(n));
    for (float& b : bias) b = static_cast<float>(normal(rng));
    for (std::int64_t row = 0; row < m; ++row)
      for (std::int64_t c = 0; c < n; ++c)
        r.expected[static_cast<std::size_t>(row * n + c)] += bias[c];
    r.bias_device = runtime::DeviceBuffer::from(bias);
  }
  r.a_device = runtime::DeviceBuffer::from(to_codes(act, r.a));
  r.bounds = test::gemm_bounds(r.a, packed, w_ref, m, test::operand_rounding(scheme.activation, act),
                               out, r.expected);
  return r;
}

// Runs the reference problem on the GPU (output poisoned first) and checks every element
// within its bound.
void expect_matches(Engine& engine, const Scheme& scheme, const QuantWeight& weight,
                    const ReferenceProblem& r, GemmOptions options, const std::string& label) {
  const Format act = scheme.activation.format, out = scheme.output;
  const std::int64_t n = weight.n(), k = weight.k(), m = r.m;
  const bool with_bias = r.bias_device.bytes() != 0;
  SCOPED_TRACE(label + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
               " K=" + std::to_string(k) + (with_bias ? " bias" : ""));
  if (with_bias) options.bias = r.bias_device.as<const float>();
  runtime::DeviceBuffer c_device(static_cast<std::size_t>(m * n) * out.storage_bytes());
  c_device.fill_bytes(0xFF);  // NaN in every output type: an unwritten element fails
  engine.gemm({r.a_device.as<void>(), m, k, k, act}, weight, {c_device.as<void>(), m, n, n, out},
              nullptr, options);
  const test::OutputCheck check =
      test::check_output(check::read_device_values(c_device, out, r.expected.size()), r.expected,
                         r.bounds, n);
  EXPECT_TRUE(check.ok()) << check.describe() << "\n"
                          << plan_text(engine, weight, m, act, out, options);
  EXPECT_LE(check.relative, tolerance(act, out));
  std::printf("%-44s M=%-5lld N=%-5lld K=%-5lld rel=%.3e worst |err|/bound %.3f\n", label.c_str(),
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
              check.relative, check.worst);
}

// Runs C = A · Wᵀ on the GPU for a fresh random A (output poisoned first) and checks every
// element against the double reference of the dequantized weight within its bound
// (gemm_check.hpp). With `with_bias`, a fresh random fp32 bias is added (options.bias is set to
// it).
void expect_matches_reference(Engine& engine, const Scheme& scheme, const PackedWeight& packed,
                              const std::vector<double>& w_ref, const QuantWeight& weight,
                              std::int64_t m, GemmOptions options, std::mt19937& rng,
                              const std::string& label, bool with_bias = false) {
  const ReferenceProblem r = make_reference(scheme, packed, w_ref, m, rng, with_bias);
  expect_matches(engine, scheme, weight, r, options, label);
}

TEST(DenseGemmGpu, MatchesReferenceForEveryScheme) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const std::uint32_t seed = fresh_seed();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);

  struct Prepared {
    Case c;
    Scheme scheme;
    PackedWeight packed;
    QuantWeight weight;
  };
  std::vector<Prepared> prepared;
  for (const Case& c : cases()) {
    Prepared p{c, parse_scheme(c.scheme), {}, {}};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<std::size_t>(c.n * c.k));
    for (float& x : w) x = normal(rng) * 0.05f;
    p.packed = quantize_weight(p.scheme.weight, w.data(), c.n, c.k);
    p.weight = engine.prepare_weight(p.packed);
    prepared.push_back(std::move(p));
  }
  // Compile every kernel the cases need, in parallel, before timing anything.
  {
    std::vector<std::future<void>> compiles;
    for (const Prepared& p : prepared)
      for (std::int64_t m : p.c.ms)
        compiles.push_back(std::async(std::launch::async, [&engine, &p, m] {
          engine.warm_up(gemm_problem(p.weight, m, p.scheme.activation.format, p.scheme.output),
                         p.weight);
        }));
    for (auto& f : compiles) f.get();
  }

  for (const Prepared& p : prepared) {
    const std::vector<double> w_ref = dequantize_weight(p.packed);
    for (std::int64_t m : p.c.ms)
      expect_matches_reference(engine, p.scheme, p.packed, w_ref, p.weight, m, {}, rng,
                               p.c.scheme + " seed=" + std::to_string(seed));
  }
}

// The SM90 wgmma family, every config forced wherever it serves: every 16-bit-activation scheme
// × M ∈ {1, 2, 8, 16, 17, 64, 128, 255} on the unaligned shapes (N 4000 / 5472 / 640 with
// K 2880 / 640 / 10944 in turn), and M ∈ {1024, 4096} on N = 640. Split-K, partial token
// blocks, partial last groups and the K tail of a stage all occur. QGEMM_GPU_TEST_SUBSET=1: a
// few schemes on small shapes (compute-sanitizer).
TEST(WgmmaGemmGpu, EveryConfigMatchesReferenceForEveryScheme) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const dispatch::GpuLimits gpu = dispatch::GpuLimits::of_device(runtime::device_info(0));
  if (gpu.arch != jit::Arch::sm_90a) GTEST_SKIP() << "the wgmma family needs sm_90a";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  const std::uint32_t seed = fresh_seed();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  Engine engine(0);
  const bool subset = std::getenv("QGEMM_GPU_TEST_SUBSET") &&
                      *std::getenv("QGEMM_GPU_TEST_SUBSET") == '1';
  std::vector<Case> wgmma_cases;
  const std::vector<std::int64_t> small_ms = {1, 2, 8, 16, 17, 64, 128, 255};
  const std::int64_t ns[] = {4000, 5472, 640}, ks[] = {2880, 640, 10944};
  std::size_t i = 0;
  for (const Case& c : cases()) {
    if (c.ms.front() != 1 && !subset) continue;  // one entry per scheme (its decode row)
    if (subset) {
      wgmma_cases.push_back({c.scheme, {1, 17, 128}, 640, 2880});
      continue;
    }
    wgmma_cases.push_back({c.scheme, small_ms, ns[i % 3], ks[i % 3]});
    wgmma_cases.push_back({c.scheme, {1024, 4096}, 640, i % 2 ? 640 : 2880});
    ++i;
  }
  struct Run {
    std::size_t weight;
    std::int64_t m;
    std::string config;
  };
  struct Weight {
    std::string text;  // the case's scheme as written (a preset name or the compact form)
    Scheme scheme;
    PackedWeight packed;
    QuantWeight weight;
  };
  std::vector<Weight> weights;
  std::vector<Run> runs;
  for (const Case& c : wgmma_cases) {
    Weight w{c.scheme, parse_scheme(c.scheme), {}, {}};
    std::vector<float> values(static_cast<std::size_t>(c.n * c.k));
    for (float& x : values) x = normal(rng);
    w.packed = quantize_weight(w.scheme.weight, values.data(), c.n, c.k);
    w.weight = engine.prepare_weight(w.packed);
    const layout::MmaWeight meta = layout::mma_metadata(w.packed, layout::FragmentOrder::Wgmma);
    for (std::int64_t m : c.ms)
      for (const auto& config : dispatch::wgmma_configs())
        if (!config.unsupported_reason(m, meta, w.scheme.activation.format, gpu))
          runs.push_back({weights.size(), m, config.name});
    weights.push_back(std::move(w));
  }
  {
    std::vector<std::future<void>> compiles;
    for (const Run& r : runs)
      compiles.push_back(std::async(std::launch::async, [&, r] {
        const Weight& w = weights[r.weight];
        GemmProblem problem =
            gemm_problem(w.weight, r.m, w.scheme.activation.format, w.scheme.output);
        problem.candidate = r.config;
        engine.warm_up(problem, w.weight);
      }));
    for (auto& f : compiles) f.get();
  }
  // One reference per (weight, M), every config checked against it (the double reference of
  // M = 4096 costs seconds on the CPU); M = 17 with a bias.
  std::size_t done = 0;
  for (std::size_t wi = 0; wi < weights.size(); ++wi) {
    const Weight& w = weights[wi];
    const std::vector<double> w_ref = dequantize_weight(w.packed);
    std::optional<ReferenceProblem> reference;
    for (const Run& r : runs) {
      if (r.weight != wi) continue;
      if (!reference || reference->m != r.m)
        reference = make_reference(w.scheme, w.packed, w_ref, r.m, rng, r.m == 17);
      GemmOptions options;
      options.candidate = r.config;
      expect_matches(engine, w.scheme, w.weight, *reference, options,
                     w.text + " config=" + r.config + " seed=" + std::to_string(seed));
      ++done;
    }
  }
  std::printf("%zu wgmma runs checked\n", done);
  EXPECT_GT(done, wgmma_cases.size());
}

// Every decode tile config (the heuristic's and the candidates a bench or tuner may force).
// Every M <= 16 config (streamed and tiled) on each unscaled dequantization (int16, int_f32,
// float16), stored integer and float zero points, per-channel scales and fp16, over the A row
// buckets of the streamed kernel (M = 1, 5, 16; the default config also 2 and 9).
TEST(DenseGemmGpu, EveryDecodeConfigMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  Engine engine(0);
  struct Run {
    std::string scheme_text, config;
    std::int64_t m;
  };
  std::vector<Run> runs;
  std::map<std::string, std::pair<PackedWeight, QuantWeight>> weights;
  for (const char* text :
       {"w4a16", "w=uint3:g128:s=bf16:zp=int;a=fp16;o=fp16", "mxfp4-a16", "w8a16",
        "w=uint6:g64:s=fp16:zp=float;a=fp16;o=fp16", "w=e4m3:ch:s=fp32;a=bf16;o=fp32"}) {
    const Scheme scheme = parse_scheme(text);
    const std::int64_t n = 640, k = 2048;
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
    QuantWeight weight = engine.prepare_weight(packed);
    const layout::MmaWeight meta = layout::mma_metadata(packed);
    weights.emplace(text, std::make_pair(std::move(packed), std::move(weight)));
    for (const auto& config : dispatch::mma_configs()) {
      if (config.name.rfind("decode", 0) != 0) continue;
      GemmProblem forced = gemm_problem(weights.at(text).second, 16, scheme.activation.format,
                                        scheme.output);
      forced.candidate = config.name;
      // A config that cannot serve this weight must say so, never launch.
      if (auto reason =
              config.unsupported_reason(16, meta, scheme.activation.format,
                                        dispatch::GpuLimits::of_device(runtime::device_info(0)))) {
        EXPECT_THROW(engine.warm_up(forced, weights.at(text).second), Error)
            << config.name << ": " << *reason;
        continue;
      }
      const auto ms = config.name == "decode" ? std::vector<std::int64_t>{1, 2, 5, 9, 16}
                                              : std::vector<std::int64_t>{1, 5, 16};
      for (std::int64_t m : ms) runs.push_back({text, config.name, m});
    }
  }
  auto options_of = [](const Run& r) {
    GemmOptions options;
    options.candidate = r.config;
    return options;
  };
  {
    std::vector<std::future<void>> compiles;
    for (const Run& r : runs)
      compiles.push_back(std::async(std::launch::async, [&, r] {
        const Scheme scheme = parse_scheme(r.scheme_text);
        const QuantWeight& weight = weights.at(r.scheme_text).second;
        GemmProblem problem =
            gemm_problem(weight, r.m, scheme.activation.format, scheme.output);
        problem.candidate = r.config;
        engine.warm_up(problem, weight);
      }));
    for (auto& f : compiles) f.get();
  }
  for (const Run& r : runs) {
    const auto& [packed, weight] = weights.at(r.scheme_text);
    expect_matches_reference(engine, parse_scheme(r.scheme_text), packed,
                             dequantize_weight(packed), weight, r.m, options_of(r), rng,
                             r.scheme_text + " config=" + r.config + " seed=" + std::to_string(seed));
  }
}

// The dequantize + cuBLAS path (forced at every M, with and without bias, each output type:
// cuBLAS writing C directly and through fp32 sums), the tiled prefill kernel it replaces at
// large M (forced, so that it stays tested), and weights only dequant + cuBLAS serves, chosen by
// the heuristic: groups of 48 (no tile config's BK), and weights the mma layout cannot hold
// (groups of 8, 64x8 blocks: kept canonical, dequantized in N chunks that start on scale rows).
TEST(DenseGemmGpu, DequantCublasAndPrefillMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  Engine engine(0);
  struct Run {
    std::string config;
    std::int64_t m;
    bool bias;
  };
  const std::vector<Run> forced = {{"qdq", 1, false},     {"qdq", 17, true},
                                   {"qdq", 300, false},   {"qdq", 300, true},
                                   {"prefill", 300, false}, {"prefill", 1024, true}};
  for (const char* text :
       {"w4a16", "w=uint4:g128:s=bf16;a=bf16;o=fp16", "w=uint6:g128:s=fp16:zp=float;a=fp16;o=fp16",
        "nvfp4-a16", "w=e4m3:b128x128:s=fp32;a=bf16;o=bf16", "w=int8:ch:s=fp32;a=bf16;o=fp32",
        "w=uint4:g48:s=bf16:zp=int;a=bf16;o=bf16", "w=uint4:g8:s=bf16:zp=int;a=bf16;o=bf16",
        "w=e4m3:b64x8:s=fp32;a=bf16;o=fp32"}) {
    const Scheme scheme = parse_scheme(text);
    const std::int64_t n = 4000, k = 3840;  // divisible by every group below (128, 48, 8)
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
    const QuantWeight weight = engine.prepare_weight(packed);
    const std::vector<double> w_ref = dequantize_weight(packed);
    const std::string label = std::string(text) + " seed=" + std::to_string(seed);
    const bool only_cublas =
        scheme.weight.group == 48 || layout::mma_unsupported_reason(scheme.weight);
    if (only_cublas) {
      for (std::int64_t m : {1, 64, 300}) {
        EXPECT_NE(plan_text(engine, weight, m, scheme.activation.format, scheme.output)
                      .find("cuBLAS"),
                  std::string::npos);
        expect_matches_reference(engine, scheme, packed, w_ref, weight, m, {}, rng, label,
                                 m == 64);
      }
      continue;
    }
    for (const Run& r : forced) {
      GemmOptions options;
      options.candidate = r.config;
      expect_matches_reference(engine, scheme, packed, w_ref, weight, r.m, options, rng,
                               label + " config=" + r.config, r.bias);
    }
  }
}

// Quantized activations (the A8 and A4 presets, a static per-tensor scale given and taken from
// the tensor, MX activations against int weights) through both entry points: bf16 A quantized
// on the GPU (the weight prepared with the scheme's activation part; int8 per token from M = 17
// on the 8-bit mma, "medium-a8" to M = 128 and "prefill-a8" to 256), and the host quantizer's
// codes and scales passed as a DeviceActivation. The reference multiplies the host's exact
// dequantization of both, so the GPU's quantizer must agree with the host's code for code.
TEST(DenseGemmGpu, QuantizedActivationsMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  Engine engine(0);
  struct Case {
    std::string scheme;
    double static_scale;
  };
  std::vector<Case> cases = {
      {"w4a8-fp8", 0},
      {"w8a8-fp8", 0},
      {"fp8-block", 0},
      {"w8a8-int8", 0},
      {"mxfp4-a8", 0},
      {"mxfp8-mxfp4", 0},
      {"nvfp4", 0},
      {"bitnet", 0},
      {"w=int4:g128:s=bf16;a=e4m3:t;o=bf16", 0.02},
      {"w=uint4:g128:s=fp16:zp=int;a=int8:t;o=fp16", 0},
      {"w=uint8:ch:s=fp32:zp=mid;a=e4m3:mx:s=e8m0;o=fp32", 0},
  };
  std::vector<std::int64_t> ms = {1, 3, 16, 17, 64, 255, 1024};
  // QGEMM_GPU_TEST_SUBSET=1 (the memory checker): four schemes (token, int8 on the 8-bit mma
  // from M = 17, MX, NV), fewer M.
  const char* subset_env = std::getenv("QGEMM_GPU_TEST_SUBSET");
  const bool subset = subset_env && *subset_env == '1';
  if (subset) {
    cases = {cases[0], cases[3], cases[5], cases[6]};
    ms = {1, 17, 64};
  }
  const std::int64_t ns[] = {4000, 5472, 640};
  std::normal_distribution<double> normal(0.0, 1.0);
  // Each case on its N at every M of `ms`, then (full runs) at M = 4096 on N = 640, which
  // bounds the CPU reference's cost.
  for (std::size_t pass = 0; pass < (subset ? 1 : 2) * cases.size(); ++pass) {
    const std::size_t i = pass % cases.size();
    const bool prefill = pass >= cases.size();
    const Scheme scheme = parse_scheme(cases[i].scheme);
    const std::int64_t n = prefill ? 640 : ns[i % 3], k = pick_k(scheme);
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = static_cast<float>(normal(rng) * 0.05);
    const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
    const QuantWeight weight =
        engine.prepare_weight(packed, scheme.activation, cases[i].static_scale);
    const std::vector<double> w_ref = dequantize_weight(packed);
    const Format type = jit::activation_operand_format(scheme.activation), out = scheme.output;
    for (std::int64_t m : prefill ? std::vector<std::int64_t>{4096} : ms) {
      const std::string label = cases[i].scheme + " M=" + std::to_string(m) +
                                " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                " seed=" + std::to_string(seed);
      SCOPED_TRACE(label);
      std::vector<float> a(static_cast<std::size_t>(m * k));
      std::vector<std::uint16_t> a_bits(a.size());
      for (std::size_t j = 0; j < a.size(); ++j) {
        a_bits[j] = static_cast<std::uint16_t>(encode(formats::bf16, normal(rng)));
        a[j] = static_cast<float>(decode(formats::bf16, a_bits[j]));
      }
      const PackedActivation quantized =
          quantize_activation(scheme.activation, a.data(), m, k, cases[i].static_scale);
      const std::vector<double> a_ref = dequantize_activation(quantized);
      const std::vector<double> expected =
          reference::matmul_nt(a_ref.data(), w_ref.data(), m, n, k);
      const std::vector<double> bounds =
          test::gemm_bounds(a_ref, packed, w_ref, m, test::operand_rounding(scheme.activation, type),
                            out, expected);
      runtime::DeviceBuffer a_device = runtime::DeviceBuffer::from(a_bits);
      runtime::DeviceBuffer codes = runtime::DeviceBuffer::from(quantized.codes);
      runtime::DeviceBuffer scales = runtime::DeviceBuffer::from(quantized.scales);
      runtime::DeviceBuffer c_device(static_cast<std::size_t>(m * n) * out.storage_bytes());
      const DeviceMatrix c{c_device.as<void>(), m, n, n, out};
      // The 8-bit mma's prefill config, the default only for 128 < M <= 256, is also forced at
      // the other M where it serves (int8 per token on this GPU).
      GemmOptions prefill_a8;
      prefill_a8.candidate = "prefill-a8";
      bool a8_serves = m > 16;
      try {
        GemmProblem forced = gemm_problem(weight, m, formats::bf16, out);
        forced.candidate = prefill_a8.candidate;
        if (a8_serves) engine.warm_up(forced, weight);
      } catch (const Error&) {
        a8_serves = false;
      }
      enum Entry { kGpuQuant, kHostQuant, kPrefillA8 };  // bf16 A, DeviceActivation, forced
      for (const Entry entry : {kGpuQuant, kHostQuant, kPrefillA8}) {
        const bool on_gpu = entry != kHostQuant;
        if (entry == kPrefillA8 && !a8_serves) continue;
        c_device.fill_bytes(0xFF);
        if (entry == kPrefillA8)
          engine.gemm({a_device.as<void>(), m, k, k, formats::bf16}, weight, c, nullptr,
                      prefill_a8);
        else if (on_gpu)
          engine.gemm({a_device.as<void>(), m, k, k, formats::bf16}, weight, c, nullptr);
        else
          engine.gemm(DeviceActivation{scheme.activation, codes.as<void>(), scales.as<void>(), m, k,
                                       quantized.tensor_scale},
                      weight, c, nullptr);
        const test::OutputCheck check = test::check_output(
            check::read_device_values(c_device, out, expected.size()), expected, bounds, n);
        const double relative = check.relative;
        EXPECT_TRUE(check.ok()) << (on_gpu ? "bf16 A: " : "DeviceActivation: ") << check.describe()
                                << "\n"
                                << plan_text(engine, weight, m, formats::bf16, out,
                                             entry == kPrefillA8 ? prefill_a8 : GemmOptions{});
        EXPECT_LE(relative, tolerance(type, out));
        std::printf("%-52s %s rel=%.3e tol=%.3e\n", label.c_str(),
                    entry == kPrefillA8 ? "prefill-a8"
                    : on_gpu            ? "gpu-quant "
                                        : "host-quant",
                    relative, tolerance(type, out));
      }
    }
  }
}

// --- partial last groups ----------------------------------------------------------------------

// Multiplies the last partial cell along K of every other row by `factor`: the short group's
// scale then differs from its neighbours', so that a kernel using another group's scale (or
// none) there is far outside the bounds.
void scale_tail(std::vector<float>& x, std::int64_t rows, std::int64_t cols, std::int64_t group,
                float factor) {
  for (std::int64_t r = 0; r < rows; r += 2)
    for (std::int64_t c = (cols - 1) / group * group; c < cols; ++c)
      x[static_cast<std::size_t>(r * cols + c)] *= factor;
}

// Partial last groups (issue #14, item 5): K that the scheme's groups do not divide, weight
// groups and activation groups (g<G>, MX, NV) alike, through Engine::gemm at decode (M = 1, 7,
// 16), tiled (M = 64) and large (M = 256, 1024) sizes: the heuristic's choice, and at M = 7,
// 64 and 1024 every tile config that serves (forced). Quantized activations go in both ways
// (bf16 quantized on the GPU; the host's codes as a DeviceActivation, heuristic only). Every output
// element is compared with the CPU reference within check::backend_error_bounds; outputs are
// poisoned before every launch. The shapes:
//   w4a16 and GPTQ at K = 2880 = 22.5 x 128; MXFP4 K = 2896 = 90.5 x 32; NVFP4 K = 2896 (16 | K,
//   32 ∤ K) and 2904 (181.5 x 16); fp8-block K = 2880 (128x128 weight blocks, 1x128 activation
//   groups); int8 activations on the 8-bit mma with groups of 128 (= BK) and 64 (< BK).
TEST(DenseGemmGpu, PartialGroupsMatchReferenceElementwise) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  const std::uint32_t seed = fresh_seed();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);
  struct Case {
    std::string scheme;
    std::int64_t k;
  };
  const std::vector<Case> cases = {
      {"w4a16", 2880},
      {"gptq-w4a16-g128", 2880},
      {"w8a16", 2880},
      {"mxfp4-a16", 2896},
      {"nvfp4-a16", 2896},
      {"nvfp4-a16", 2904},
      {"w=uint6:g64:s=fp16:zp=float;a=fp16;o=fp16", 2888},
      {"w=int3:g32:s=bf16;a=bf16;o=fp32", 2888},
      {"w=e5m2:g64:s=bf16;a=fp16;o=fp16", 2888},
      {"fp8-block", 2880},
      {"nvfp4", 2904},
      {"mxfp8-mxfp4", 2896},
      {"w4a8-fp8", 2880},
      {"w=uint4:g128:s=fp16:zp=int;a=int8:t;o=fp16", 2880},
      {"w=uint4:g64:s=bf16:zp=int;a=int8:tok;o=bf16", 2848},
  };
  const std::int64_t n = 640;
  const std::vector<std::int64_t> ms = {1, 7, 16, 64, 256, 1024};
  auto forced_configs = [](std::int64_t m) -> std::vector<std::string> {
    if (m == 7) return {"decode", "decode-k64", "decode-s4", "decode-w8", "decode-tiled"};
    if (m == 64) return {"medium", "medium-a8", "medium-a8-m32"};
    if (m == 1024)
      return {"prefill", "prefill-n256", "prefill-m256", "prefill-a8", "qdq"};
    return {};
  };
  auto unit = [](const Format& f) {
    return f == formats::fp32 ? 0.0 : std::ldexp(1.0, -(f.mantissa_bits + 1));
  };

  struct Prepared {
    Case c;
    Scheme scheme;
    PackedWeight packed;
    QuantWeight weight;
    std::vector<double> w_values;
    Format input;  // what A is given in: the scheme's 16-bit type, or bf16 to be quantized
    std::vector<std::pair<std::int64_t, std::string>> runs;  // (M, config; "" = heuristic)
  };
  std::vector<Prepared> prepared;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Case& c : cases) {
    Prepared p{c, parse_scheme(c.scheme), {}, {}, {}, {}, {}};
    const WeightQuant& q = p.scheme.weight;
    const std::int64_t group = q.granularity == WeightGranularity::Block ? q.block_k : q.group;
    const std::int64_t act_group = p.scheme.activation.group;
    EXPECT_TRUE(c.k % group != 0 || (act_group > 0 && c.k % act_group != 0) || c.k % 32 != 0)
        << c.scheme << " K=" << c.k << ": no partial group";
    std::vector<float> w(static_cast<std::size_t>(n * c.k));
    for (float& x : w) x = normal(rng) * 0.02f;
    scale_tail(w, n, c.k, group, 4.0f);
    p.packed = quantize_weight(q, w.data(), n, c.k);
    p.w_values = dequantize_weight(p.packed);
    p.weight = engine.prepare_weight(p.packed, p.scheme.activation);
    p.input = p.scheme.activation.is_quantized() ? formats::bf16 : p.scheme.activation.format;
    prepared.push_back(std::move(p));
  }
  {  // Every run's kernels, compiled in parallel before anything runs. The heuristic must serve
     // every M; a forced config that cannot serve a weight says so and is left out.
    struct Compile {
      Prepared* p;
      std::int64_t m;
      std::string config;
      std::future<std::string> refusal;  // empty: compiled
    };
    std::vector<Compile> compiles;
    for (Prepared& p : prepared)
      for (std::int64_t m : ms) {
        std::vector<std::string> configs = forced_configs(m);
        configs.insert(configs.begin(), "");
        for (const std::string& config : configs)
          compiles.push_back(
              {&p, m, config, std::async(std::launch::async, [&engine, &p, m, config] {
                 GemmProblem problem = gemm_problem(p.weight, m, p.input, p.scheme.output);
                 problem.candidate = config;
                 try {
                   engine.warm_up(problem, p.weight);
                 } catch (const Error& error) {
                   if (config.empty()) throw;
                   return std::string(error.what());
                 }
                 return std::string();
               })});
      }
    for (Compile& compile : compiles) {
      const std::string refusal = compile.refusal.get();
      if (refusal.empty())
        compile.p->runs.push_back({compile.m, compile.config});
      else
        std::printf("%s K=%lld M=%lld config %s: not served (%s)\n", compile.p->c.scheme.c_str(),
                    static_cast<long long>(compile.p->c.k), static_cast<long long>(compile.m),
                    compile.config.c_str(), refusal.c_str());
    }
  }

  for (const Prepared& p : prepared) {
    const Scheme& scheme = p.scheme;
    const std::int64_t k = p.c.k;
    const ActivationQuant& aq = scheme.activation;
    const Format type = aq.is_quantized() ? jit::activation_operand_format(aq) : aq.format;
    const check::OperandRounding rounding = test::operand_rounding(aq, type);
    for (std::int64_t m : ms) {
      // Fresh A in the input type, its last partial group larger in every other row.
      std::vector<float> a(static_cast<std::size_t>(m * k));
      for (float& x : a) x = normal(rng);
      if (aq.group > 0) scale_tail(a, m, k, aq.group, 4.0f);
      std::vector<std::uint16_t> a_bits(a.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        a_bits[i] = static_cast<std::uint16_t>(encode(p.input, a[i]));
        a[i] = static_cast<float>(decode(p.input, a_bits[i]));
      }
      const PackedActivation quantized = quantize_activation(aq, a.data(), m, k);
      const std::vector<double> a_values = dequantize_activation(quantized);
      const std::vector<double> expected = reference::gemm(scheme, quantized, p.packed);
      const std::vector<double> bounds =
          test::gemm_bounds(a_values, p.packed, p.w_values, m, rounding, scheme.output, expected);
      runtime::DeviceBuffer a_device = runtime::DeviceBuffer::from(a_bits);
      runtime::DeviceBuffer codes, scales;
      if (aq.is_quantized()) {
        codes = runtime::DeviceBuffer::from(quantized.codes);
        scales = runtime::DeviceBuffer::from(quantized.scales);
      }
      runtime::DeviceBuffer c_device(static_cast<std::size_t>(m * n) *
                                     scheme.output.storage_bytes());
      const DeviceMatrix c{c_device.as<void>(), m, n, n, scheme.output};
      for (const auto& [run_m, config] : p.runs) {
        if (run_m != m) continue;
        GemmOptions options;
        options.candidate = config;
        for (const bool host_codes : {false, true}) {
          // The host's codes go in with the heuristic's choice (the forced configs are about
          // the GEMM kernels, which see the same operand either way).
          if (host_codes && (!aq.is_quantized() || !config.empty())) continue;
          const std::string label =
              p.c.scheme + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
              " K=" + std::to_string(k) + " config=" + (config.empty() ? "heuristic" : config) +
              (host_codes ? " DeviceActivation" : "") + " seed=" + std::to_string(seed);
          SCOPED_TRACE(label);
          c_device.fill_bytes(0xFF);  // NaN in every output type: an unwritten element fails
          if (host_codes)
            engine.gemm(DeviceActivation{aq, codes.as<void>(), scales.as<void>(), m, k,
                                         quantized.tensor_scale},
                        p.weight, c, nullptr, options);
          else
            engine.gemm({a_device.as<void>(), m, k, k, p.input}, p.weight, c, nullptr, options);
          const test::OutputCheck check = test::check_output(
              check::read_device_values(c_device, scheme.output, expected.size()), expected, bounds, n);
          EXPECT_TRUE(check.ok()) << check.describe() << "\n"
                                  << plan_text(engine, p.weight, m, p.input, scheme.output, options);
          const double worst = check.worst;
          std::printf("%-92s worst |err|/bound %.3f\n", label.c_str(), worst);
        }
      }
    }
  }
}

// The device repack against its host twin, word for word and scale for scale; then its speed on
// a Llama-3-70B-sized weight (counted as canonical bytes read + prepared bytes written).
TEST(MmaRepackGpu, MatchesTheHostTwinAndReportsItsBandwidth) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const runtime::DeviceInfo info = runtime::device_info(0);
  const jit::Arch arch = jit::arch_for_device(info.major, info.minor);
  runtime::use_primary_context(0);
  for (const char* text :
       {"w4a16", "w4a16-zp", "w2a16", "w3a16", "w8a16", "mxfp4-a16", "nvfp4-a16", "fp8-block",
        "bitnet", "w=uint6:g128:s=fp16:zp=float;a=fp16", "w=int3:g32:s=bf16:zp=float;a=bf16",
        "w=uint1:g64:s=bf16:zp=int;a=bf16", "w=int4:g64:s=fp32;a=bf16"}) {
    for (const bool partial : {false, true}) {
      const Scheme scheme = parse_scheme(text);
      // partial: K = 2904, a partial last group of every group size here (88 of 128, 24 of 64
      // and 32, 8 of 16) and K padding in the last k16 block.
      const std::int64_t n = 64 * 3 + 21,
                         k = partial                                                 ? 2904
                             : scheme.weight.granularity == WeightGranularity::Group ? 640
                                                                                     : 656;
      SCOPED_TRACE(std::string(text) + " K=" + std::to_string(k) + " seed " + std::to_string(seed));
      std::vector<float> w(static_cast<std::size_t>(n * k));
      for (float& x : w) x = normal(rng);
      const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
      const layout::MmaWeight host = layout::repack_for_mma(packed);
      const layout::MmaDeviceWeight device =
          layout::repack_for_mma_on_device(packed, arch, nullptr);
      EXPECT_EQ(device.words.to_vector<std::uint32_t>(host.words.size()), host.words);
      EXPECT_EQ(device.scales.to_vector<float>(host.scales.size()), host.scales);
      // The scale flags, from the kernel against the host's scan of the same scales.
      EXPECT_EQ(device.meta.scales_exact_in_bf16, host.scales_exact_in_bf16);
      EXPECT_EQ(device.meta.scales_exact_in_fp16, host.scales_exact_in_fp16);
      if (!host.zeros.empty())
        EXPECT_EQ(device.zeros.to_vector<float>(host.zeros.size()), host.zeros);
    }
  }
  // Speed (printed, not asserted: a benchmark): the second of two runs (module loaded), end to
  // end, so the host-to-device upload of the canonical weight is included.
  const Scheme scheme = parse_scheme("w4a16");
  const std::int64_t n = 28672, k = 8192;
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (float& x : w) x = normal(rng);
  const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
  layout::repack_for_mma_on_device(packed, arch, nullptr);
  // The upload alone, to tell the repack's own time from the PCIe copy.
  const auto upload_start = std::chrono::steady_clock::now();
  { const auto codes = runtime::DeviceBuffer::from(packed.codes); }
  const double upload_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - upload_start).count();
  const auto start = std::chrono::steady_clock::now();
  const layout::MmaDeviceWeight device = layout::repack_for_mma_on_device(packed, arch, nullptr);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes =
      2.0 * static_cast<double>(packed.codes.size()) + static_cast<double>(device.scales.bytes());
  std::printf(
      "mma repack w4a16 %lldx%lld incl. upload: %.2f ms (upload of the codes alone %.2f ms); "
      "%.1f GB/s of codes in+out end to end, %.1f GB/s without the upload\n",
      static_cast<long long>(n), static_cast<long long>(k), seconds * 1e3, upload_seconds * 1e3,
      bytes / seconds / 1e9, bytes / (seconds - upload_seconds) / 1e9);
}

// --- FP8 and INT8 wgmma (issue #16) -------------------------------------------------------------

// The 8-bit tiles of the SM90 family (wgmma-fp8-*: e4m3 activation codes against the weight as
// e4m3 in registers; wgmma-int8-*: int8 codes against s8 weights, exact s32 sums; m64nNk32,
// scale groups promoted), every config that serves, forced, for
// each scheme they serve × M ∈ {1, 16, 17, 64, 255, 1024} on unaligned N and K (N 4000 / 5472 /
// 640, K 2880 / 10944 / 1000 in turn: partial last groups, K tails inside a 128-K activation box,
// split-K at decode; M = 1024 on N = 640, which bounds the CPU reference's cost). A goes in both
// ways: bf16 quantized on the GPU into the codes, and the host quantizer's codes and scales as a
// DeviceActivation (expanded into the same operand). The reference multiplies the host's exact
// dequantization of both, so only the kernel's arithmetic is in the bound: exact e4m3 operands,
// and the FP8 tensor cores' accumulation, which keeps fewer bits than fp32 (DeepSeek-V3
// reports about 14 for Hopper's FP8 wgmma; the bound takes 13, u_acc = 2^-13, for every
// addition of a group's sum; the INT8 sums are exact and take the same bound). Fresh random
// data (the seed is printed), outputs poisoned.
TEST(WgmmaGemmGpu, EightBitConfigsMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const dispatch::GpuLimits gpu = dispatch::GpuLimits::of_device(runtime::device_info(0));
  if (gpu.arch != jit::Arch::sm_90a) GTEST_SKIP() << "the wgmma family needs sm_90a";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  const std::uint32_t seed = fresh_seed();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);
  struct Case {
    std::string scheme;
    double static_scale;
  };
  std::vector<Case> cases = {
      {"w4a8-fp8", 0},                                      // int4 g128 bf16 × e4m3 per token
      {"w8a8-fp8", 0},                                      // e4m3 per channel × per token
      {"w=e2m1:g128:s=bf16;a=e4m3:tok;o=bf16", 0},          // e2m1 through the tables
      {"w=uint4:g64:s=fp16:zp=mid;a=e4m3:tok;o=fp16", 0},   // g64: a group per chunk, fp16 out
      {"w=int4:g128:s=bf16;a=e4m3:t;o=bf16", 0.02},         // static tensor scale
      {"w=e4m3:b128x128:s=fp32;a=e4m3:tok;o=fp32", 0},      // 128x128 weight blocks, fp32 out
      {"fp8-block", 0},  // 128x128 weight blocks × 1x128 activation groups, both promoted
      {"w=e4m3:ch:s=fp32;a=e4m3:g128;o=bf16", 0},           // channel weights × 1x128 groups
      {"w8a8-int8", 0},                                     // int8 per channel × per token
      {"w=int4:g128:s=bf16;a=int8:tok;o=bf16", 0},          // int4 g128 × int8 (QServe-style)
      {"w=uint4:g64:s=fp16:zp=mid;a=int8:tok;o=fp16", 0},   // g64 through the s8 table
      {"w=int8:ch:s=fp32;a=int8:t;o=fp32", 0.02},           // static tensor scale, fp32 out
      {"bitnet", 0},                                        // ternary (2-bit codes) × int8
  };
  std::vector<std::int64_t> ms = {1, 16, 17, 64, 255, 1024};
  // QGEMM_GPU_TEST_SUBSET=1 (the memory checker): three schemes, three M.
  const char* subset_env = std::getenv("QGEMM_GPU_TEST_SUBSET");
  const bool subset = subset_env && *subset_env == '1';
  if (subset) {
    cases = {cases[0], cases[1], cases[6], cases[8], cases[9], cases[12]};
    ms = {1, 17, 64};
  }
  // K = 1000: not a multiple of 16 (the activation codes' K permutation puts codes of k < K at
  // positions ≥ K of the last run), of 64 (a partial chunk) or of 128 (a partial group).
  const std::int64_t ns[] = {4000, 5472, 640}, ks[] = {2880, 10944, 1000};
  std::normal_distribution<double> normal(0.0, 1.0);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Scheme scheme = parse_scheme(cases[i].scheme);
    for (const bool prefill : {false, true}) {
      const std::int64_t n = prefill ? 640 : ns[i % 3], k = ks[i % 3];
      std::vector<float> w(static_cast<std::size_t>(n * k));
      for (float& x : w) x = static_cast<float>(normal(rng) * 0.05);
      const PackedWeight packed = quantize_weight(scheme.weight, w.data(), n, k);
      const QuantWeight weight =
          engine.prepare_weight(packed, scheme.activation, cases[i].static_scale);
      const layout::MmaWeight meta = layout::mma_metadata(packed, layout::FragmentOrder::Wgmma);
      const std::vector<double> w_ref = dequantize_weight(packed);
      const Format out = scheme.output;
      for (const std::int64_t m : ms) {
        if ((m >= 1024) != prefill) continue;
        std::vector<std::string> configs;
        const Format code_format = scheme.activation.format;
        for (const auto& config : dispatch::wgmma_configs())
          if (config.tile.eight_bit && config.codes() == code_format &&
              !config.unsupported_reason(m, meta, code_format, gpu))
            configs.push_back(config.name);
        EXPECT_FALSE(configs.empty()) << cases[i].scheme << " M=" << m;
        std::vector<float> a(static_cast<std::size_t>(m * k));
        std::vector<std::uint16_t> a_bits(a.size());
        for (std::size_t j = 0; j < a.size(); ++j) {
          a_bits[j] = static_cast<std::uint16_t>(encode(formats::bf16, normal(rng)));
          a[j] = static_cast<float>(decode(formats::bf16, a_bits[j]));
        }
        const PackedActivation quantized =
            quantize_activation(scheme.activation, a.data(), m, k, cases[i].static_scale);
        const std::vector<double> a_ref = dequantize_activation(quantized);
        const std::vector<double> expected =
            reference::matmul_nt(a_ref.data(), w_ref.data(), m, n, k);
        check::OperandRounding rounding;  // e4m3 and s8 operands are exact
        rounding.accumulator = std::ldexp(1.0, -13);
        // What is summed is the weight's value itself (unscaled codes times the activation
        // codes, scaled per group): |w|, not the lifted codes of the decode kernel that
        // test::gemm_bounds allows for.
        std::vector<double> magnitudes(w_ref.size());
        for (std::size_t j = 0; j < w_ref.size(); ++j) magnitudes[j] = std::fabs(w_ref[j]);
        const std::vector<double> bounds = check::backend_error_bounds(
            a_ref, w_ref, magnitudes, m, n, k, rounding, out, expected);
        runtime::DeviceBuffer a_device = runtime::DeviceBuffer::from(a_bits);
        runtime::DeviceBuffer codes = runtime::DeviceBuffer::from(quantized.codes);
        runtime::DeviceBuffer scales = runtime::DeviceBuffer::from(quantized.scales);
        runtime::DeviceBuffer c_device(static_cast<std::size_t>(m * n) * out.storage_bytes());
        const DeviceMatrix c{c_device.as<void>(), m, n, n, out};
        for (const std::string& config : configs) {
          GemmOptions options;
          options.candidate = config;
          for (const bool on_gpu : {true, false}) {
            const std::string label = cases[i].scheme + " " + config + " M=" + std::to_string(m) +
                                      " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                      (on_gpu ? " bf16 A" : " DeviceActivation") +
                                      " seed=" + std::to_string(seed);
            SCOPED_TRACE(label);
            c_device.fill_bytes(0xFF);  // NaN in every output type: an unwritten element fails
            if (on_gpu)
              engine.gemm({a_device.as<void>(), m, k, k, formats::bf16}, weight, c, nullptr,
                          options);
            else
              engine.gemm(DeviceActivation{scheme.activation, codes.as<void>(), scales.as<void>(),
                                           m, k, quantized.tensor_scale},
                          weight, c, nullptr, options);
            const test::OutputCheck check = test::check_output(
                check::read_device_values(c_device, out, expected.size()), expected, bounds, n);
            EXPECT_TRUE(check.ok()) << check.describe() << "\n"
                                    << plan_text(engine, weight, m, formats::bf16, out, options);
            std::printf("%-90s rel=%.3e worst=%.3f\n", label.c_str(), check.relative, check.worst);
            ++checked;
          }
        }
      }
    }
  }
  std::printf("%zu 8-bit wgmma runs checked\n", checked);
  EXPECT_GT(checked, cases.size());
}

// The FP8 tiles refuse what they cannot serve with an error naming the rule, at plan time: a
// forced FP8 config on 16-bit activations, on activation groups other than fp32 1x128 (g64), and
// on weights whose values e4m3 does not hold (int8).
TEST(WgmmaGemmGpu, Fp8ConfigsRefuseWhatTheyCannotServe) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU/driver on this machine";
  const dispatch::GpuLimits gpu = dispatch::GpuLimits::of_device(runtime::device_info(0));
  if (gpu.arch != jit::Arch::sm_90a) GTEST_SKIP() << "the wgmma family needs sm_90a";
  const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any config can be forced
  Engine engine(0);
  std::mt19937 rng(fresh_seed());
  std::normal_distribution<float> normal(0.0f, 0.05f);
  struct Refusal {
    const char* scheme;
    const char* rule;  // a piece of the message
  };
  for (const Refusal& r : {Refusal{"w4a16", "e4m3 activation codes"},
                           Refusal{"w=e4m3:ch:s=fp32;a=e4m3:g64;o=bf16", "group of 128"},
                           Refusal{"w=int8:ch:s=fp32;a=e4m3:tok;o=bf16", "bits"}}) {
    SCOPED_TRACE(r.scheme);
    const Scheme scheme = parse_scheme(r.scheme);
    std::vector<float> w(640 * 640);
    for (float& x : w) x = normal(rng);
    const QuantWeight weight =
        engine.prepare_weight(quantize_weight(scheme.weight, w.data(), 640, 640), scheme.activation);
    GemmProblem problem = gemm_problem(weight, 64, formats::bf16, scheme.output);
    problem.candidate = "wgmma-fp8-64";
    try {
      engine.plan(problem, weight);
      ADD_FAILURE() << "planned a forced FP8 config it cannot serve";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(r.rule), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace qgemm
