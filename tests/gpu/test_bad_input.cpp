// Bad input at the C++ API (issue #19, item 5): each case gives a qgemm::Error naming the
// argument and the rule, or is served (a misaligned A falls back to a path that takes it; a C of
// any row stride or element alignment is written in place; M = 0 is a no-op), never a crash or
// a silent wrong answer; NaN in the activations stays in its own rows; sizes whose products
// pass 2^31 are addressed in 64 bits; and 10,000 calls of mixed shapes leave device and host
// memory flat (item 6). Fresh random
// inputs (the seed is printed), outputs poisoned before every call.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gemm_check.hpp"
#include "gpu_test_util.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "scoped_env.hpp"

namespace qgemm {
namespace {

using runtime::DeviceBuffer;

std::uint32_t seed() {
  static const std::uint32_t s = [] {
    const std::uint32_t v = std::random_device{}();
    std::printf("seed %u\n", v);
    return v;
  }();
  return s;
}

struct Fixture {
  Scheme scheme = parse_scheme("w4a16");
  std::int64_t n = 256, k = 512;
  PackedWeight packed;
  std::vector<double> w_values;
  std::vector<std::uint16_t> a_bits;
  std::vector<double> a_values;
  explicit Fixture(std::mt19937& rng, std::int64_t m, std::int64_t n_ = 256) : n(n_) {
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> w(static_cast<std::size_t>(n * k));
    for (float& x : w) x = normal(rng);
    packed = quantize_weight(scheme.weight, w.data(), n, k);
    w_values = dequantize_weight(packed);
    std::normal_distribution<double> unit(0.0, 1.0);
    a_bits.resize(static_cast<std::size_t>(m * k));
    a_values.resize(a_bits.size());
    for (std::size_t i = 0; i < a_bits.size(); ++i) {
      a_bits[i] = static_cast<std::uint16_t>(encode(formats::bf16, unit(rng)));
      a_values[i] = decode(formats::bf16, a_bits[i]);
    }
  }
  // Every element of C (m rows) against the reference, with gemm_check's bounds.
  test::OutputCheck check(const std::vector<double>& got, std::int64_t m) const {
    const std::vector<double> expected =
        reference::matmul_nt(a_values.data(), w_values.data(), m, n, k);
    const std::vector<double> bounds =
        test::gemm_bounds(a_values, packed, w_values, m,
                          test::operand_rounding(scheme.activation, formats::bf16),
                          scheme.output, expected);
    return test::check_output(got, expected, bounds, n);
  }
};

template <class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(BadInputGpu, NullNegativeAndShortStridedMatricesNameTheArgument) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed());
  const std::int64_t m = 8;
  Fixture f(rng, m);
  Engine engine(0);
  const QuantWeight w = engine.prepare_weight(f.packed);
  const DeviceBuffer a = DeviceBuffer::from(f.a_bits);
  DeviceBuffer c(static_cast<std::size_t>(m * f.n) * 2);
  const DeviceMatrix good_a{a.as<void>(), m, f.k, f.k, formats::bf16};
  const DeviceMatrix good_c{c.as<void>(), m, f.n, f.n, formats::bf16};
  EXPECT_NE(error_of([&] { engine.gemm({nullptr, m, f.k, f.k, formats::bf16}, w, good_c, nullptr); })
                .find("A is null"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.gemm(good_a, w, {nullptr, m, f.n, f.n, formats::bf16}, nullptr); })
                .find("C is null"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.gemm({a.as<void>(), -1, f.k, f.k, formats::bf16}, w, good_c, nullptr); })
                .find("M >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.gemm({a.as<void>(), m, f.k, f.k - 1, formats::bf16}, w, good_c, nullptr); })
                .find("stride"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.gemm({a.as<void>(), m, f.k - 8, f.k, formats::bf16}, w, good_c, nullptr); })
                .find("expected 8x512"),
            std::string::npos);
}

// M = 0 computes nothing and writes nothing; a 0-row C with rows elsewhere is an error.
TEST(BadInputGpu, ZeroRowsIsANoOp) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed() + 1);
  Fixture f(rng, 1);
  Engine engine(0);
  const QuantWeight w = engine.prepare_weight(f.packed);
  DeviceBuffer a(16), c(static_cast<std::size_t>(f.n) * 2);
  c.fill_bytes(0x7f);
  engine.gemm({a.as<void>(), 0, f.k, f.k, formats::bf16}, w, {c.as<void>(), 0, f.n, f.n, formats::bf16},
              nullptr);
  runtime::Driver::get().check(runtime::Driver::get().cuCtxSynchronize(), "cuCtxSynchronize");
  for (std::uint16_t bits : c.to_vector<std::uint16_t>(static_cast<std::size_t>(f.n)))
    ASSERT_EQ(bits, 0x7f7f);
  EXPECT_NE(error_of([&] {
              engine.gemm({a.as<void>(), 0, f.k, f.k, formats::bf16}, w,
                          {c.as<void>(), 1, f.n, f.n, formats::bf16}, nullptr);
            }).find("as many as A"),
            std::string::npos);
}

