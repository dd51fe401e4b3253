#include "layout/mma_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "gemm/mma_weight_layout.cuh"
#include "gemm/wgmma_weight_layout.cuh"
#include "qgemm/error.hpp"
#include "quant/block_quant.hpp"
#include "quant/parallel.hpp"
#include "util/scale_exactness.cuh"

namespace qgemm::layout {
namespace {

using kernels::MmaWeightLayout;
using kernels::WgmmaWeightLayout;

// Calls f with the layout struct of `order` (both share the repack's view: kUnitK,
// kUnitThreads, n_of, k_of, thread_of, code_of, word_index, scale_column).
template <class F>
decltype(auto) with_layout(FragmentOrder order, F&& f) {
  if (order == FragmentOrder::Wgmma) return f(WgmmaWeightLayout{});
  return f(MmaWeightLayout{});
}

// The unsigned code the kernel sees: signed integers move to offset binary (q + 2^(b-1)).
std::uint32_t offset_code(const Format& format, std::uint32_t code) {
  if (format.is_integer() && format.is_signed)
    return static_cast<std::uint32_t>(static_cast<std::int64_t>(decode(format, code)) +
                                      (std::int64_t{1} << (format.bits - 1)));
  return code;
}

// Scales and float zeros are stored as codes of the scale format, storage_bytes() each
// (quant.hpp): element `index` of the scale grid.
double read_scale_value(const std::vector<std::uint8_t>& stored, const Format& format,
                        std::int64_t index) {
  return decode(format, read_code(stored.data(), index, 8 * format.storage_bytes()));
}

}  // namespace

const char* fragment_order_name(FragmentOrder order) {
  return order == FragmentOrder::Wgmma ? "wgmma" : "mma";
}

std::int64_t scale_column(FragmentOrder order, std::int64_t n) {
  return with_layout(order, [&](auto layout) { return decltype(layout)::scale_column(n); });
}

std::int64_t stored_k_blocks(FragmentOrder order, std::int64_t k) {
  return order == FragmentOrder::Wgmma ? 4 * WgmmaWeightLayout::k_chunks(k)
                                       : MmaWeightLayout::k_blocks(k);
}

const char* mma_zero_mode_name(MmaZeroMode mode) {
  switch (mode) {
    case MmaZeroMode::None: return "none";
    case MmaZeroMode::Constant: return "constant";
    case MmaZeroMode::Integer: return "int";
    case MmaZeroMode::Float: return "float";
  }
  return "?";
}

std::optional<std::string> mma_unsupported_reason(const WeightQuant& q) {
  if (q.format.bits > 8)
    return fmt::format("weight format {} is wider than 8 bits", q.format.name());
  if (q.format.is_float() && q.format.mantissa_bits > 23)
    return fmt::format("weight format {} has more mantissa bits than fp32", q.format.name());
  if (q.format.is_float() && q.format.bias > 126)
    return fmt::format("weight format {} has a bias above 126", q.format.name());
  if (q.granularity == WeightGranularity::Group && q.group % MmaWeightLayout::kBlockK != 0)
    return fmt::format("weight group {} is not a multiple of 16", q.group);
  if (q.granularity == WeightGranularity::Block && q.block_k % MmaWeightLayout::kBlockK != 0)
    return fmt::format("weight block K {} is not a multiple of 16", q.block_k);
  return std::nullopt;
}

MmaWeight mma_shape(const WeightQuant& q, std::int64_t n, std::int64_t k, double global_scale,
                    FragmentOrder order) {
  if (auto reason = mma_unsupported_reason(q))
    throw Error(ErrorCode::Unsupported, "mma layout: " + *reason);
  // The kernels index rows, columns and k16 blocks in int.
  if (n + 64 > 0x7fffffff || k + 16 > 0x7fffffff)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("mma layout: weight {}x{} exceeds 2^31 - 1 rows or columns", n, k));
  MmaWeight out;
  out.order = order;
  out.format = q.format;
  out.n = n;
  out.k = k;
  out.n_padded = MmaWeightLayout::padded_n(n);
  out.k_blocks = stored_k_blocks(order, k);
  out.global_scale = global_scale;
  switch (q.granularity) {
    case WeightGranularity::Group: out.group_size = q.group; break;
    case WeightGranularity::Block: out.group_size = q.block_k; break;
    default: out.group_size = 0;
  }
  out.groups =
      out.group_size == 0 ? 1 : static_cast<int>((k + out.group_size - 1) / out.group_size);
  if (q.format.is_integer()) {
    switch (q.zero_point) {
      case ZeroPoint::None:
        out.zero_mode = q.format.is_signed ? MmaZeroMode::Constant : MmaZeroMode::None;
        break;
      case ZeroPoint::Midpoint: out.zero_mode = MmaZeroMode::Constant; break;
      case ZeroPoint::Integer: out.zero_mode = MmaZeroMode::Integer; break;
      case ZeroPoint::Float: out.zero_mode = MmaZeroMode::Float; break;
    }
  }
  return out;
}

