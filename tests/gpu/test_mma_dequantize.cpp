// mma_dequantize (kernels/gemm/mma_dequantize.cuh) on the GPU against its host twin: every
// element of every chunk bit for bit equal to layout::mma_weight_value rounded once to the output
// type, the padding columns [K, round_up(K, 8)) zero, and nothing else of the poisoned buffer
// written (columns up to ld_out, rows past the chunk, a guard row on each side). Then its speed
// on Llama-sized weights (printed, not asserted; the output is still checked).
//
// The prepared weight is the host repack (layout::repack_for_mma; the device repack is checked
// against it word for word in MmaRepackGpu), so a failure here is the kernel's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gemm/mma_dequantize_shape.cuh"
#include "gpu_test_util.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"
#include "qgemm/quant.hpp"
#include "qgemm/scheme.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/mma_dequantize_launch.hpp"

namespace qgemm {
namespace {

using runtime::DeviceBuffer;
using Shape = kernels::MmaDequantizeShape;

constexpr std::uint16_t kPoison = 0xFFFF;  // NaN in bf16 and fp16: an unwritten value shows

std::uint32_t fresh_seed() {
  static const std::uint32_t seed = std::random_device{}();
  return seed;
}

void synchronize() {
  const auto& driver = runtime::Driver::get();
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
}

// A weight of N x K as the scheme's weight part quantizes fresh normal values (never zeros).
PackedWeight random_weight(const Scheme& scheme, std::int64_t n, std::int64_t k,
                           std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (float& x : w) {
    x = normal(rng);
    if (x == 0.0f) x = 0.25f;
  }
  return quantize_weight(scheme.weight, w.data(), n, k);
}

// The prepared weight on the device and its kernel.
struct DeviceMma {
  DeviceBuffer words, scales, zeros;
  jit::KernelSpec spec;
  runtime::LoadedKernel kernel;
  DeviceMma(const layout::MmaWeight& host, const Format& out)
      : words(DeviceBuffer::from(host.words)),
        scales(DeviceBuffer::from(host.scales)),
        zeros(host.zeros.empty() ? DeviceBuffer() : DeviceBuffer::from(host.zeros)),
        spec(jit::mma_dequantize_spec(host, out, test::device_arch())),
        kernel(runtime::KernelLoader::global().get(*jit::KernelCache::global().get(spec).kernel)) {}
  kernels::MmaDequantizeArgs args(const layout::MmaWeight& host, std::int64_t n_begin,
                                  std::int64_t rows, std::int64_t ld_out,
                                  unsigned short* out) const {
    kernels::MmaDequantizeArgs a{};
    a.words = words.as<const unsigned>();
    a.scales = scales.as<const float>();
    a.zeros = zeros.bytes() ? zeros.as<const float>() : nullptr;
    a.out = out;
    a.n_begin = n_begin;
    a.rows = rows;
    a.k = host.k;
    a.ld_out = ld_out;
    a.k_blocks = host.k_blocks;
    a.n_padded = host.n_padded;
    return a;
  }
  // Bytes the kernel reads for the whole weight: codes, scales, zeros.
  double read_bytes() const {
    return static_cast<double>(words.bytes() + scales.bytes() + zeros.bytes());
  }
};

// Row n of the host twin, each value rounded once to `out` (bits).
std::vector<std::uint16_t> expected_row(const layout::MmaWeight& host, const Format& out,
                                        std::int64_t n) {
  std::vector<std::uint16_t> row(static_cast<std::size_t>(host.k));
  for (std::int64_t k = 0; k < host.k; ++k)
    row[k] = static_cast<std::uint16_t>(encode(out, layout::mma_weight_value(host, n, k)));
  return row;
}

// Counts (and reports the first few of) the elements of chunk buffer `got` (a guard row, then
// `capacity` rows of ld_out, then a guard row) that are not: the twin's value for k < K of the
// chunk's rows, zero for K <= k < round_up(K, 8), the poison everywhere else.
std::size_t chunk_mismatches(const layout::MmaWeight& host, const Format& out,
                             const std::vector<std::uint16_t>& got, std::int64_t n_begin,
                             std::int64_t rows, std::int64_t capacity, std::int64_t ld_out,
                             const std::string& label) {
  std::size_t bad = 0;
  auto report = [&](std::int64_t buffer_row, std::int64_t k, std::uint16_t value,
                    std::uint16_t want) {
    if (++bad <= 8)
      ADD_FAILURE() << label << ": buffer row " << buffer_row << " (weight row "
                    << n_begin + buffer_row - 1 << ") column " << k << ": got 0x" << std::hex
                    << value << ", expected 0x" << want << std::dec;
  };
  const std::int64_t padded_k = Shape::ld_out(host.k);
  for (std::int64_t buffer_row = 0; buffer_row < capacity + 2; ++buffer_row) {
    const std::int64_t r = buffer_row - 1;  // row of the chunk
    const bool in_chunk = r >= 0 && r < rows;
    const std::vector<std::uint16_t> want =
        in_chunk ? expected_row(host, out, n_begin + r) : std::vector<std::uint16_t>();
    for (std::int64_t k = 0; k < ld_out; ++k) {
      const std::uint16_t value = got[static_cast<std::size_t>(buffer_row * ld_out + k)];
      const std::uint16_t expected = !in_chunk      ? kPoison
                                     : k < host.k   ? want[k]
                                     : k < padded_k ? std::uint16_t{0}
                                                    : kPoison;
      if (value != expected) report(buffer_row, k, value, expected);
    }
  }
  return bad;
}

struct Case {
  std::string scheme;  // weight part, and the activation type = the output type
  std::int64_t n;
  std::vector<std::int64_t> ks;  // odd K; those validate_shape refuses are skipped by name
};

// Every format of the dequantize + cuBLAS path, on N not a multiple of 64, K not a multiple of
// 16 (or of 8), K whose last k tile is partial, and a K with a partial last group where the
// scheme allows one (per-channel, per-tensor and 2-D block scales always do; groups along K
// once validate_shape accepts K % group != 0). Each runs in chunks (128 rows: n_begin 0, 128,
// 256, the last one partial) and as one launch of all rows.
TEST(MmaDequantizeGpu, EveryElementMatchesTheHostTwinBitForBit) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  const int sm_count = runtime::device_info(0).sm_count;
  // (dequant, scale) paths of jit::mma_dequantize_spec in the comments; the spec is printed.
  const std::vector<Case> cases = {
      {"w4a16", 341, {1000, 1024 + 128, 1003}},                   // uint4 g128 mid: int16, half
      {"w=uint4:g128:s=fp16:zp=int;a=fp16", 341, {1152, 1003}},   // GPTQ: int16, half (fp16)
      {"w=uint4:g128:s=fp16:zp=int;a=bf16", 277, {1152}},         // fp16 scales: int16, fp32
      {"w3a16", 341, {1152, 1003}},                               // uint3 g128
      {"w2a16", 213, {1152}},                                     // uint2 g128
      {"w8a16", 341, {1152, 1003}},                               // uint8 g128: int_f32, half
      {"w=uint8:g128:s=bf16:zp=int;a=fp16", 150, {1152}},         // uint8 into fp16: int16
      {"w=int4:g128:s=bf16;a=bf16", 150, {1152}},                 // int4 g128
      {"w=int8:ch:s=fp32;a=bf16", 341, {1003, 1000}},             // int8 per channel: int_f32, fp32
      {"w=e4m3:ch:s=fp32;a=bf16", 341, {1003}},                   // e4m3 per channel: float16, fp32
      {"w=e4m3:ch:s=fp32;a=fp16", 213, {1003}},                   //   into fp16
      {"w=e4m3:b128x128:s=fp32;a=bf16", 341, {1003, 1000}},       // partial last block
      {"mxfp4-a16", 341, {992, 1003}},                            // e2m1 g32 e8m0: float16, half
      {"w=e2m1:g32:s=e8m0;a=fp16", 213, {992}},                   //   into fp16
      {"nvfp4-a16", 341, {1008, 1003}},                           // e2m1 g16 ue4m3 (+global)
      {"w=ternary:t:s=fp32;a=bf16", 341, {1003}},                 // ternary per tensor
      {"w=uint6:g64:s=fp16:zp=float;a=fp16", 213, {1024 + 192}},  // float zeros: fp32, fp32
      {"w=uint4:g48:s=bf16:zp=int;a=bf16", 213, {1008}},          // a group of 48
  };

