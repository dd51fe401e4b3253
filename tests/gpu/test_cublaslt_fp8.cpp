// cuBLASLt FP8 (src/runtime/cublaslt.hpp) on the GPU against the CPU reference, and the GPU
// activation quantizer writing cuBLASLt's scale layouts bit for bit as the host quantizer does.
// Fresh random inputs every run (the seed is printed), outputs poisoned before each run, every
// output element checked against its own bound.
//
// The scale layouts come from the cuBLAS docs and PyTorch's checks, not from a run of this code,
// so the tests are built to decide them; what each outcome means:
//   - MatchesTheReference passes, WrongScaleLayoutsFail passes: the layouts of the header hold.
//   - fp8-block fails at M = 1 and 7 only (passes at 16, 100, 256): cuBLASLt's 1x128 scales are
//     round_up(M, 4) tokens apart: set fp8_block1x128_stride to that.
//   - fp8-block fails at 720 x 2816 (22 K-blocks) only, and WrongScaleLayoutsFail reports that
//     the unpadded 128x128 rows matched: cuBLASLt does not pad them to 4 blocks (L4 = blocks).
//   - fp8-block fails at every M and the transposed 1x128 scales matched: cuBLASLt reads them
//     K-block-contiguous per token ([m][ceil(k/128)]): swap row and block strides.
//   - "prepare: ... no algorithm" for a case: the filter (fp8_matmul_unsupported_reason) is more
//     permissive than cuBLASLt on this GPU: add the rule the message names.
//   - only the 640 x 2880 block case fails: block scales need k % 128 == 0 (add the rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/reference.hpp"
#include "runtime/cublaslt.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm {
namespace {

using runtime::DeviceBuffer;
using runtime::Fp8Matmul;
using runtime::Fp8MatmulShape;
using runtime::Fp8ScaleMode;

std::uint64_t fresh_seed() {
  static const std::uint64_t seed =
      (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  return seed;
}

void synchronize() {
  const auto& driver = runtime::Driver::get();
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
}

runtime::LoadedKernel load(const jit::KernelSpec& spec) {
  return runtime::KernelLoader::global().get(*jit::KernelCache::global().get(spec).kernel);
}

int compute_capability() {
  const auto device = runtime::device_info(0);
  return device.major * 10 + device.minor;
}

// Gaussian values whose magnitude steps by powers of two from row to row (rows_per_step rows
// share one) and from one 128-wide K-block to the next, so that every scale of every layout
// differs from its neighbours and a scale read from the wrong place is off by 2x to 16x.
std::vector<float> structured_matrix(std::mt19937_64& random, std::int64_t rows, std::int64_t k,
                                     std::int64_t rows_per_step) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(rows * k));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < k; ++c) {
      const int step = static_cast<int>((r / rows_per_step * 3 + c / 128 * 2 + r % 2) % 5) - 2;
      float v = normal(random);
      if (v == 0.0f) v = 0.5f;  // never test on zeros
      values[static_cast<std::size_t>(r * k + c)] = std::ldexp(v, step);
    }
  return values;
}

// Bounds per output element. The reference multiplies the same codes and scales exactly; the
// GPU differs by its accumulation and one rounding to the output type:
//   |gpu - exact| <= accumulation · Σ_k |a·w| + half_ulp(output, |exact| + that)
// accumulation: fp32-promoted 2^-10 (FP8 tensor cores keep ~14 bits between promotions), fast
// 2^-7 (no promotion over all of K). Loose for random signs (the sum of |a·w| is ~sqrt(K) times
// |exact|), yet a scale read from the wrong place is off by 2x-16x and far outside.
double accumulation_unit(bool fast) { return fast ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10); }

std::vector<double> absolute(std::vector<double> values) {
  for (double& v : values) v = std::fabs(v);
  return values;
}

// A quantized A against a weight, with the exact products of the reference.
struct Operands {
  PackedActivation a;
  const PackedWeight* w = nullptr;
  std::vector<double> exact, magnitude;  // Σ a·w and Σ |a·w| per output
};

