// The GPU weight quantizer (kernels/util/quantize_weight.cuh, Engine::quantize_weight and
// prepare_weight from a DeviceMatrix) against the host quantizer: the same codes, scales, zeros
// and global scale, byte for byte, for every preset's weight quantization and the grids and
// zero points no preset uses, from bf16, fp16 and fp32 inputs of fresh random values; its
// errors; and a GEMM on a weight prepared from the device equal to one prepared from the host.
#include <fmt/format.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check/backend.hpp"
#include "gpu_test_util.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"

namespace qgemm {
namespace {

using runtime::DeviceBuffer;

std::uint32_t fresh_seed() { return std::random_device{}(); }

// A random weight [n, k] in `dtype`: rows of different magnitudes (so scales spread over their
// formats' ranges), one row all zero when `zero_row` (the degenerate cell's scale of 1), and
// the exact fp32 values the host quantizer is given.
struct Input {
  Format dtype;
  std::int64_t n = 0, k = 0, stride = 0;
  std::vector<float> values;  // [n, k], exactly the device elements
  DeviceBuffer device;
  DeviceMatrix matrix() const {
    return DeviceMatrix{reinterpret_cast<void*>(device.address()), n, k, stride, dtype};
  }
};

Input make_input(const Format& dtype, std::int64_t n, std::int64_t k, std::int64_t stride,
                 bool zero_row, std::mt19937& rng) {
  Input in;
  in.dtype = dtype;
  in.n = n;
  in.k = k;
  in.stride = stride;
  in.values.resize(static_cast<std::size_t>(n * k));
  const std::size_t bytes = dtype.storage_bytes();
  std::vector<unsigned char> raw(static_cast<std::size_t>(n * stride) * bytes, 0xEE);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> exponent(-6.0, 4.0);
  for (std::int64_t r = 0; r < n; ++r) {
    const double magnitude = std::exp2(exponent(rng));
    for (std::int64_t c = 0; c < k; ++c) {
      double x = zero_row && r == n / 2 ? 0.0 : normal(rng) * magnitude;
      if (x == 0.0 && !(zero_row && r == n / 2)) x = magnitude;
      const std::size_t at = static_cast<std::size_t>(r * stride + c) * bytes;
      float value = static_cast<float>(x);
      if (bytes == 4) {
        std::memcpy(raw.data() + at, &value, 4);
      } else {
        const std::uint32_t code = encode(dtype, x);
        raw[at] = static_cast<unsigned char>(code);
        raw[at + 1] = static_cast<unsigned char>(code >> 8);
        value = static_cast<float>(decode(dtype, code));
      }
      in.values[static_cast<std::size_t>(r * k + c)] = value;
    }
  }
  in.device = DeviceBuffer::from(raw);
  return in;
}

// Fills and frees a buffer the size of the outputs, so that bytes the quantizer failed to write
// would hold 0xA5 rather than the host's zeros (the allocator hands the memory out again).
void poison_the_next_allocation(std::size_t bytes) {
  DeviceBuffer poison(bytes);
  poison.fill_bytes(0xA5);
}

// GPU against host, byte for byte: one failure per array that differs, naming its first few
// differing bytes.
void expect_same_packing(const PackedWeight& gpu, const PackedWeight& host,
                         const std::string& what) {
  auto compare = [&](const char* name, const std::vector<std::uint8_t>& a,
                     const std::vector<std::uint8_t>& b) {
    ASSERT_EQ(a.size(), b.size()) << what << ": " << name;
    std::size_t differing = 0;
    std::string first;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] && differing++ < 5)
        first += fmt::format(" {} byte {}: gpu 0x{:02x}, host 0x{:02x};", name, i, a[i], b[i]);
    EXPECT_EQ(differing, 0u) << what << ":" << first;
  };
  compare("codes", gpu.codes, host.codes);
  compare("scales", gpu.scales, host.scales);
  compare("zeros", gpu.zeros, host.zeros);
  EXPECT_EQ(gpu.global_scale, host.global_scale) << what;
  EXPECT_EQ(gpu.n, host.n);
  EXPECT_EQ(gpu.k, host.k);
  EXPECT_TRUE(gpu.quant == host.quant) << what;
}

void check_case(Engine& engine, const WeightQuant& quant, const Input& in,
                const std::string& what) {
  const PackedWeight host = quantize_weight(quant, in.values.data(), in.n, in.k);
  poison_the_next_allocation(host.codes.size());
  const PackedWeight gpu = engine.quantize_weight(in.matrix(), quant);
  expect_same_packing(gpu, host, what);
}

WeightQuant weight_of(const std::string& scheme) { return parse_scheme(scheme).weight; }

