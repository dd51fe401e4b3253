// The utility kernels on the GPU against their CPU twins (the host quantizer and codec), and a
// CUDA-graph capture and replay of a sequence of launches. Outputs are poisoned before each run;
// inputs are fresh random values (the seed is printed on failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm {
namespace {

using runtime::DeviceBuffer;

std::uint64_t fresh_seed() {
  return (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

std::vector<float> random_matrix(std::mt19937_64& random, std::int64_t rows, std::int64_t cols) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (float& v : values) {
    v = normal(random);
    if (v == 0.0f) v = 0.5f;  // never test on zeros
  }
  return values;
}

runtime::LoadedKernel load(const jit::KernelSpec& spec) {
  return runtime::KernelLoader::global().get(*jit::KernelCache::global().get(spec).kernel);
}

void synchronize() {
  const auto& driver = runtime::Driver::get();
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
}

// The device copy of a packed weight.
struct DeviceWeight {
  DeviceBuffer codes, scales, zeros;
  explicit DeviceWeight(const PackedWeight& w)
      : codes(DeviceBuffer::from(w.codes)),
        scales(DeviceBuffer::from(w.scales)),
        zeros(w.zeros.empty() ? DeviceBuffer(1) : DeviceBuffer::from(w.zeros)) {}
};

// GPU values (16-bit codes of `out`) against the exact dequantization rounded once: the kernel
// computes scale · (q − zero) · global in fp32, so it may differ by one unit in the last place.
void expect_dequantized(const PackedWeight& weight, const Format& out,
                        const std::vector<std::uint16_t>& gpu, std::uint64_t seed) {
  const std::vector<double> exact = dequantize_weight(weight);
  ASSERT_EQ(gpu.size(), exact.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < exact.size() && bad < 10; ++i) {
    const double value = decode(out, gpu[i]);
    const double tolerance = 2.0 * half_ulp(out, exact[i]);
    if (!(std::fabs(value - exact[i]) <= tolerance)) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": gpu " << value << ", exact " << exact[i] << " (seed "
                    << seed << ", out " << out.name() << ")";
    }
  }
}

struct DequantizeCase {
  std::string scheme;  // a preset or compact text form (its weight part is used)
  Format out;
};

TEST(JitKernelsGpu, DequantizeWeightMatchesTheHostDequantizer) {
  QGEMM_REQUIRE_GPU();
  const jit::Arch arch = test::device_arch();
  const DequantizeCase cases[] = {
      {"w4a16", formats::bf16},           {"w4a16-zp", formats::bf16},
      {"gptq-w4a16-g128", formats::fp16}, {"w3a16", formats::bf16},
      {"w8a8-int8", formats::bf16},       {"fp8-block", formats::bf16},
      {"mxfp4-a16", formats::fp16},       {"nvfp4-a16", formats::bf16},
      {"bitnet", formats::bf16},
  };
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  // K = 200: a partial last group of every scheme (72 of 128, 8 of 32, 8 of 16).
  for (const std::int64_t k : {256, 200})
    for (const auto& c : cases) {
      SCOPED_TRACE(c.scheme + " -> " + c.out.name() + " K=" + std::to_string(k) + ", seed " +
                   std::to_string(seed));
      const Scheme scheme = parse_scheme(c.scheme);
      const std::int64_t n = 67;  // rows not a multiple of any block
      const auto host = random_matrix(random, n, k);
      const PackedWeight weight = quantize_weight(scheme.weight, host.data(), n, k);
      DeviceWeight device(weight);
      DeviceBuffer out(static_cast<std::size_t>(n * k) * 2);
      out.fill_bytes(0xff);  // NaN in both bf16 and fp16
      const auto kernel = load(jit::dequantize_weight_spec(scheme.weight, c.out, arch));
      runtime::launch_dequantize_weight(
          kernel,
          runtime::dequantize_weight_args(weight, device.codes.address(), device.scales.address(),
                                          device.zeros.address(), out.address()),
          nullptr);
      synchronize();
      expect_dequantized(weight, c.out, out.to_vector<std::uint16_t>(n * k), seed);
    }
}

struct ActivationCase {
  std::string quant;  // the activation part of a scheme's text form
  double static_scale = 0.0;
};

// bf16 values the GPU reads and the host quantizes alike: normal values with a few outliers,
// one row all zero (scale 1, codes 0), and in row 1 a cell whose absmax is a power of two (the
// quotients x / scale then sit near code midpoints).
std::vector<float> activation_values(std::mt19937_64& random, std::int64_t m, std::int64_t k,
                                     std::int64_t lda, std::vector<std::uint16_t>& bits) {
  auto values = random_matrix(random, m, k);
  std::bernoulli_distribution outlier(1.0 / 64);
  for (float& v : values)
    if (outlier(random)) v *= 40.0f;
  for (std::int64_t c = 0; c < k; ++c) values[static_cast<std::size_t>(3 * k + c)] = 0.0f;
  values[static_cast<std::size_t>(k)] = 8.0f;
  bits.assign(static_cast<std::size_t>(m * lda), 0x7fc0);  // NaN in the gaps: never read
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t c = 0; c < k; ++c) {
      float& v = values[static_cast<std::size_t>(r * k + c)];
      const auto code = static_cast<std::uint16_t>(encode(formats::bf16, v));
      bits[static_cast<std::size_t>(r * lda + c)] = code;
      v = static_cast<float>(decode(formats::bf16, code));  // what the GPU sees
    }
  return values;
}