Operands with_reference(PackedActivation a, const PackedWeight& w,
                        const std::vector<double>& w_values) {
  Operands out{std::move(a), &w, {}, {}};
  const std::vector<double> a_values = dequantize_activation(out.a);
  out.exact = reference::matmul_nt(a_values.data(), w_values.data(), out.a.m, w.n, w.k);
  const auto a_abs = absolute(a_values), w_abs = absolute(w_values);
  out.magnitude = reference::matmul_nt(a_abs.data(), w_abs.data(), out.a.m, w.n, w.k);
  return out;
}

// A fresh structured A [m][k], host-quantized.
Operands make_operands(const Scheme& scheme, const PackedWeight& w,
                       const std::vector<double>& w_values, std::int64_t m,
                       std::mt19937_64& random) {
  const auto values = structured_matrix(random, m, w.k, 1);
  return with_reference(quantize_activation(scheme.activation, values.data(), m, w.k), w, w_values);
}

// C (`c_device`, rows ldc apart) against the bounds; the columns past n must still hold the
// poison. Returns how many outputs are outside their bound (the first few reported).
std::size_t outside_bounds(const DeviceBuffer& c_device, const Format& out, std::int64_t m,
                           std::int64_t n, std::int64_t ldc, const Operands& operands, bool fast,
                           bool report) {
  const std::size_t count = static_cast<std::size_t>(m * ldc);
  std::vector<double> got(count);
  std::size_t poison_overwritten = 0;
  if (out == formats::fp32) {
    const auto host = c_device.to_vector<std::uint32_t>(count);
    for (std::size_t i = 0; i < count; ++i) {
      float value;
      std::memcpy(&value, &host[i], 4);
      got[i] = value;
      poison_overwritten += static_cast<std::int64_t>(i) % ldc >= n && host[i] != 0xFFFFFFFFu;
    }
  } else {
    const auto host = c_device.to_vector<std::uint16_t>(count);
    for (std::size_t i = 0; i < count; ++i) {
      got[i] = decode(out, host[i]);
      poison_overwritten += static_cast<std::int64_t>(i) % ldc >= n && host[i] != 0xFFFFu;
    }
  }
  EXPECT_EQ(poison_overwritten, 0u) << "writes past column n of C (ldc = " << ldc << ")";
  const double unit = accumulation_unit(fast);
  std::size_t bad = 0;
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * n + c);
      const double exact = operands.exact[i];
      const double accumulation = unit * operands.magnitude[i];
      const double bound = accumulation + half_ulp(out, std::fabs(exact) + accumulation);
      const double value = got[static_cast<std::size_t>(r * ldc + c)];
      if (!(std::fabs(value - exact) <= bound)) {
        if (report && bad < 5)
          ADD_FAILURE() << "C[" << r << ", " << c << "] = " << value << ", reference " << exact
                        << " (bound " << bound << ")";
        ++bad;
      }
    }
  return bad;
}

// One prepared product with its device operands; `a_scales` / `w_scales` as uploaded.
struct DeviceProduct {
  std::optional<Fp8Matmul> matmul;
  DeviceBuffer a_codes, a_scales, w_codes, w_scales, c, workspace;
};

Fp8MatmulShape shape_of(const Scheme& scheme, const runtime::Fp8ScaleModes& modes, std::int64_t m,
                        std::int64_t n, std::int64_t k, std::int64_t ldc, bool fast) {
  Fp8MatmulShape shape;
  shape.m = m, shape.n = n, shape.k = k;
  shape.a_format = scheme.activation.format;
  shape.w_format = scheme.weight.format;
  shape.a_scale = modes.activation;
  shape.w_scale = modes.weight;
  shape.c_format = scheme.output;
  shape.ldc = ldc;
  shape.fast_accumulation = fast;
  shape.compute_capability = compute_capability();
  return shape;
}