// A misaligned A (one element off a 16-byte boundary) is served, by a path that copies it
// element-wise, and its result is right.
TEST(BadInputGpu, MisalignedActivationsAreServedCorrectly) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed() + 2);
  const std::int64_t m = 5;
  Fixture f(rng, m);
  Engine engine(0);
  const QuantWeight w = engine.prepare_weight(f.packed);
  std::vector<std::uint16_t> shifted(f.a_bits.size() + 1, 0);
  std::copy(f.a_bits.begin(), f.a_bits.end(), shifted.begin() + 1);
  const DeviceBuffer a = DeviceBuffer::from(shifted);
  DeviceBuffer c(static_cast<std::size_t>(m * f.n) * 2);
  c.fill_bytes(0xff);
  engine.gemm({a.as<std::uint16_t>() + 1, m, f.k, f.k, formats::bf16}, w,
              {c.as<void>(), m, f.n, f.n, formats::bf16}, nullptr);
  runtime::Driver::get().check(runtime::Driver::get().cuCtxSynchronize(), "cuCtxSynchronize");
  const test::OutputCheck check =
      f.check(check::read_device_values(c, formats::bf16, static_cast<std::size_t>(m * f.n)), m);
  EXPECT_TRUE(check.ok()) << check.describe();
}

// C with an odd N, an odd row stride, a gap between rows, or starting mid-word (2 bytes past
// a 4-byte boundary) is served by every path that takes 16-bit C, each element right and
// nothing outside C's elements written (the poison before it, in the gaps and after it stays).
TEST(BadInputGpu, OddStridedAndMidWordOutputsAreServedCorrectly) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed() + 6);
  const bool sm90 = test::device_arch() == jit::Arch::sm_90a;
  int served = 0;
  for (const std::int64_t m : {5, 40}) {
    Fixture f(rng, m, 255);
    Engine engine(0);
    const QuantWeight w = [&] {
      const test::ScopedEnv every_layout("QGEMM_WGMMA", "1");  // any candidate can be forced
      return engine.prepare_weight(f.packed);
    }();
    const DeviceBuffer a = DeviceBuffer::from(f.a_bits);
    for (const Format& out : {formats::bf16, formats::fp16})
      for (const std::int64_t ldc : {f.n, f.n + 2, f.n + 3})
        for (const std::int64_t offset : {0, 1})  // elements past the buffer's start
          for (const char* candidate : {"", "decode", "medium", "prefill", "wgmma-64", "qdq"}) {
            if (std::string(candidate) == "wgmma-64" && !sm90) continue;
            SCOPED_TRACE(fmt::format("M={} out={} ldc={} offset={} candidate='{}'", m, out.name(),
                                     ldc, offset, candidate));
            const std::size_t elements = static_cast<std::size_t>(offset + m * ldc + 8);
            DeviceBuffer c(elements * 2);
            c.fill_bytes(0x7f);  // 0x7f7f: a pattern no result takes
            GemmOptions options;
            options.candidate = candidate;
            Fixture typed = f;
            typed.scheme.output = out;
            try {
              engine.gemm({a.as<void>(), m, f.k, f.k, formats::bf16}, w,
                          {c.as<std::uint16_t>() + offset, m, f.n, ldc, out}, nullptr, options);
            } catch (const Error& error) {
              // A forced candidate may not serve this M (decode: M <= 16); C's shape must not
              // be the reason.
              ASSERT_EQ(error.code(), ErrorCode::Unsupported) << error.what();
              ASSERT_NE(std::string(candidate), "") << error.what();
              continue;
            }
            runtime::Driver::get().check(runtime::Driver::get().cuCtxSynchronize(),
                                         "cuCtxSynchronize");
            const auto bits = c.to_vector<std::uint16_t>(elements);
            std::vector<double> got;
            for (std::int64_t r = 0; r < m; ++r)
              for (std::int64_t j = 0; j < ldc; ++j) {
                const std::uint16_t value = bits[static_cast<std::size_t>(offset + r * ldc + j)];
                if (j < f.n)
                  got.push_back(decode(out, value));
                else
                  ASSERT_EQ(value, 0x7f7f) << "row " << r << ": the gap after column N written";
              }
            for (std::int64_t i = 0; i < offset; ++i) ASSERT_EQ(bits[i], 0x7f7f);
            for (std::size_t i = static_cast<std::size_t>(offset + m * ldc); i < elements; ++i)
              ASSERT_EQ(bits[i], 0x7f7f) << "written past C";
            const test::OutputCheck check = typed.check(got, m);
            ASSERT_TRUE(check.ok()) << check.describe();
            ++served;
          }
  }
  EXPECT_GT(served, 0);
}