bool packed16_scale_exact(double scale, const Format& type, int bits) {
  return kernels::packed16_scale_exact(
      scale, {type.mantissa_bits, type.min_normal(), type.max_finite()}, bits);
}

MmaWeight mma_metadata(const PackedWeight& w, FragmentOrder order) {
  quant_detail::check_packed_weight_metadata(w, "mma layout");  // the codes may be on the device
  const WeightQuant& q = w.quant;
  const int bits = q.format.bits;
  MmaWeight out = mma_shape(q, w.n, w.k, w.global_scale, order);

  const ScaleGrid grid = w.scale_grid();
  // One parallel pass over the scales for both types.
  std::atomic<bool> bf16_exact{true}, fp16_exact{true};
  auto check = [&](double s) {
    if (!packed16_scale_exact(s, formats::bf16, bits)) bf16_exact = false;
    if (!packed16_scale_exact(s, formats::fp16, bits)) fp16_exact = false;
  };
  const int scale_bytes = q.scale_format.storage_bytes();
  if (scale_bytes <= 2) {
    // Scales of ≤ 16 bits: check each distinct code once.
    std::vector<std::uint8_t> seen(std::size_t{1} << (8 * scale_bytes), 0);
    for (std::int64_t i = 0; i < grid.count(); ++i)
      seen[scale_bytes == 1 ? w.scales[i]
                            : w.scales[2 * i] | static_cast<unsigned>(w.scales[2 * i + 1]) << 8] =
          1;
    for (std::uint32_t code = 0; code < seen.size(); ++code)
      if (seen[code]) check(decode(q.scale_format, code));
  } else {
    quant_detail::parallel_rows(grid.count(), 1, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t i = first; i < last; ++i)
        check(read_scale_value(w.scales, q.scale_format, i));
    });
  }
  out.scales_exact_in_bf16 = bf16_exact;
  out.scales_exact_in_fp16 = fp16_exact;
  return out;
}

MmaWeight repack_for_mma(const PackedWeight& w, FragmentOrder order) {
  check_packed_weight(w, "mma layout");
  MmaWeight out = mma_metadata(w, order);
  const WeightQuant& q = w.quant;
  const int bits = q.format.bits;

  // Codes: every (slice, unit of K, thread) owns 32 codes in `bits` words.
  const std::int64_t slices = out.n_padded / MmaWeightLayout::kSliceN;
  out.words.assign(slices * out.k_blocks * 32 * bits, 0u);
  const std::int64_t row_bytes = w.row_bytes();
  with_layout(order, [&](auto layout) {
    using L = decltype(layout);
    const std::int64_t units = out.k_blocks * 16 / L::kUnitK;
    quant_detail::parallel_rows(
        slices, out.k_blocks * 16 * 64, [&](std::int64_t first, std::int64_t last) {
          for (std::int64_t slice = first; slice < last; ++slice)
            for (std::int64_t unit = 0; unit < units; ++unit)
              for (int thread = 0; thread < L::kUnitThreads; ++thread) {
                std::uint32_t* thread_words =
                    out.words.data() + L::word_index(slice, unit, units, thread, bits);
                for (int c = 0; c < 32; ++c) {
                  const std::int64_t n = slice * 64 + L::n_of(thread, c);
                  const std::int64_t k = unit * L::kUnitK + L::k_of(thread, c);
                  std::uint32_t code = 0;  // padding: code 0 is a finite value of every format
                  if (n < w.n && k < w.k)
                    code =
                        offset_code(q.format, read_code(w.codes.data() + n * row_bytes, k, bits));
                  const int word = MmaWeightLayout::code_word(c, bits);
                  const int first = MmaWeightLayout::code_bits_in_first_word(c, bits);
                  thread_words[word] |= (code & ((1u << first) - 1u))
                                        << MmaWeightLayout::code_shift(c, bits);
                  if (first < bits) thread_words[word + 1] |= (code >> first) << (16 * (c % 2));
                }
              }
        });
  });

  // Scales and zeros: one fp32 row per group, columns permuted per slice.
  const ScaleGrid grid = w.scale_grid();
  const bool stored_zeros = out.stores_zeros();
  out.scales.assign(static_cast<std::size_t>(out.groups) * out.n_padded, 0.0f);
  if (stored_zeros) out.zeros.assign(out.scales.size(), 0.0f);
  const double signed_offset = q.format.is_signed ? std::ldexp(1.0, bits - 1) : 0.0;
  for (int g = 0; g < out.groups; ++g)
    for (std::int64_t n = 0; n < w.n; ++n) {
      // The canonical scale covering (n, first k of this group).
      const std::int64_t k =
          static_cast<std::int64_t>(g) * (out.group_size == 0 ? 0 : out.group_size);
      const std::int64_t index = (n / grid.rows_per) * grid.cols + k / grid.cols_per;
      const std::size_t at =
          static_cast<std::size_t>(g) * out.n_padded + scale_column(order, n);
      out.scales[at] = static_cast<float>(read_scale_value(w.scales, q.scale_format, index));
      if (out.zero_mode == MmaZeroMode::Integer) {
        const double z = static_cast<double>(
            read_code(w.zeros.data() + (index / grid.cols) * ((grid.cols * bits + 7) / 8),
                      index % grid.cols, bits));
        out.zeros[at] = static_cast<float>(z);
      } else if (out.zero_mode == MmaZeroMode::Float) {
        out.zeros[at] =
            static_cast<float>(read_scale_value(w.zeros, q.scale_format, index) + signed_offset);
      }
    }
  return out;
}