// operand · row factor against the host's exact dequantization: equal where the operand holds
// the value exactly, within the operand type's rounding for per-group scales.
void expect_operand(const PackedActivation& expected, const Format& type,
                    const std::vector<std::uint16_t>& operand, std::int64_t ldo,
                    const std::vector<float>& factors, const char* path) {
  const std::vector<double> exact = dequantize_activation(expected);
  const bool rounded = expected.quant.scaling == ActivationScaling::DynamicGroup;
  std::size_t bad = 0;
  for (std::int64_t r = 0; r < expected.m && bad < 10; ++r)
    for (std::int64_t c = 0; c < expected.k && bad < 10; ++c) {
      const double value = decode(type, operand[static_cast<std::size_t>(r * ldo + c)]) *
                           factors[static_cast<std::size_t>(r)];
      const double want = exact[static_cast<std::size_t>(r * expected.k + c)];
      const double tolerance = rounded ? half_ulp(type, want) * 1.0001 : 0.0;
      if (!(std::fabs(value - want) <= tolerance))
        ++bad, ADD_FAILURE() << path << " [" << r << ", " << c << "]: gpu " << value << ", host "
                             << want;
    }
}

// quantize_activation against the host quantizer, every scaling: codes and scales bit for bit;
// the GEMM operand (fused, and expanded from the host's codes) equal to the dequantized values.
// K = 1152 divides every group; K = 1160 leaves a partial last cell of every grouping (8 of
// 128, 8 of 48, 8 of 32, 8 of 16), and K = 1137 an odd one (113, 33, 17, 1 values; 4-bit
// codes end in half a byte).
TEST(JitKernelsGpu, QuantizeActivationMatchesTheHostQuantizer) {
  QGEMM_REQUIRE_GPU();
  const jit::Arch arch = test::device_arch();
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  const ActivationCase cases[] = {
      {"a=e4m3:tok"},        {"a=int8:tok"},       {"a=e5m2:tok"},       {"a=int4:tok"},
      {"a=e4m3:g128"},       {"a=e4m3:g48"},       {"a=int4:g32"},       {"a=e4m3:t", 0.0123},
      {"a=int8:t"},          {"a=e4m3:mx:s=e8m0"}, {"a=e2m1:mx:s=e8m0"}, {"a=int8:mx:s=e8m0"},
      {"a=e2m1:nv:s=ue4m3"},
      // Extreme given scales, whose inverse the kernel holds in fp32 only after a shift of 2^±64
      // (number_codec.cuh's quotient_inverse): every code 0, every nonzero value saturated.
      {"a=int8:t", 1e38},    {"a=e4m3:t", 1e-39},
  };
  const std::int64_t m = 9;
  for (const std::int64_t k : {1152, 1160, 1137})
    for (const auto& c : cases) {
      SCOPED_TRACE(c.quant + " K=" + std::to_string(k) + ", seed " + std::to_string(seed));
      const std::int64_t lda = k + 8;  // strided rows
      const ActivationQuant quant =
          parse_scheme("w=int8:ch:s=fp32;" + c.quant + ";o=bf16").activation;
      std::vector<std::uint16_t> bits;
      const auto host = activation_values(random, m, k, lda, bits);
      const PackedActivation expected =
          quantize_activation(quant, host.data(), m, k, c.static_scale);
      DeviceBuffer input = DeviceBuffer::from(bits), absmax(sizeof(float));
      const bool tensor_absmax = runtime::needs_tensor_absmax(quant, c.static_scale);
      if (tensor_absmax)
        runtime::launch_tensor_absmax(load(jit::tensor_absmax_spec(formats::bf16, arch)),
                                      input.address(), m, k, lda, absmax.address(), nullptr);

      // Codes and scales.
      DeviceBuffer codes(expected.codes.size()), scales(expected.scales.size()), tensor(4);
      codes.fill_bytes(0x5a);
      scales.fill_bytes(0xff);
      tensor.fill_bytes(0xff);
      auto args =
          runtime::quantize_activation_args(quant, m, k, input.address(), lda, c.static_scale);
      args.codes = codes.as<unsigned char>();
      args.scales = scales.as<unsigned char>();
      args.tensor_scale = tensor.as<float>();
      args.tensor_absmax = absmax.as<const float>();
      runtime::launch_quantize_activation(
          load(jit::quantize_activation_spec(quant, formats::bf16, jit::ActivationEmit::Codes,
                                             formats::bf16, arch)),
          args, nullptr);
      synchronize();
      EXPECT_EQ(scales.to_vector<std::uint8_t>(expected.scales.size()), expected.scales);
      const auto gpu_codes = codes.to_vector<std::uint8_t>(expected.codes.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < gpu_codes.size(); ++i)
        differ += gpu_codes[i] != expected.codes[i];
      EXPECT_EQ(differ, 0u) << "code bytes differ from the host's";
      if (quant.scaling == ActivationScaling::NV)
        EXPECT_EQ(tensor.to_vector<float>(1)[0], static_cast<float>(expected.tensor_scale));

      // The GEMM operand, fused from bf16 and expanded from the host's codes.
      const Format type = jit::activation_operand_format(quant);
      const std::int64_t ldo = k + 8;
      DeviceBuffer operand(static_cast<std::size_t>(m * ldo) * 2),
          factors(static_cast<std::size_t>(m) * 4);
      operand.fill_bytes(0xff);
      factors.fill_bytes(0xff);
      args = runtime::quantize_activation_args(quant, m, k, input.address(), lda, c.static_scale);
      args.operand = operand.as<unsigned short>();
      args.ldo = ldo;
      args.row_factors = factors.as<float>();
      args.tensor_absmax = absmax.as<const float>();
      runtime::launch_quantize_activation(
          load(jit::quantize_activation_spec(quant, formats::bf16, jit::ActivationEmit::Operand,
                                             type, arch)),
          args, nullptr);
      synchronize();
      expect_operand(expected, type, operand.to_vector<std::uint16_t>(m * ldo), ldo,
                     factors.to_vector<float>(m), "fused");

      DeviceBuffer host_codes = DeviceBuffer::from(expected.codes),
                   host_scales = DeviceBuffer::from(expected.scales);
      operand.fill_bytes(0xff);
      factors.fill_bytes(0xff);
      kernels::ExpandActivationArgs expand{};
      expand.codes = host_codes.as<const unsigned char>();
      expand.scales = host_scales.as<const unsigned char>();
      expand.tensor_scale = static_cast<float>(expected.tensor_scale);
      expand.operand = operand.as<unsigned short>();
      expand.ldo = ldo;
      expand.row_factors = factors.as<float>();
      expand.m = m;
      expand.k = k;
      expand.group = quant.group > 0 ? quant.group : k;
      runtime::launch_expand_activation(load(jit::expand_activation_spec(quant, type, arch)),
                                        expand, nullptr);
      synchronize();
      expect_operand(expected, type, operand.to_vector<std::uint16_t>(m * ldo), ldo,
                     factors.to_vector<float>(m), "expanded");
    }
}

