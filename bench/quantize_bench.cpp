// qgemm_quantize_bench: the GPU weight quantizer (issue #18's >= 100 GB/s), on bf16 weights of
// random values already in device memory. Per scheme and shape, medians of the repeats, each
// from the host call to its return (both synchronize):
//   quantize  quantize_weight_on_device: the three steps, its allocations and the small
//             read-back (summary, scales, zeros)
//   repack    both device repacks of the quantized weight (mma layout and wgmma order, each
//             with its allocations and scale flags): the rest of prepare's device work
//   prepare   Engine::prepare_weight(DeviceMatrix, ...): quantize, then the kernel layouts
//             the selector keeps
// GB/s = bf16 input bytes / time. A first untimed call compiles the kernels.
//
//   build/bench/qgemm_quantize_bench [--quick] [--scheme NAME]   (one scheme: for ncu)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "layout/mma_repack_gpu.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "quant/quantize_on_device.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"

namespace {

// Random bf16 values of both signs with exponents 2^-8 .. 2^-1 (a weight's range), fast.
std::vector<std::uint16_t> random_bf16(std::size_t count) {
  std::vector<std::uint16_t> out(count);
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  for (std::size_t i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const auto bits = static_cast<std::uint32_t>(state);
    const std::uint32_t exponent = 119 + (bits >> 8) % 8;  // biased: 2^-8 .. 2^-1
    out[i] = static_cast<std::uint16_t>((bits & 0x8000u) | exponent << 7 | (bits & 0x7fu));
  }
  return out;
}

template <typename F>
double median_ms(int repeats, F&& call) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* only_scheme = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--scheme") == 0 && i + 1 < argc) {
      only_scheme = argv[++i];
    } else {
      std::fprintf(stderr, "usage: qgemm_quantize_bench [--quick] [--scheme NAME]\n");
      return 2;
    }
  }
  try {
    qgemm::Engine engine(0);
    const auto arch = qgemm::jit::arch_for_device(qgemm::runtime::device_info(0).major,
                                                  qgemm::runtime::device_info(0).minor);
    struct Shape {
      std::int64_t n, k;
    };
    const std::vector<Shape> shapes =
        quick ? std::vector<Shape>{{8192, 8192}} : std::vector<Shape>{{8192, 8192}, {28672, 8192}};
    const char* schemes[] = {"w4a16",    "w4a16-zp",  "w3a16",     "w8a16",  "nvfp4",
                             "mxfp4-a16", "fp8-block", "w8a8-fp8", "bitnet"};
    const int repeats = quick ? 3 : 5;
    std::printf("%-10s %-12s %12s %9s %10s %12s %9s\n", "scheme", "shape", "quantize_ms", "GB/s",
                "repack_ms", "prepare_ms", "GB/s");
    for (const Shape& shape : shapes) {
      const std::size_t count = static_cast<std::size_t>(shape.n * shape.k);
      const qgemm::runtime::DeviceBuffer input =
          qgemm::runtime::DeviceBuffer::from(random_bf16(count));
      const qgemm::DeviceMatrix weight{reinterpret_cast<void*>(input.address()), shape.n,
                                       shape.k, shape.k, qgemm::formats::bf16};
      const double gigabytes = static_cast<double>(count) * 2 / 1e9;
      for (const char* name : schemes) {
        if (only_scheme && std::strcmp(name, only_scheme) != 0) continue;
        const qgemm::Scheme scheme = qgemm::parse_scheme(name);
        auto quantize = [&] {
          qgemm::quant_detail::quantize_weight_on_device(weight, scheme.weight, arch, nullptr);
        };
        auto prepare = [&] { engine.prepare_weight(weight, scheme.weight, scheme.activation); };
        const qgemm::quant_detail::DeviceQuantizedWeight quantized =
            qgemm::quant_detail::quantize_weight_on_device(weight, scheme.weight, arch, nullptr);
        auto repack = [&] {
          const qgemm::layout::CanonicalOnDevice source{
              quantized.codes.address(), quantized.scales.address(), quantized.zeros.address()};
          for (const auto order :
               {qgemm::layout::FragmentOrder::Mma, qgemm::layout::FragmentOrder::Wgmma})
            qgemm::layout::repack_for_mma_on_device(quantized.meta, source, arch, nullptr, order);
        };
        quantize();  // compiles
        prepare();
        double repack_ms = 0;
        try {
          repack();
          repack_ms = median_ms(repeats, repack);
        } catch (const qgemm::Error&) {  // a weight neither layout takes (reported as 0)
        }
        const double quantize_ms = median_ms(repeats, quantize);
        const double prepare_ms = median_ms(repeats, prepare);
        const std::string dims = std::to_string(shape.n) + "x" + std::to_string(shape.k);
        std::printf("%-10s %-12s %12.2f %9.0f %10.2f %12.2f %9.0f\n", name, dims.c_str(),
                    quantize_ms, gigabytes / (quantize_ms / 1e3), repack_ms, prepare_ms,
                    gigabytes / (prepare_ms / 1e3));
        std::fflush(stdout);
      }
    }
  } catch (const qgemm::Error& e) {
    std::fprintf(stderr, "qgemm_quantize_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