// Runs the product with the given scale arrays (normally the layouts' own) into a poisoned C.
void run_product(const runtime::CublasLt& cublaslt, const Fp8MatmulShape& shape,
                 const Operands& operands, const std::vector<float>& a_scales,
                 const std::vector<float>& w_scales, DeviceProduct& product) {
  if (!product.matmul) {
    product.matmul = Fp8Matmul::prepare(cublaslt, shape);
    product.a_codes = DeviceBuffer::from(operands.a.codes);
    product.w_codes = DeviceBuffer::from(operands.w->codes);
    product.c = DeviceBuffer(static_cast<std::size_t>(shape.m * shape.ldc) *
                             shape.c_format.storage_bytes());
    product.workspace = DeviceBuffer(std::max<std::size_t>(product.matmul->workspace_bytes(), 1));
  }
  product.a_scales = DeviceBuffer::from(a_scales);
  product.w_scales = DeviceBuffer::from(w_scales);
  product.c.fill_bytes(0xFF);  // NaN in bf16, fp16 and fp32: an unwritten output fails
  product.matmul->run({product.a_codes.as<void>(), product.a_scales.as<float>(),
                       product.w_codes.as<void>(), product.w_scales.as<float>(),
                       product.c.as<void>(), static_cast<float>(operands.w->global_scale)},
                      product.workspace.as<void>(), product.workspace.bytes(), nullptr);
  synchronize();
}

struct GemmCase {
  std::string scheme;
  bool fast;
  std::int64_t n, k;
  std::vector<std::int64_t> ms;
  std::int64_t ldc_padding = 0;  // C's rows ldc = n + padding apart
};

TEST(CublasLtFp8Gpu, MatchesTheReference) {
  QGEMM_REQUIRE_GPU();
  const std::uint64_t seed = fresh_seed();
  std::printf("seed %llu, cuBLASLt %s\n", static_cast<unsigned long long>(seed),
              runtime::CublasLt::version_text().c_str());
  std::mt19937_64 random(seed);
  runtime::CublasLt cublaslt;
  const std::vector<std::int64_t> all_m = {1, 7, 16, 100, 256};
  const GemmCase cases[] = {
      // tensor x tensor, fast and exact accumulation; K = 2880 is not a multiple of 128
      {"w=e4m3:t:s=fp32;a=e4m3:t;o=bf16", true, 640, 2880, all_m},
      {"w=e4m3:t:s=fp32;a=e4m3:t;o=bf16", false, 4096, 7168, all_m},
      // w8a8-fp8: per token x per channel (outer vectors), strided C
      {"w8a8-fp8", false, 640, 2880, all_m, 16},
      {"w8a8-fp8", true, 4096, 7168, all_m},
      // fp8-block: 1x128 x 128x128; 720 = 5.6 row-blocks, 2816 = 22 K-blocks (padded to 24)
      {"fp8-block", false, 720, 2816, all_m},
      {"fp8-block", false, 4096, 7168, all_m},
      // expansions: a static scale repeated per token, a per-token scale per K-block, channel
      // scales per K-block; e5m2 activations, fp32 and fp16 outputs
      {"w=e4m3:ch:s=fp32;a=e4m3:t;o=bf16", false, 640, 2880, {7, 100}},
      {"w=e4m3:b128x128:s=fp32;a=e4m3:tok;o=bf16", false, 720, 2816, {1, 100}},
      // block scales with a partial last K-block (2880 = 22.5 · 128): allowed by the docs'
      // ceil(k / 128) scale counts, not yet seen run
      {"w=e4m3:b128x128:s=fp32;a=e4m3:tok;o=bf16", false, 640, 2880, {7, 100}},
      {"w=e4m3:ch:s=fp32;a=e5m2:tok;o=fp32", false, 640, 2880, {16, 100}, 4},
      {"w=e4m3:ch:s=fp32;a=e4m3:g128;o=fp16", false, 640, 2816, {7, 256}},
  };
  for (const GemmCase& c : cases) {
    const Scheme scheme = parse_scheme(c.scheme);
    std::string why;
    const auto modes = runtime::fp8_scale_modes(scheme, &why);
    ASSERT_TRUE(modes) << c.scheme << ": " << why;
    const auto w_float = structured_matrix(random, c.n, c.k, 128);
    const PackedWeight w = quantize_weight(scheme.weight, w_float.data(), c.n, c.k);
    const std::vector<double> w_values = dequantize_weight(w);
    const std::vector<float> w_scales = runtime::fp8_weight_scales(w, modes->weight);
    for (std::int64_t m : c.ms) {
      const std::string label = c.scheme + (c.fast ? " fast" : " exact") +
                                " M=" + std::to_string(m) + " N=" + std::to_string(c.n) +
                                " K=" + std::to_string(c.k);
      SCOPED_TRACE(label + ", seed " + std::to_string(seed));
      const Operands operands = make_operands(scheme, w, w_values, m, random);
      const Fp8MatmulShape shape =
          shape_of(scheme, *modes, m, c.n, c.k, c.n + c.ldc_padding, c.fast);
      const bool block = modes->activation == Fp8ScaleMode::Block1x128;
      if (block && m < 16) {  // no algorithm there: the filter must say so
        EXPECT_NE(runtime::fp8_matmul_unsupported_reason(shape).find("m >= 16"),
                  std::string::npos);
        continue;
      }
      ASSERT_EQ(runtime::fp8_matmul_unsupported_reason(shape), "");
      DeviceProduct product;
      try {
        run_product(cublaslt, shape, operands,
                    runtime::fp8_activation_scales(operands.a, modes->activation), w_scales,
                    product);
      } catch (const Error& error) {
        ADD_FAILURE() << "the filter passed a shape cuBLASLt refuses: " << error.what();
        continue;
      }
      const std::size_t bad =
          outside_bounds(product.c, scheme.output, m, c.n, shape.ldc, operands, c.fast, true);
      EXPECT_EQ(bad, 0u) << product.matmul->description();
      std::printf("%-58s %s: %zu outside\n", label.c_str(), product.matmul->description().c_str(),
                  bad);
    }
  }
}