TEST(QuantizeWeightGpu, EveryPresetMatchesTheHostQuantizerByteForByte) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  Engine engine(0);
  int cases = 0;
  for (const Preset& preset : presets()) {
    const WeightQuant& quant = preset.scheme.weight;
    // A shape whose last group and block are partial where the scheme allows it, else whole.
    for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{200, 520}, {256, 1024}}) {
      try {
        validate_shape(preset.scheme, 1, n, k);
      } catch (const Error&) {
        continue;
      }
      for (const Format& dtype : {formats::bf16, formats::fp16, formats::fp32}) {
        const Input in = make_input(dtype, n, k, k, /*zero_row=*/dtype == formats::bf16, rng);
        check_case(engine, quant, in,
                   preset.name + " " + std::to_string(n) + "x" + std::to_string(k) + " from " +
                       dtype.name() + " (seed " + std::to_string(seed) + ")");
        ++cases;
      }
      break;  // one shape a preset
    }
  }
  EXPECT_GE(cases, static_cast<int>(3 * presets().size()) - 3) << "presets without a shape";
}

// Grids, zero points, formats and strides no preset has: per-tensor and 2-D blocks (pieces
// merged over rows), float zeros, 3- and 5-bit codes straddling bytes, e5m2 / e3m2 / e2m3
// elements, fp16 and e4m3 scales, a row stride past k, k not a multiple of 8 (the scalar loads).
TEST(QuantizeWeightGpu, GridsAndFormatsBeyondThePresetsMatchTheHost) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  Engine engine(0);
  const char* schemes[] = {
      "w=uint4:g128:s=fp16:zp=float;a=bf16;o=bf16",
      "w=uint3:g64:s=bf16:zp=int;a=bf16;o=bf16",
      "w=uint5:g32:s=fp32:zp=mid;a=bf16;o=bf16",
      "w=int4:t:s=fp32;a=bf16;o=bf16",
      "w=int8:b64x32:s=fp32;a=bf16;o=bf16",
      "w=e5m2:ch:s=fp32;a=bf16;o=bf16",
      "w=e3m2:g32:s=e8m0;a=bf16;o=bf16",
      "w=e2m3:g16:s=e4m3;a=bf16;o=bf16",
      "w=ternary:g64:s=fp16;a=bf16;o=bf16",
      "w=uint2:g16:s=bf16:zp=int;a=bf16;o=bf16",
      "w=uint1:ch:s=fp32:zp=int;a=bf16;o=bf16",
  };
  for (const char* text : schemes) {
    WeightQuant quant;
    try {
      quant = weight_of(text);
    } catch (const Error& e) {
      ADD_FAILURE() << text << ": " << e.what();
      continue;
    }
    for (const auto& [n, k, stride] :
         {std::tuple<std::int64_t, std::int64_t, std::int64_t>{130, 384, 400}, {67, 203, 203}}) {
      Scheme scheme;
      scheme.weight = quant;
      try {
        validate_shape(scheme, 1, n, k);
      } catch (const Error&) {
        continue;
      }
      for (const Format& dtype : {formats::bf16, formats::fp32}) {
        const Input in = make_input(dtype, n, k, stride, true, rng);
        check_case(engine, quant, in,
                   std::string(text) + " " + std::to_string(n) + "x" + std::to_string(k) +
                       " stride " + std::to_string(stride) + " from " + dtype.name() +
                       " (seed " + std::to_string(seed) + ")");
      }
    }
  }
}

// Negative control: the byte comparison notices one code off.
TEST(QuantizeWeightGpu, TheComparisonCatchesOneChangedCode) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  Engine engine(0);
  const WeightQuant quant = weight_of("w4a16");
  const Input in = make_input(formats::bf16, 64, 256, 256, false, rng);
  const PackedWeight host = quantize_weight(quant, in.values.data(), in.n, in.k);
  PackedWeight gpu = engine.quantize_weight(in.matrix(), quant);
  gpu.codes[77] ^= 0x10;
  EXPECT_NONFATAL_FAILURE(expect_same_packing(gpu, host, "altered"), "codes byte 77");
}

TEST(QuantizeWeightGpu, BadInputIsNamed) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  Engine engine(0);
  const WeightQuant quant = weight_of("w4a16");
  Input in = make_input(formats::bf16, 32, 256, 256, false, rng);
  // A NaN at [5, 17] and an Inf after it: the first is named, as the host names it.
  std::vector<std::uint16_t> bits = in.device.to_vector<std::uint16_t>(32 * 256);
  bits[5 * 256 + 17] = 0x7fc0;
  bits[9 * 256 + 3] = 0x7f80;
  in.device.upload(bits.data(), bits.size() * 2);
  try {
    engine.quantize_weight(in.matrix(), quant);
    ADD_FAILURE() << "a NaN weight was quantized";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("weight[5, 17] = nan is not finite"), std::string::npos)
        << e.what();
  }
  DeviceMatrix bad = in.matrix();
  bad.stride = 100;
  EXPECT_THROW(engine.quantize_weight(bad, quant), Error);
  bad = in.matrix();
  bad.dtype = formats::int8;
  try {
    engine.prepare_weight(bad, quant);
    ADD_FAILURE() << "int8 elements were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight.dtype = int8"), std::string::npos) << e.what();
  }
  bad = in.matrix();
  bad.data = nullptr;
  EXPECT_THROW(engine.quantize_weight(bad, quant), Error);
  // A quantization the scheme rules reject is the scheme's error.
  WeightQuant wide = quant;
  wide.format = formats::bf16;
  try {
    engine.quantize_weight(in.matrix(), wide);
    ADD_FAILURE() << "a 16-bit weight format was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 8"), std::string::npos) << e.what();
  }
}