// Row `n` of a packed weight as a weight of its own (codes and scale rows of a per-group grid).
PackedWeight weight_row(const PackedWeight& w, std::int64_t n) {
  PackedWeight row;
  row.quant = w.quant;
  row.n = 1;
  row.k = w.k;
  const auto row_bytes = static_cast<std::size_t>(w.row_bytes());
  row.codes.assign(w.codes.begin() + n * row_bytes, w.codes.begin() + (n + 1) * row_bytes);
  const std::size_t scale_row = static_cast<std::size_t>(w.scale_grid().cols) *
                                static_cast<std::size_t>(w.quant.scale_format.storage_bytes());
  row.scales.assign(w.scales.begin() + n * scale_row, w.scales.begin() + (n + 1) * scale_row);
  return row;
}

// Sizes whose element products pass 2^31 are addressed in 64 bits: an int8 weight of N·K =
// 2.28e9 codes (byte offsets past 2^31 from row 131072 on) and an A of M·K = 2.15e9 values, each
// at a decode M and a tiled M, checked on rows on both sides of the 2^31 boundary against the
// reference of those rows alone. Random codes and scales are drawn directly (no host
// quantization of billions of floats).
TEST(BadInputGpu, ProductsPast2To31AreAddressedIn64Bits) {
  QGEMM_REQUIRE_GPU();
  std::mt19937_64 rng(seed() + 7);
  const Scheme scheme = parse_scheme("w=int8:g128:s=bf16;a=bf16;o=bf16");
  auto random_weight = [&](std::int64_t n, std::int64_t k) {
    PackedWeight w;
    w.quant = scheme.weight;
    w.n = n;
    w.k = k;
    w.codes.resize(static_cast<std::size_t>(n * w.row_bytes()));
    for (std::size_t i = 0; i < w.codes.size(); i += 8) {
      const std::uint64_t bits = rng();
      std::memcpy(w.codes.data() + i, &bits, std::min<std::size_t>(8, w.codes.size() - i));
    }
    const std::size_t scales = static_cast<std::size_t>(w.scale_grid().count());
    std::uniform_real_distribution<double> scale(0.5 / 127, 2.0 / 127);
    for (std::size_t i = 0; i < scales; ++i) {
      const auto bits = static_cast<std::uint16_t>(encode(formats::bf16, scale(rng) / std::sqrt(k)));
      w.scales.push_back(static_cast<std::uint8_t>(bits & 0xFF));
      w.scales.push_back(static_cast<std::uint8_t>(bits >> 8));
    }
    return w;
  };
  // Billions of values: one in 97 drawn ~ N(0, 1), the others from a 7-value cycle (encoded
  // once) that the position shifts, so that no two rows hold the same values.
  auto random_a = [&](std::int64_t m, std::int64_t k) {
    std::array<std::uint16_t, 7> cycle;
    for (int i = 0; i < 7; ++i)
      cycle[static_cast<std::size_t>(i)] =
          static_cast<std::uint16_t>(encode(formats::bf16, 0.5 - 0.125 * i));
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(m * k));
    std::normal_distribution<double> unit(0.0, 1.0);
    for (std::size_t i = 0; i < bits.size(); ++i)
      bits[i] = i % 97 == 0 ? static_cast<std::uint16_t>(encode(formats::bf16, unit(rng)))
                            : cycle[i % 7];
    return bits;
  };
  // Output rows `rows` × columns `cols` of C = A·Wᵀ against the reference of those rows and
  // columns alone (one weight row at a time), each element within its bound.
  auto check = [&](Engine& engine, const PackedWeight& w, const std::vector<std::uint16_t>& a_bits,
                   std::int64_t m, const std::vector<std::int64_t>& rows,
                   const std::vector<std::int64_t>& cols) {
    const QuantWeight prepared = engine.prepare_weight(w);
    const DeviceBuffer a = DeviceBuffer::from(a_bits);
    DeviceBuffer c(static_cast<std::size_t>(m * w.n) * 2);
    c.fill_bytes(0xff);
    engine.gemm({a.as<void>(), m, w.k, w.k, formats::bf16}, prepared,
                {c.as<void>(), m, w.n, w.n, formats::bf16}, nullptr);
    runtime::Driver::get().check(runtime::Driver::get().cuCtxSynchronize(), "cuCtxSynchronize");
    const std::vector<double> got = check::read_device_values(c, formats::bf16, static_cast<std::size_t>(m * w.n));
    for (const std::int64_t col : cols) {
      const PackedWeight one = weight_row(w, col);
      const std::vector<double> w_values = dequantize_weight(one);
      std::vector<double> a_values;
      for (const std::int64_t r : rows)
        for (std::int64_t j = 0; j < w.k; ++j)
          a_values.push_back(decode(formats::bf16, a_bits[static_cast<std::size_t>(r * w.k + j)]));
      const auto count = static_cast<std::int64_t>(rows.size());
      const std::vector<double> expected =
          reference::matmul_nt(a_values.data(), w_values.data(), count, 1, w.k);
      const std::vector<double> bounds = test::gemm_bounds(
          a_values, one, w_values, count, test::operand_rounding(scheme.activation, formats::bf16),
          formats::bf16, expected);
      std::vector<double> column;
      for (const std::int64_t r : rows) column.push_back(got[static_cast<std::size_t>(r * w.n + col)]);
      const test::OutputCheck result = test::check_output(column, expected, bounds, 1);
      ASSERT_TRUE(result.ok()) << "M=" << m << " column " << col << ": " << result.describe();
    }
  };
  Engine engine(0);
  {
    // N·K past 2^31: rows from 131072 on start past byte 2^31 of the codes.
    const std::int64_t n = 139264, k = 16384;
    const PackedWeight w = random_weight(n, k);
    for (const std::int64_t m : {3, 200}) {
      const std::vector<std::uint16_t> a = random_a(m, k);
      check(engine, w, a, m, {0, m - 1}, {0, 1, 131071, 131072, 131073, n - 1});
    }
  }
  {
    // M·K past 2^31: A rows from 131072 on start past element 2^31.
    const std::int64_t m = 131200, k = 16384, n = 128;
    const PackedWeight w = random_weight(n, k);
    const std::vector<std::uint16_t> a = random_a(m, k);
    check(engine, w, a, m, {0, 131071, 131072, m - 1}, {0, n - 1});
  }
}