// The test above can fail: fp8-block with its scales in the layouts one might have guessed
// instead (1x128 scales K-block-contiguous per token; 128x128 rows not padded to 4 blocks) must
// be far outside the bounds. Should one of them match instead, the message says which layout
// cuBLASLt reads.
TEST(CublasLtFp8Gpu, WrongScaleLayoutsFail) {
  QGEMM_REQUIRE_GPU();
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  runtime::CublasLt cublaslt;
  const Scheme scheme = parse_scheme("fp8-block");
  const auto modes = *runtime::fp8_scale_modes(scheme);
  const std::int64_t m = 100, n = 720, k = 2816, blocks = 22;
  const auto w_float = structured_matrix(random, n, k, 128);
  const PackedWeight w = quantize_weight(scheme.weight, w_float.data(), n, k);
  const Operands operands = make_operands(scheme, w, dequantize_weight(w), m, random);
  const std::vector<float> right_a = runtime::fp8_activation_scales(operands.a, modes.activation);
  const std::vector<float> right_w = runtime::fp8_weight_scales(w, modes.weight);

  // The canonical grids as they are: A's [m][22] (block-contiguous per token), W's [6][22].
  auto canonical = [](const std::vector<std::uint8_t>& bytes, std::size_t padded_count) {
    std::vector<float> values(std::max(bytes.size() / 4, padded_count), 0.0f);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  };
  const std::vector<float> token_major_a = canonical(operands.a.scales, right_a.size());
  const std::vector<float> unpadded_w = canonical(w.scales, right_w.size());
  ASSERT_EQ(token_major_a.size(), right_a.size());
  ASSERT_EQ(unpadded_w.size(), right_w.size());
  ASSERT_NE(token_major_a, right_a);
  ASSERT_NE(unpadded_w, right_w);
  ASSERT_EQ(w.scales.size(), static_cast<std::size_t>(6 * blocks * 4));

  const Fp8MatmulShape shape = shape_of(scheme, modes, m, n, k, n, false);
  DeviceProduct product;
  const std::size_t outputs = static_cast<std::size_t>(m * n);
  run_product(cublaslt, shape, operands, token_major_a, right_w, product);
  const std::size_t bad_a =
      outside_bounds(product.c, scheme.output, m, n, n, operands, false, false);
  EXPECT_GT(bad_a, outputs / 4) << "1x128 scales K-block-contiguous per token ([m][ceil(k/128)]) "
                                   "matched the reference: that is cuBLASLt's layout";
  run_product(cublaslt, shape, operands, right_a, unpadded_w, product);
  const std::size_t bad_w =
      outside_bounds(product.c, scheme.output, m, n, n, operands, false, false);
  EXPECT_GT(bad_w, outputs / 4) << "128x128 scale rows of 22 blocks, unpadded, matched the "
                                   "reference: cuBLASLt does not pad them to 4 blocks";
  std::printf("wrong layouts: %zu and %zu of %zu outputs outside their bounds\n", bad_a, bad_w,
              outputs);
}