// A GEMM on the weight prepared from the device is the GEMM on the same weight prepared from
// the host's packing, bit for bit (same layouts, same kernels); NaN-poisoned outputs.
// Downloads of 16 MiB or more go through pinned chunks of 8 MiB (DeviceBuffer::download, and
// to_vector, which fills its vector chunk by chunk): every byte arrives, the partial last chunk
// too, and a smaller download takes the direct path.
TEST(QuantizeWeightGpu, LargeDownloadsArriveWhole) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  Engine engine(0);  // a current context
  for (const std::size_t bytes :
       {(std::size_t{40} << 20) + 12345, std::size_t{16} << 20, (std::size_t{16} << 20) - 1}) {
    std::vector<std::uint32_t> words((bytes + 3) / 4);
    for (auto& w : words) w = rng();
    std::vector<std::uint8_t> sent(bytes);
    std::memcpy(sent.data(), words.data(), bytes);
    DeviceBuffer buffer(bytes);
    buffer.upload(sent.data(), bytes);
    std::vector<std::uint8_t> got(bytes, 0xA5);
    buffer.download(got.data(), bytes);
    std::size_t differing = 0;
    for (std::size_t i = 0; i < bytes; ++i) differing += got[i] != sent[i] ? 1 : 0;
    EXPECT_EQ(differing, 0u) << bytes << " bytes (seed " << seed << ")";
    // As 32-bit words (whole elements per chunk), and as bytes.
    const std::vector<std::uint32_t> as_words = buffer.to_vector<std::uint32_t>(bytes / 4);
    ASSERT_EQ(as_words.size(), bytes / 4);
    EXPECT_EQ(std::memcmp(as_words.data(), sent.data(), bytes / 4 * 4), 0) << bytes;
    EXPECT_EQ(buffer.to_vector<std::uint8_t>(bytes), sent) << bytes << " bytes as a vector";
  }
}

TEST(QuantizeWeightGpu, PreparedFromTheDeviceComputesWhatTheHostPreparationDoes) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  Engine engine(0);
  for (const char* preset : {"w4a16", "w4a16-zp", "nvfp4", "mxfp4-a16", "w8a8-fp8", "fp8-block", "bitnet"}) {
    const Scheme scheme = parse_scheme(preset);
    const std::int64_t n = 512, k = 1024, m = 24;
    const Input in = make_input(formats::bf16, n, k, k, false, rng);
    const PackedWeight host = quantize_weight(scheme.weight, in.values.data(), n, k);
    const QuantWeight from_host = engine.prepare_weight(host, scheme.activation);
    const QuantWeight from_device =
        engine.prepare_weight(in.matrix(), scheme.weight, scheme.activation);
    EXPECT_EQ(from_device.device_bytes(), from_host.device_bytes()) << preset;
    // Both at once: the downloaded packing is the host's, the preparation the same again.
    const Engine::QuantizedOnDevice both =
        engine.quantize_and_prepare_weight(in.matrix(), scheme.weight, scheme.activation);
    expect_same_packing(both.packed, host, std::string(preset) + " (quantize_and_prepare)");
    EXPECT_EQ(both.prepared.device_bytes(), from_host.device_bytes()) << preset;
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<std::uint16_t> a(static_cast<std::size_t>(m * k));
    for (auto& x : a) x = static_cast<std::uint16_t>(encode(formats::bf16, normal(rng)));
    const DeviceBuffer a_device = DeviceBuffer::from(a);
    const DeviceMatrix am{reinterpret_cast<void*>(a_device.address()), m, k, k, formats::bf16};
    std::vector<std::uint16_t> outputs[3];
    const QuantWeight* weights[3] = {&from_host, &from_device, &both.prepared};
    for (int i = 0; i < 3; ++i) {
      DeviceBuffer c(static_cast<std::size_t>(m * n) * 2);
      c.fill_bytes(0xFF);  // NaN
      const DeviceMatrix cm{reinterpret_cast<void*>(c.address()), m, n, n, formats::bf16};
      engine.gemm(am, *weights[i], cm, nullptr);
      const auto& driver = runtime::Driver::get();
      driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
      outputs[i] = c.to_vector<std::uint16_t>(static_cast<std::size_t>(m * n));
    }
    for (int i = 1; i < 3; ++i) {
      std::size_t nan = 0, differing = 0;
      for (std::size_t j = 0; j < outputs[0].size(); ++j) {
        nan += std::isnan(decode(formats::bf16, outputs[i][j])) ? 1 : 0;
        differing += outputs[0][j] != outputs[i][j] ? 1 : 0;
      }
      EXPECT_EQ(nan, 0u) << preset << " weight " << i << " (seed " << seed << ")";
      EXPECT_EQ(differing, 0u) << preset << " weight " << i << " (seed " << seed << ")";
    }
  }
}

}  // namespace
}  // namespace qgemm