// NaN and Inf in A stay in their rows (as cuBLAS would give), every other row is right.
TEST(BadInputGpu, NonFiniteActivationsStayInTheirRows) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed() + 3);
  for (std::int64_t m : {1, 16, 200}) {
    Fixture f(rng, m);
    Engine engine(0);
    const QuantWeight w = engine.prepare_weight(f.packed);
    const std::int64_t bad_row = m / 2;
    f.a_bits[static_cast<std::size_t>(bad_row * f.k + 3)] = 0x7fc0;  // NaN
    if (m > 1) f.a_bits[static_cast<std::size_t>(f.k + 7)] = 0x7f80;  // +Inf in row 1
    const DeviceBuffer a = DeviceBuffer::from(f.a_bits);
    DeviceBuffer c(static_cast<std::size_t>(m * f.n) * 2);
    c.fill_bytes(0x00);
    engine.gemm({a.as<void>(), m, f.k, f.k, formats::bf16}, w,
                {c.as<void>(), m, f.n, f.n, formats::bf16}, nullptr);
    runtime::Driver::get().check(runtime::Driver::get().cuCtxSynchronize(), "cuCtxSynchronize");
    const std::vector<double> got =
        check::read_device_values(c, formats::bf16, static_cast<std::size_t>(m * f.n));
    for (std::int64_t j = 0; j < f.n; ++j)
      ASSERT_FALSE(std::isfinite(got[static_cast<std::size_t>(bad_row * f.n + j)]))
          << "M=" << m << " column " << j;
    // The rows without a non-finite value against the reference.
    for (std::int64_t r = 0; r < m; ++r) {
      if (r == bad_row || (m > 1 && r == 1)) continue;
      Fixture one = f;
      one.a_values.assign(f.a_values.begin() + r * f.k, f.a_values.begin() + (r + 1) * f.k);
      const std::vector<double> row(got.begin() + r * f.n, got.begin() + (r + 1) * f.n);
      const test::OutputCheck check = one.check(row, 1);
      ASSERT_TRUE(check.ok()) << "M=" << m << " row " << r << ": " << check.describe();
    }
  }
}