// bf16 values the GPU reads and the host quantizes alike ([m][lda], NaN in the gaps); one row
// all zero when m >= 4 (scale 1, codes 0).
std::vector<float> bf16_activations(std::mt19937_64& random, std::int64_t m, std::int64_t k,
                                    std::int64_t lda, std::vector<std::uint16_t>& bits) {
  auto values = structured_matrix(random, m, k, 1);
  if (m >= 4) std::fill(values.begin() + 3 * k, values.begin() + 4 * k, 0.0f);
  bits.assign(static_cast<std::size_t>(m * lda), 0x7fc0);
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t c = 0; c < k; ++c) {
      float& v = values[static_cast<std::size_t>(r * k + c)];
      const auto code = static_cast<std::uint16_t>(encode(formats::bf16, v));
      bits[static_cast<std::size_t>(r * lda + c)] = code;
      v = static_cast<float>(decode(formats::bf16, code));
    }
  return values;
}

// The scale of (row r, K-block b) in `mode`'s layout, from the host's canonical scales: written
// out from the header's table, not through the code under test.
std::vector<float> expected_scales(const PackedActivation& host, Fp8ScaleMode mode) {
  const std::int64_t m = host.m, blocks = (host.k + 127) / 128;
  auto canonical = [&](std::int64_t r, std::int64_t b) {
    const ScaleGrid grid = host.scale_grid();
    const ActivationScaling scaling = host.quant.scaling;
    const std::int64_t index = scaling == ActivationScaling::StaticTensor   ? 0
                               : scaling == ActivationScaling::DynamicToken ? r
                                                                            : r * grid.cols + b;
    float value;
    std::memcpy(&value, host.scales.data() + index * 4, 4);
    return value;
  };
  switch (mode) {
    case Fp8ScaleMode::Tensor: return {canonical(0, 0)};
    case Fp8ScaleMode::OuterVector: {
      std::vector<float> out(static_cast<std::size_t>(m));
      for (std::int64_t r = 0; r < m; ++r) out[static_cast<std::size_t>(r)] = canonical(r, 0);
      return out;
    }
    default: {
      std::vector<float> out(static_cast<std::size_t>(blocks * m));
      for (std::int64_t b = 0; b < blocks; ++b)
        for (std::int64_t r = 0; r < m; ++r)
          out[static_cast<std::size_t>(b * m + r)] = canonical(r, b);
      return out;
    }
  }
}

