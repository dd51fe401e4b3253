#include "quant/quantize_on_device.hpp"

#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "common/log.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "qgemm/error.hpp"
#include "quant/block_quant.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/utility_kernels.hpp"

namespace qgemm::quant_detail {
namespace {

constexpr const char* kFunction = "quantize_weight";

void check_matrix(const DeviceMatrix& weight) {
  require(weight.data != nullptr, "{}: weight.data is null", kFunction);
  require(weight.rows >= 1 && weight.cols >= 1,
          "{}: weight is [{}, {}] (rule: rows and cols >= 1)", kFunction, weight.rows,
          weight.cols);
  require(weight.stride >= weight.cols, "{}: weight.stride = {} (rule: >= cols = {})", kFunction,
          weight.stride, weight.cols);
  require(weight.dtype == formats::bf16 || weight.dtype == formats::fp16 ||
              weight.dtype == formats::fp32,
          "{}: weight.dtype = {} (rule: bf16, fp16 or fp32)", kFunction, weight.dtype.name());
}

// The value of one element stored in `dtype` (fp32, or a 16-bit code: exact in fp32).
float element_value(const Format& dtype, const unsigned char* stored) {
  float value = 0.0f;
  if (dtype.storage_bytes() == 4)
    std::memcpy(&value, stored, 4);
  else
    value = static_cast<float>(decode(dtype, stored[0] | static_cast<std::uint32_t>(stored[1]) << 8));
  return value;
}

// The rows of `weight` on the host as fp32, for the host quantizer.
std::vector<float> download_as_float(const DeviceMatrix& weight, CUstream stream) {
  const auto& driver = runtime::Driver::get();
  driver.check(driver.cuStreamSynchronize(stream), "quantize_weight: cuStreamSynchronize");
  const std::size_t bytes = weight.dtype.storage_bytes();
  const std::size_t span = static_cast<std::size_t>((weight.rows - 1) * weight.stride + weight.cols);
  std::vector<unsigned char> raw(span * bytes);
  driver.check(driver.cuMemcpyDtoH(raw.data(), reinterpret_cast<CUdeviceptr>(weight.data),
                                   raw.size()),
               "quantize_weight: cuMemcpyDtoH");
  std::vector<float> out(static_cast<std::size_t>(weight.rows * weight.cols));
  for (std::int64_t r = 0; r < weight.rows; ++r)
    for (std::int64_t c = 0; c < weight.cols; ++c)
      out[static_cast<std::size_t>(r * weight.cols + c)] = element_value(
          weight.dtype, raw.data() + static_cast<std::size_t>(r * weight.stride + c) * bytes);
  return out;
}

DeviceQuantizedWeight on_the_host(const DeviceMatrix& weight, const WeightQuant& quant,
                                  CUstream stream) {
  const std::vector<float> values = download_as_float(weight, stream);
  PackedWeight packed = qgemm::quantize_weight(quant, values.data(), weight.rows, weight.cols);
  DeviceQuantizedWeight out = upload_packed_weight(packed);
  out.meta = std::move(packed);
  out.meta.codes.clear();
  out.meta.codes.shrink_to_fit();
  return out;
}

runtime::LoadedKernel step_kernel(const WeightQuant& quant, const Format& input,
                                  const char* step, jit::Arch arch) {
  const auto compiled =
      jit::KernelCache::global().get(jit::quantize_weight_spec(quant, input, step, arch));
  return runtime::KernelLoader::global().get(*compiled.kernel);
}

// What the host reads back after the steps: laid out in one scratch allocation after the pieces.
struct Summary {
  unsigned long long first_bad;
  float tensor_absmax;
  float global_scale;
};

}  // namespace

DeviceQuantizedWeight upload_packed_weight(const PackedWeight& weight) {
  DeviceQuantizedWeight out;
  out.codes = runtime::DeviceBuffer::from(weight.codes);
  out.scales = runtime::DeviceBuffer::from(weight.scales);
  if (!weight.zeros.empty()) out.zeros = runtime::DeviceBuffer::from(weight.zeros);
  return out;
}

std::optional<std::string> device_quantizer_gap(const WeightQuant& quant) {
  const Format& element = quant.format;
  if (element.bits > 8) return fmt::format("weight format {} is wider than 8 bits", element.name());
  if (element.is_float() &&
      (element.specials == FloatSpecials::ExponentOnly || element.mantissa_bits == 0))
    return fmt::format("weight format {} has no mantissa", element.name());
  if (quant.zero_point == ZeroPoint::Float &&
      quant.scale_format.specials == FloatSpecials::ExponentOnly)
    return fmt::format("float zero points in {} scales", quant.scale_format.name());
  return std::nullopt;
}

PackedWeight downloaded(const DeviceQuantizedWeight& canonical) {
  PackedWeight out = canonical.meta;
  out.codes = canonical.codes.to_vector<std::uint8_t>(canonical.codes.bytes());
  return out;
}

DeviceQuantizedWeight quantize_weight_on_device(const DeviceMatrix& weight,
                                                const WeightQuant& quant, jit::Arch arch,
                                                CUstream stream, HostScales host_scales) {
  check_matrix(weight);
  const std::int64_t n = weight.rows, k = weight.cols;
  validate_weight(quant, n, k);
  if (const auto gap = device_quantizer_gap(quant)) {
    log(LogLevel::Info, "quantize_weight {}x{}: on the host ({}; the GPU quantizer does not)", n,
        k, *gap);
    return on_the_host(weight, quant, stream);
  }
  const BlockRule rule = weight_rule(quant, kFunction);
  const ScaleGrid grid = weight_scale_grid(quant, n, k);
  const bool absmean = rule.scale_rule == ScaleRule::AbsMean;
  const int bits = quant.format.bits;
  const std::int64_t scale_bytes = quant.scale_format.storage_bytes();

  DeviceQuantizedWeight out;
  PackedWeight& meta = out.meta;
  meta.quant = quant;
  meta.n = n;
  meta.k = k;
  const std::int64_t row_bytes = meta.row_bytes();
  const std::int64_t zero_row_bytes = packed_bytes(grid.cols, bits);
  out.codes = runtime::DeviceBuffer(static_cast<std::size_t>(n * row_bytes));
  out.scales = runtime::DeviceBuffer(static_cast<std::size_t>(grid.count() * scale_bytes));
  if (quant.zero_point == ZeroPoint::Integer)
    out.zeros = runtime::DeviceBuffer(static_cast<std::size_t>(grid.rows * zero_row_bytes));
  else if (quant.zero_point == ZeroPoint::Float)
    out.zeros = runtime::DeviceBuffer(static_cast<std::size_t>(grid.count() * scale_bytes));

  // Scratch: the pieces' sums (8-byte aligned, first), minima, maxima, then the summary.
  const auto pieces = static_cast<std::size_t>(n * grid.cols);
  const std::size_t sums_bytes = absmean ? pieces * sizeof(double) : 0;
  const std::size_t summary_offset = sums_bytes + 2 * pieces * sizeof(float);
  const std::size_t summary_at = (summary_offset + 7) / 8 * 8;
  runtime::DeviceBuffer scratch(summary_at + sizeof(Summary));
  const CUdeviceptr base = scratch.address();

  kernels::QuantizeWeightArgs args{};
  args.input = weight.data;
  args.ld = weight.stride;
  args.n = n;
  args.k = k;
  args.grid_rows = grid.rows;
  args.grid_cols = grid.cols;
  args.rows_per = grid.rows_per;
  args.cols_per = grid.cols_per;
  args.piece_sum_abs = absmean ? reinterpret_cast<double*>(base) : nullptr;
  args.piece_min = reinterpret_cast<float*>(base + sums_bytes);
  args.piece_max = reinterpret_cast<float*>(base + sums_bytes + pieces * sizeof(float));
  auto* summary = reinterpret_cast<Summary*>(base + summary_at);
  args.first_bad = &summary->first_bad;
  args.tensor_absmax = &summary->tensor_absmax;
  args.global_scale = &summary->global_scale;
  args.second_level = rule.second_level ? 1 : 0;
  args.second_level_denominator = absmax_denominator(rule) * rule.scale_format.max_finite();
  args.codes = out.codes.as<unsigned char>();
  args.row_bytes = row_bytes;
  args.scales = out.scales.as<unsigned char>();
  args.zeros = out.zeros.bytes() ? out.zeros.as<unsigned char>() : nullptr;
  args.zero_row_bytes = zero_row_bytes;
  args.vector8 = k % 8 == 0 && weight.stride % 8 == 0 &&
                 reinterpret_cast<std::uintptr_t>(weight.data) % 16 == 0;

  const auto& driver = runtime::Driver::get();
  // first_bad: all ones (none); tensor_absmax: +0.
  const Summary initial{std::numeric_limits<unsigned long long>::max(), 0.0f, 1.0f};
  static_assert(sizeof(Summary) % 4 == 0);
  std::uint32_t words[sizeof(Summary) / 4];
  std::memcpy(words, &initial, sizeof(Summary));
  for (std::size_t i = 0; i < sizeof(Summary) / 4; ++i)
    driver.check(driver.cuMemsetD32Async(base + summary_at + 4 * i, words[i], 1, stream),
                 "quantize_weight: cuMemsetD32Async");
  const struct {
    const char* name;
    kernels::WeightQuantizeStep step;
  } steps[] = {{"stats", kernels::kWeightStats},
               {"cells", kernels::kWeightCells},
               {"codes", kernels::kWeightCodes}};
  for (const auto& s : steps)
    runtime::launch_quantize_weight(step_kernel(quant, weight.dtype, s.name, arch), args, s.step,
                                    stream);
  driver.check(driver.cuStreamSynchronize(stream), "quantize_weight: cuStreamSynchronize");

  Summary result{};
  driver.check(driver.cuMemcpyDtoH(&result, base + summary_at, sizeof(Summary)),
               "quantize_weight: cuMemcpyDtoH");
  if (result.first_bad != std::numeric_limits<unsigned long long>::max()) {
    const auto bad = static_cast<std::int64_t>(result.first_bad);
    const std::int64_t r = bad / k, c = bad % k;
    const std::size_t bytes = weight.dtype.storage_bytes();
    unsigned char stored[4] = {};
    driver.check(driver.cuMemcpyDtoH(stored,
                                     reinterpret_cast<CUdeviceptr>(weight.data) +
                                         static_cast<std::size_t>(r * weight.stride + c) * bytes,
                                     bytes),
                 "quantize_weight: cuMemcpyDtoH");
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: weight[{}, {}] = {} is not finite (rule: NaN and Inf cannot be "
                            "quantized)",
                            kFunction, r, c, element_value(weight.dtype, stored)));
  }
  meta.global_scale = result.global_scale;
  if (host_scales == HostScales::Copy) {
    meta.scales = out.scales.to_vector<std::uint8_t>(out.scales.bytes());
    if (out.zeros.bytes()) meta.zeros = out.zeros.to_vector<std::uint8_t>(out.zeros.bytes());
  }
  return out;
}

}  // namespace qgemm::quant_detail