bool packed16_dequant_applies(const MmaWeight& w, const Format& activation) {
  if (!w.format.is_integer() || w.format.bits > 7 || w.zero_mode == MmaZeroMode::Float)
    return false;
  return activation == formats::bf16 ? w.scales_exact_in_bf16 : w.scales_exact_in_fp16;
}

namespace {

// unscaled_dequant's verdict for a weight format against an activation type (its float rule
// walks every code, so each pair is judged once per process).
struct UnscaledVerdict {
  std::optional<std::string> dequant;
  std::string why;  // when refused
};

UnscaledVerdict judge_unscaled_dequant(const Format& f, const Format& activation) {
  auto refuse = [&](std::string reason) {
    return UnscaledVerdict{std::nullopt, std::move(reason)};
  };
  auto accept = [](const char* dequant) { return UnscaledVerdict{std::string(dequant), {}}; };
  const bool bf16 = activation == formats::bf16;
  if (!bf16 && activation != formats::fp16)
    return refuse(fmt::format("activation {} is not bf16 or fp16", activation.name()));
  if (f.is_integer()) {
    // base + u must be exact: 8 significant bits in bf16, 11 in fp16.
    if (f.bits <= (bf16 ? 7 : 8)) return accept("int16");
    if (f.bits == 8) return accept("int_f32");
    return refuse(fmt::format("{}-bit integers", f.bits));
  }
  if (f.specials == FloatSpecials::ExponentOnly)
    return refuse(fmt::format("{} has no mantissa field to place", f.name()));
  if (f.mantissa_bits > activation.mantissa_bits)
    return refuse(fmt::format("{} has more mantissa bits than {}", f.name(), activation.name()));
  const int act_bias = activation.bias, rebias_field = 2 * act_bias - f.bias;
  if (rebias_field < 1 || rebias_field > 2 * act_bias)
    return refuse(
        fmt::format("2^({} - {}) is not a normal {}", act_bias, f.bias, activation.name()));
  const int top_exponent = (1 << activation.exponent_bits) - 1;
  for (std::uint32_t code = 0; code < (1u << f.bits); ++code) {
    const double v = decode(f, code);
    if (!std::isfinite(v)) continue;
    const int exponent =
        static_cast<int>((code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1));
    if (exponent >= top_exponent || round_to(activation, v) != v)
      return refuse(fmt::format("{} value {} is not exact in {} by placement", f.name(), v,
                                activation.name()));
  }
  return accept("float16");
}

}  // namespace

std::optional<std::string> unscaled_dequant(const MmaWeight& w, const Format& activation,
                                            std::string* why) {
  using Key = std::pair<std::string, std::string>;
  static std::mutex mutex;
  static std::map<Key, UnscaledVerdict> verdicts;
  Key key{w.format.name(), activation.name()};
  std::lock_guard lock(mutex);
  auto found = verdicts.find(key);
  if (found == verdicts.end())
    found = verdicts.emplace(std::move(key), judge_unscaled_dequant(w.format, activation)).first;
  if (!found->second.dequant && why) *why = found->second.why;
  return found->second.dequant;
}