// Codes [m][k] and scales in cuBLASLt's layouts from the GPU quantizer, bit for bit the host
// quantizer's; nothing written past either.
TEST(CublasLtFp8Gpu, QuantizerWritesCublasLtScaleLayouts) {
  QGEMM_REQUIRE_GPU();
  const jit::Arch arch = test::device_arch();
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  struct Case {
    const char* quant;
    Fp8ScaleMode mode;
    double static_scale = 0.0;
  };
  const Case cases[] = {
      {"a=e4m3:g128", Fp8ScaleMode::Block1x128},  {"a=e4m3:tok", Fp8ScaleMode::OuterVector},
      {"a=e4m3:tok", Fp8ScaleMode::Block1x128},   {"a=e5m2:tok", Fp8ScaleMode::OuterVector},
      {"a=e4m3:t", Fp8ScaleMode::Tensor, 0.0123}, {"a=e4m3:t", Fp8ScaleMode::OuterVector},
      {"a=e4m3:t", Fp8ScaleMode::Block1x128},
  };
  const std::int64_t k = 2816, lda = k + 8;
  for (const Case& c : cases)
    for (std::int64_t m : {1, 7, 100}) {
      SCOPED_TRACE(std::string(c.quant) + " -> " + runtime::fp8_scale_mode_name(c.mode) +
                   ", M=" + std::to_string(m) + ", seed " + std::to_string(seed));
      const ActivationQuant quant =
          parse_scheme(std::string("w=e4m3:ch:s=fp32;") + c.quant + ";o=bf16").activation;
      std::vector<std::uint16_t> bits;
      const auto values = bf16_activations(random, m, k, lda, bits);
      const PackedActivation host = quantize_activation(quant, values.data(), m, k, c.static_scale);
      const std::vector<float> want = expected_scales(host, c.mode);
      ASSERT_EQ(static_cast<std::int64_t>(want.size()),
                runtime::fp8_scale_layout(c.mode, m, k).count);

      DeviceBuffer input = DeviceBuffer::from(bits), absmax(4);
      DeviceBuffer codes(host.codes.size() + 16), scales((want.size() + 4) * 4);
      codes.fill_bytes(0x5a);
      scales.fill_bytes(0xff);
      auto args = runtime::fp8_quantize_activation_args(quant, c.mode, m, k, input.address(), lda,
                                                        c.static_scale);
      args.codes = codes.as<unsigned char>();
      args.scales = scales.as<unsigned char>();
      args.tensor_absmax = absmax.as<const float>();
      if (runtime::needs_tensor_absmax(quant, c.static_scale))
        runtime::launch_tensor_absmax(load(jit::tensor_absmax_spec(formats::bf16, arch)),
                                      input.address(), m, k, lda, absmax.address(), nullptr);
      runtime::launch_quantize_activation(
          load(jit::quantize_activation_spec(quant, formats::bf16, jit::ActivationEmit::Codes,
                                             formats::bf16, arch)),
          args, nullptr);
      synchronize();

      const auto gpu_codes = codes.to_vector<std::uint8_t>(host.codes.size() + 16);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < host.codes.size(); ++i) differ += gpu_codes[i] != host.codes[i];
      EXPECT_EQ(differ, 0u) << "code bytes differ from the host's";
      for (std::size_t i = host.codes.size(); i < gpu_codes.size(); ++i)
        EXPECT_EQ(gpu_codes[i], 0x5a) << "code byte written past the end";
      const auto gpu_scales = scales.to_vector<std::uint32_t>(want.size() + 4);
      for (std::size_t i = 0; i < want.size(); ++i) {
        std::uint32_t want_bits;
        std::memcpy(&want_bits, &want[i], 4);
        EXPECT_EQ(gpu_scales[i], want_bits) << "scale " << i << " of " << want.size();
      }
      for (std::size_t i = want.size(); i < gpu_scales.size(); ++i)
        EXPECT_EQ(gpu_scales[i], 0xFFFFFFFFu) << "scale written past the layout";
    }
}