  for (const Case& c : cases) {
    const Scheme scheme = parse_scheme(c.scheme);
    const Format out = scheme.activation.format;
    for (const std::int64_t k : c.ks) {
      const std::string label = c.scheme + " N=" + std::to_string(c.n) + " K=" + std::to_string(k) +
                                " seed=" + std::to_string(seed);
      SCOPED_TRACE(label);
      PackedWeight packed;
      try {
        packed = random_weight(scheme, c.n, k, rng);
      } catch (const Error& e) {
        std::printf("skipped %s: %s\n", label.c_str(), e.what());  // a partial group, refused
        continue;
      }
      // Both fragment orders (the kernel reads either; SM90 may keep only the wgmma order).
      for (const layout::FragmentOrder order :
           {layout::FragmentOrder::Mma, layout::FragmentOrder::Wgmma}) {
        const layout::MmaWeight host = layout::repack_for_mma(packed, order);
        const DeviceMma device(host, out);
        // ld_out one chunk wider than needed: those columns must stay untouched.
        const std::int64_t ld_out = Shape::ld_out(k) + Shape::kLdOutMultiple;
        for (const std::int64_t chunk : {std::int64_t{128}, c.n}) {
          DeviceBuffer buffer(static_cast<std::size_t>((chunk + 2) * ld_out) * 2);
          for (std::int64_t n_begin = 0; n_begin < c.n; n_begin += chunk) {
            const std::int64_t rows = std::min(chunk, c.n - n_begin);
            buffer.fill_bytes(0xFF);
            runtime::launch_mma_dequantize(
                device.kernel, device.spec,
                device.args(host, n_begin, rows, ld_out, buffer.as<unsigned short>() + ld_out),
                sm_count, nullptr);
            synchronize();
            const auto got =
                buffer.to_vector<std::uint16_t>(static_cast<std::size_t>((chunk + 2) * ld_out));
            const std::size_t bad = chunk_mismatches(
                host, out, got, n_begin, rows, chunk, ld_out,
                label + " chunk " + std::to_string(n_begin) + "+" + std::to_string(rows));
            EXPECT_EQ(bad, 0u) << jit::to_string(device.spec);
          }
        }
        std::printf("ok %-44s N=%-4lld K=%-5lld %s\n", c.scheme.c_str(), static_cast<long long>(c.n),
                    static_cast<long long>(k), jit::to_string(device.spec).c_str());
      }
    }
  }
}

// The kernel's time on Llama-sized weights: one launch over the first N rows (8192 and all
// 28672) of a 28672 x 8192 weight; 2 warm-ups, then the median of 5 batches of 10 back-to-back
// launches timed on the host between synchronizations (kernels of 40 µs and more dwarf the launch
// gaps), as bytes read (the rows' codes, scales and zeros) + 2·N·K written per second.
// Correctness is asserted on the same output (no poison left; the first and last row and 64
// random rows bit for bit); speed is only printed, as
//   dequant-bandwidth <format> <N>x<K> <us> us <TB/s> TB/s
TEST(MmaDequantizeGpu, ReportsItsBandwidthOnLlamaWeights) {
  QGEMM_REQUIRE_GPU();
  const std::uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  const int sm_count = runtime::device_info(0).sm_count;
  struct Timed {
    const char* name;
    const char* scheme;
  };
  const Timed timed[] = {{"uint4-g128", "w4a16"},
                         {"uint8-g128", "w8a16"},
                         {"e4m3-ch", "w=e4m3:ch:s=fp32;a=bf16"},
                         {"e2m1-g32", "mxfp4-a16"}};
  const std::int64_t full_n = 28672, k = 8192;
  for (const Timed& t : timed) {
    const Scheme scheme = parse_scheme(t.scheme);
    const Format out = scheme.activation.format;
    const layout::MmaWeight host = layout::repack_for_mma(random_weight(scheme, full_n, k, rng));
    const DeviceMma device(host, out);
    DeviceBuffer buffer(static_cast<std::size_t>(full_n * k) * 2);
    for (const std::int64_t n : {std::int64_t{8192}, full_n}) {
      const std::string label = std::string(t.name) + " " + std::to_string(n) + "x" +
                                std::to_string(k) + " seed=" + std::to_string(seed);
      SCOPED_TRACE(label);
      buffer.fill_bytes(0xFF);
      const kernels::MmaDequantizeArgs args =
          device.args(host, 0, n, k, buffer.as<unsigned short>());
      auto launch = [&] {
        runtime::launch_mma_dequantize(device.kernel, device.spec, args, sm_count, nullptr);
      };
      launch();
      synchronize();
      // Correctness of this very output: every value written, sampled rows bit for bit.
      const auto got = buffer.to_vector<std::uint16_t>(static_cast<std::size_t>(n * k));
      EXPECT_EQ(std::count(got.begin(), got.end(), kPoison), 0) << "values left poisoned";
      std::vector<std::int64_t> rows = {0, n - 1};
      std::uniform_int_distribution<std::int64_t> pick(0, n - 1);
      for (int i = 0; i < 64; ++i) rows.push_back(pick(rng));
      std::vector<std::future<std::size_t>> checks;
      for (const std::int64_t row : rows)
        checks.push_back(std::async(std::launch::async, [&, row] {
          const std::vector<std::uint16_t> want = expected_row(host, out, row);
          std::size_t bad = 0;
          for (std::int64_t c = 0; c < k; ++c)
            bad += got[static_cast<std::size_t>(row * k + c)] != want[c];
          return bad;
        }));
      std::size_t bad = 0;
      for (auto& check : checks) bad += check.get();
      EXPECT_EQ(bad, 0u) << "sampled values differ from the host twin";

      launch();
      synchronize();
      std::vector<double> per_launch_us;
      for (int batch = 0; batch < 5; ++batch) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i) launch();
        synchronize();
        per_launch_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count() /
            10);
      }
      std::sort(per_launch_us.begin(), per_launch_us.end());
      const double us = per_launch_us[per_launch_us.size() / 2];
      // The first n rows' share of the codes, scales and zeros (all proportional to n_padded).
      const double read = device.read_bytes() * static_cast<double>(n) / full_n;
      const double written = 2.0 * static_cast<double>(n * k);
      const double tbps = (read + written) / (us * 1e-6) / 1e12;
      std::printf(
          "dequant-bandwidth %s %lldx%lld %.1f us %.2f TB/s  (read %.1f MB, written %.1f "
          "MB; %s)\n",
          t.name, static_cast<long long>(n), static_cast<long long>(k), us, tbps, read / 1e6,
          written / 1e6, jit::to_string(device.spec).c_str());
      ::testing::Test::RecordProperty(std::string("dequant-bandwidth ") + t.name + " " +
                                          std::to_string(n) + "x" + std::to_string(k),
                                      std::to_string(us) + " us " + std::to_string(tbps) + " TB/s");
    }
  }
}

}  // namespace
}  // namespace qgemm