// CPU twin of kernels/util/repack.cuh.
std::vector<std::uint32_t> repack_on_host(const std::vector<std::uint8_t>& packed, std::int64_t n,
                                          std::int64_t k, int bits) {
  const std::int64_t per_word = 32 / bits;
  const std::int64_t word_rows = (k + per_word - 1) / per_word;
  const std::int64_t row_bytes = (k * bits + 7) / 8;
  std::vector<std::uint32_t> words(static_cast<std::size_t>(word_rows * n), 0);
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < k; ++c) {
      const std::uint32_t code = read_code(packed.data() + r * row_bytes, c, bits);
      words[static_cast<std::size_t>((c / per_word) * n + r)] |= code << ((c % per_word) * bits);
    }
  }
  return words;
}

std::vector<std::uint8_t> random_packed(std::mt19937_64& random, std::int64_t n, std::int64_t k,
                                        int bits) {
  const std::int64_t row_bytes = (k * bits + 7) / 8;
  std::vector<std::uint8_t> packed(static_cast<std::size_t>(n * row_bytes));
  std::vector<std::uint32_t> codes(static_cast<std::size_t>(k));
  for (std::int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<std::uint32_t>(random() & ((1u << bits) - 1));
    pack_codes(codes.data(), k, bits, packed.data() + r * row_bytes);
  }
  return packed;
}