// What the engine will run: bf16 A quantized on the GPU into the layouts, then cuBLASLt, both
// captured into one CUDA graph and replayed; the result is the reference of the host-quantized A.
TEST(CublasLtFp8Gpu, QuantizeAndMultiplyReplayFromAGraph) {
  QGEMM_REQUIRE_GPU();
  const jit::Arch arch = test::device_arch();
  const auto& driver = runtime::Driver::get();
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 random(seed);
  runtime::CublasLt cublaslt;
  for (const char* text : {"w8a8-fp8", "fp8-block"})
    for (std::int64_t m : {16, 100}) {
      SCOPED_TRACE(std::string(text) + " M=" + std::to_string(m) + ", seed " +
                   std::to_string(seed));
      const Scheme scheme = parse_scheme(text);
      const auto modes = *runtime::fp8_scale_modes(scheme);
      const std::int64_t n = 720, k = 2816, lda = k + 64;
      const auto w_float = structured_matrix(random, n, k, 128);
      const PackedWeight w = quantize_weight(scheme.weight, w_float.data(), n, k);
      const std::vector<double> w_values = dequantize_weight(w);
      std::vector<std::uint16_t> bits;
      const auto a_float = bf16_activations(random, m, k, lda, bits);
      const Operands operands =
          with_reference(quantize_activation(scheme.activation, a_float.data(), m, k), w, w_values);

      const auto matmul = std::make_unique<Fp8Matmul>(
          Fp8Matmul::prepare(cublaslt, shape_of(scheme, modes, m, n, k, n, false)));
      DeviceBuffer input = DeviceBuffer::from(bits);
      DeviceBuffer a_codes(static_cast<std::size_t>(m * k));
      DeviceBuffer a_scales(
          static_cast<std::size_t>(runtime::fp8_scale_layout(modes.activation, m, k).count) * 4);
      DeviceBuffer w_codes = DeviceBuffer::from(w.codes);
      DeviceBuffer w_scales = DeviceBuffer::from(runtime::fp8_weight_scales(w, modes.weight));
      DeviceBuffer c(static_cast<std::size_t>(m * n) * 2);
      DeviceBuffer workspace(std::max<std::size_t>(matmul->workspace_bytes(), 1));
      auto args = runtime::fp8_quantize_activation_args(scheme.activation, modes.activation, m, k,
                                                        input.address(), lda, 0.0);
      args.codes = a_codes.as<unsigned char>();
      args.scales = a_scales.as<unsigned char>();
      const auto quantizer = load(jit::quantize_activation_spec(
          scheme.activation, formats::bf16, jit::ActivationEmit::Codes, formats::bf16, arch));

      CUstream stream = nullptr;
      driver.check(driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      driver.check(driver.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                   "cuStreamBeginCapture");
      runtime::launch_quantize_activation(quantizer, args, stream);
      matmul->run({a_codes.as<void>(), a_scales.as<float>(), w_codes.as<void>(),
                   w_scales.as<float>(), c.as<void>(), 1.0f},
                  workspace.as<void>(), workspace.bytes(), stream);
      CUgraph graph = nullptr;
      driver.check(driver.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
      CUgraphExec exec = nullptr;
      driver.check(driver.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
      for (int replay = 0; replay < 2; ++replay) {
        a_codes.fill_bytes(0x7f);  // e4m3 NaN
        a_scales.fill_bytes(0xff);
        c.fill_bytes(0xff);
        driver.check(driver.cuGraphLaunch(exec, stream), "cuGraphLaunch");
        driver.check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize");
        EXPECT_EQ(a_codes.to_vector<std::uint8_t>(operands.a.codes.size()), operands.a.codes)
            << "replay " << replay;
        EXPECT_EQ(outside_bounds(c, scheme.output, m, n, n, operands, false, true), 0u)
            << "replay " << replay << ", " << matmul->description();
      }
      driver.cuGraphExecDestroy(exec);
      driver.cuGraphDestroy(graph);
      driver.cuStreamDestroy(stream);
    }
}

// Bad calls are refused with the argument named, before cuBLASLt sees them.
TEST(CublasLtFp8Gpu, RunRefusesMisalignedPointersAndShortWorkspace) {
  QGEMM_REQUIRE_GPU();
  runtime::CublasLt cublaslt;
  const Scheme scheme = parse_scheme("w8a8-fp8");
  const auto modes = *runtime::fp8_scale_modes(scheme);
  Fp8Matmul matmul =
      Fp8Matmul::prepare(cublaslt, shape_of(scheme, modes, 16, 640, 2880, 640, false));
  DeviceBuffer a(16 * 2880 + 16), w(640 * 2880), scales(4096), c(16 * 640 * 2);
  DeviceBuffer workspace(std::max<std::size_t>(matmul.workspace_bytes(), 1));
  Fp8Matmul::Operands operands{a.as<void>(),       scales.as<float>(), w.as<void>(),
                               scales.as<float>(), c.as<void>(),       1.0f};
  auto expect_refused = [&](Fp8Matmul::Operands bad, std::size_t bytes, const char* fragment) {
    try {
      matmul.run(bad, workspace.as<void>(), bytes, nullptr);
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  };
  Fp8Matmul::Operands misaligned = operands;
  misaligned.a = a.as<unsigned char>() + 8;
  expect_refused(misaligned, workspace.bytes(), "16-byte aligned");
  Fp8Matmul::Operands no_scales = operands;
  no_scales.w_scales = nullptr;
  expect_refused(no_scales, workspace.bytes(), "w_scales");
  if (matmul.workspace_bytes() > 0)
    expect_refused(operands, matmul.workspace_bytes() - 1, "workspace");
  // Shapes the filter refuses are refused by prepare too, as Unsupported.
  Fp8MatmulShape odd = shape_of(scheme, modes, 16, 648, 2880, 648, false);
  try {
    Fp8Matmul::prepare(cublaslt, odd);
    ADD_FAILURE() << "n = 648 accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::Unsupported);
    EXPECT_NE(std::string(error.what()).find("n = 648"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace qgemm