TEST(BadInputGpu, WeightsPlansAndWorkspacesOfSomethingElseAreRefused) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed() + 4);
  const std::int64_t m = 8;
  Fixture f(rng, m);
  Engine engine(0), other(0);
  const QuantWeight w = engine.prepare_weight(f.packed);
  const DeviceBuffer a = DeviceBuffer::from(f.a_bits);
  DeviceBuffer c(static_cast<std::size_t>(m * f.n) * 2);
  const DeviceMatrix am{a.as<void>(), m, f.k, f.k, formats::bf16};
  const DeviceMatrix cm{c.as<void>(), m, f.n, f.n, formats::bf16};
  EXPECT_NE(error_of([&] { other.gemm(am, w, cm, nullptr); }).find("another Engine"),
            std::string::npos);
  GemmProblem problem = gemm_problem(w, 4, formats::bf16, formats::bf16);
  problem.m_max = 6;
  const GemmPlan plan = engine.plan(problem, w);
  EXPECT_NE(error_of([&] { engine.run(plan, am, w, cm, nullptr); }).find("serves M in [4, 6]"),
            std::string::npos);
  const DeviceMatrix a6{a.as<void>(), 6, f.k, f.k, formats::bf16};
  const DeviceMatrix c6{c.as<void>(), 6, f.n, f.n, formats::bf16};
  // A caller's workspace off its 256-byte alignment.
  EXPECT_NE(error_of([&] {
              engine.run(plan, a6, w, c6, nullptr, nullptr, {c.as<char>() + 8, 1 << 20});
            }).find("256-byte aligned"),
            std::string::npos);
  const QuantWeight w2 = engine.prepare_weight(f.packed);
  EXPECT_NE(error_of([&] { engine.run(plan, a6, w2, c6, nullptr); }).find("another prepared weight"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.run(plan, a6, w, {c.as<void>(), 6, f.n, f.n, formats::fp32}, nullptr); })
                .find("C is fp32"),
            std::string::npos);
}

// 10,000 calls of mixed shapes after a warm-up over the same shapes: the device's free memory
// does not fall below, and the process's resident memory stays near, where the warm-up left
// them.
TEST(BadInputGpu, TenThousandMixedCallsKeepMemoryFlat) {
  QGEMM_REQUIRE_GPU();
  std::mt19937 rng(seed() + 5);
  Fixture f(rng, 64);
  Engine engine(0);
  const QuantWeight w = engine.prepare_weight(f.packed);
  const DeviceBuffer a = DeviceBuffer::from(f.a_bits);
  DeviceBuffer c(static_cast<std::size_t>(64 * f.n) * 4);
  const std::int64_t shapes[] = {1, 3, 16, 17, 33, 64};
  const Format outputs[] = {formats::bf16, formats::fp32};
  auto call = [&](int i) {
    const std::int64_t m = shapes[i % 6];
    const Format out = outputs[(i / 6) % 2];
    engine.gemm({a.as<void>(), m, f.k, f.k, formats::bf16}, w, {c.as<void>(), m, f.n, f.n, out},
                nullptr);
  };
  const auto& driver = runtime::Driver::get();
  auto free_device = [&] {
    std::size_t free_bytes = 0, total = 0;
    driver.check(driver.cuMemGetInfo(&free_bytes, &total), "cuMemGetInfo");
    return free_bytes;
  };
  auto resident_bytes = [] {
    std::ifstream statm("/proc/self/statm");
    long pages = 0, resident = 0;
    statm >> pages >> resident;
    return resident * 4096L;
  };
  for (int i = 0; i < 200; ++i) call(i);
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
  const std::size_t device_before = free_device();
  const long host_before = resident_bytes();
  for (int i = 0; i < 10000; ++i) call(i);
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
  // Not below: the calls took nothing more. Free memory may rise meanwhile: the driver can
  // still be releasing the memory of the test process that ran just before (this test runs
  // alone under ctest, RUN_SERIAL, but a finished process's teardown is asynchronous).
  EXPECT_GE(free_device(), device_before);
  EXPECT_LT(resident_bytes() - host_before, 4L << 20);  // allocator noise, not growth per call
}

}  // namespace
}  // namespace qgemm