TEST(JitKernelsGpu, RepackWeightMatchesItsHostTwin) {
  QGEMM_REQUIRE_GPU();
  const jit::Arch arch = test::device_arch();
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  for (int bits : {2, 3, 4, 8}) {
    SCOPED_TRACE("bits " + std::to_string(bits) + ", seed " + std::to_string(seed));
    const std::int64_t n = 37, k = 203;
    const auto packed = random_packed(random, n, k, bits);
    const auto expected = repack_on_host(packed, n, k, bits);
    DeviceBuffer codes = DeviceBuffer::from(packed);
    DeviceBuffer words(expected.size() * 4);
    words.fill_bytes(0xab);
    const auto kernel = load(jit::repack_weight_spec(bits, arch));
    runtime::launch_repack_weight(
        kernel, runtime::repack_weight_args(n, k, bits, codes.address(), words.address()), bits,
        nullptr);
    synchronize();
    EXPECT_EQ(words.to_vector<std::uint32_t>(expected.size()), expected);
  }
}

TEST(JitKernelsGpu, LaunchesCaptureIntoAGraphAndReplay) {
  QGEMM_REQUIRE_GPU();
  const jit::Arch arch = test::device_arch();
  const auto& driver = runtime::Driver::get();
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));

  const Scheme scheme = parse_scheme("w4a16");
  const std::int64_t n = 64, k = 256;
  const auto host = random_matrix(random, n, k);
  const PackedWeight weight = quantize_weight(scheme.weight, host.data(), n, k);
  DeviceWeight device(weight);
  DeviceBuffer dequantized(static_cast<std::size_t>(n * k) * 2);
  const auto packed = random_packed(random, n, k, 4);
  const auto expected_words = repack_on_host(packed, n, k, 4);
  DeviceBuffer codes = DeviceBuffer::from(packed);
  DeviceBuffer words(expected_words.size() * 4);

  // Kernels are loaded before capture; the captured launches do no loading.
  const auto dequantize = load(jit::dequantize_weight_spec(scheme.weight, formats::bf16, arch));
  const auto repack = load(jit::repack_weight_spec(4, arch));
  const auto dequantize_args =
      runtime::dequantize_weight_args(weight, device.codes.address(), device.scales.address(),
                                      device.zeros.address(), dequantized.address());
  const auto repack_args = runtime::repack_weight_args(n, k, 4, codes.address(), words.address());

  CUstream stream = nullptr;
  driver.check(driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  driver.check(driver.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture");
  runtime::launch_dequantize_weight(dequantize, dequantize_args, stream);
  runtime::launch_repack_weight(repack, repack_args, 4, stream);
  CUgraph graph = nullptr;
  driver.check(driver.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  std::size_t nodes = 0;
  driver.check(driver.cuGraphGetNodes(graph, nullptr, &nodes), "cuGraphGetNodes");
  EXPECT_EQ(nodes, 2u);
  CUgraphExec exec = nullptr;
  driver.check(driver.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");

  for (int replay = 0; replay < 2; ++replay) {
    dequantized.fill_bytes(0xff);
    words.fill_bytes(0xab);
    driver.check(driver.cuGraphLaunch(exec, stream), "cuGraphLaunch");
    driver.check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize");
    expect_dequantized(weight, formats::bf16, dequantized.to_vector<std::uint16_t>(n * k), seed);
    EXPECT_EQ(words.to_vector<std::uint32_t>(expected_words.size()), expected_words)
        << "replay " << replay;
  }
  driver.cuGraphExecDestroy(exec);
  driver.cuGraphDestroy(graph);
  driver.cuStreamDestroy(stream);
}

TEST(JitKernelsGpu, EveryDeviceLoadsItsOwnModule) {
  QGEMM_REQUIRE_GPU();
  const int devices = runtime::device_count();
  if (devices < 2) GTEST_SKIP() << "one device: nothing to compare across contexts";
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  const std::int64_t n = 16, k = 96;
  const auto packed = random_packed(random, n, k, 3);
  const auto expected = repack_on_host(packed, n, k, 3);
  for (int d = 0; d < devices; ++d) {
    SCOPED_TRACE("device " + std::to_string(d) + ", seed " + std::to_string(seed));
    runtime::use_primary_context(d);
    DeviceBuffer codes = DeviceBuffer::from(packed);
    DeviceBuffer words(expected.size() * 4);
    words.fill_bytes(0xab);
    const auto kernel = load(jit::repack_weight_spec(3, test::device_arch(d)));
    runtime::launch_repack_weight(
        kernel, runtime::repack_weight_args(n, k, 3, codes.address(), words.address()), 3, nullptr);
    synchronize();
    EXPECT_EQ(words.to_vector<std::uint32_t>(expected.size()), expected);
  }
  runtime::use_primary_context(0);
}

}  // namespace
}  // namespace qgemm