std::optional<std::string> byte_dequant(const MmaWeight& w, const Format& activation,
                                        std::string* why) {
  auto refuse = [&](std::string reason) -> std::optional<std::string> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  const Format& f = w.format;
  if (activation == formats::int8) {
    // s8 x u8: the codes as they are, the zero point taken off the sums (exact in s32).
    if (!f.is_integer())
      return refuse(
          fmt::format("int8 activations need integer weights ({} is a float format)", f.name()));
    if (w.zero_mode == MmaZeroMode::Float)
      return refuse("float zero points with int8 activations (u − zero is not an integer)");
    return std::string("bytes");
  }
  if (activation != formats::e4m3)
    return refuse(fmt::format("activation {} is not int8 or e4m3", activation.name()));
  if (f == formats::e4m3) return std::string("bytes");
  if (f.is_integer()) {
    // u − zero goes into the operand: exact in e4m3 for |u − zero| ≤ 16 (4 significant bits).
    if (f.bits > 4) return refuse(fmt::format("{}-bit integers are not exact in e4m3", f.bits));
    if (w.zero_mode == MmaZeroMode::Float)
      return refuse("float zero points make u − zero inexact in e4m3");
    return std::string("bytes_int16");
  }
  std::string unscaled_why;
  if (unscaled_dequant(w, formats::fp16, &unscaled_why) != std::optional<std::string>("float16"))
    return refuse(fmt::format("{} has no exact fp16 placement: {}", f.name(), unscaled_why));
  // Every code is judged once per format and process (the engine asks on every call).
  static std::mutex mutex;
  static std::map<std::string, std::string> inexact;  // format -> the first value e4m3 misses
  std::lock_guard lock(mutex);
  auto found = inexact.find(f.name());
  if (found == inexact.end()) {
    std::string miss;
    for (std::uint32_t code = 0; code < (1u << f.bits) && miss.empty(); ++code) {
      const double v = decode(f, code);
      if (std::isfinite(v) && round_to(formats::e4m3, v) != v) miss = fmt::format("{}", v);
    }
    found = inexact.emplace(f.name(), miss).first;
  }
  if (!found->second.empty())
    return refuse(fmt::format("{} value {} is not exact in e4m3", f.name(), found->second));
  return std::string("bytes_float16");
}

double mma_weight_value(const MmaWeight& w, std::int64_t n, std::int64_t k) {
  const int bits = w.format.bits;
  std::uint32_t code = 0;
  std::size_t column = 0;
  with_layout(w.order, [&](auto layout) {
    using L = decltype(layout);
    const std::int64_t slice = n / 64, unit = k / L::kUnitK;
    const int nn = static_cast<int>(n % 64), kk = static_cast<int>(k % L::kUnitK);
    const int thread = L::thread_of(nn, kk), c = L::code_of(nn, kk);
    const std::uint32_t* thread_words =
        w.words.data() + L::word_index(slice, unit, w.k_blocks * 16 / L::kUnitK, thread, bits);
    const int word = L::code_word(c, bits);
    const int first = L::code_bits_in_first_word(c, bits);
    code = (thread_words[word] >> L::code_shift(c, bits)) & ((1u << first) - 1u);
    if (first < bits)
      code |= ((thread_words[word + 1] >> (16 * (c % 2))) & ((1u << (bits - first)) - 1u))
              << first;
    column = static_cast<std::size_t>(L::scale_column(n));
  });
  // K padding past the last group (the wgmma order's chunks of 64) takes the last row, as the
  // kernels clamp it.
  const int g =
      w.group_size == 0 ? 0 : std::min(static_cast<int>(k / w.group_size), w.groups - 1);
  const std::size_t at = static_cast<std::size_t>(g) * w.n_padded + column;
  const double scale = w.scales[at];
  if (w.format.is_float()) return decode(w.format, code) * scale;
  double value = code;
  switch (w.zero_mode) {
    case MmaZeroMode::None: break;
    case MmaZeroMode::Constant: value -= std::ldexp(1.0, bits - 1); break;
    case MmaZeroMode::Integer:
    case MmaZeroMode::Float: value -= w.zeros[at]; break;
  }
  return value * scale;
}

}  // namespace qgemm::layout
