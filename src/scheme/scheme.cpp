// Schemes: presets, the compact text form, validation and scale grids (include/qgemm/scheme.hpp).
#include "qgemm/scheme.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "qgemm/error.hpp"

namespace qgemm {
namespace {

std::string trim(std::string_view text) {
  auto begin = text.find_first_not_of(" \t\n");
  if (begin == std::string_view::npos) return {};
  auto end = text.find_last_not_of(" \t\n");
  return std::string(text.substr(begin, end - begin + 1));
}

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    auto at = text.find(separator, start);
    parts.push_back(trim(text.substr(start, at - start)));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return parts;
}

// Cells along an edge of `size` values, `per` to a cell; the last cell may be partial.
std::int64_t ceil_div(std::int64_t size, std::int64_t per) { return (size + per - 1) / per; }

bool is_one_of(const Format& f, std::initializer_list<Format> allowed) {
  return std::find(allowed.begin(), allowed.end(), f) != allowed.end();
}

int parse_positive(std::string_view text, std::string_view what, std::string_view context) {
  int value = 0;
  bool ok = !text.empty() && text.size() <= 7;
  for (char c : text) ok = ok && std::isdigit(static_cast<unsigned char>(c));
  if (ok) value = std::stoi(std::string(text));
  if (!ok || value <= 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("scheme '{}': {} '{}' is not a positive integer", context, what, text));
  return value;
}

const char* zero_point_name(ZeroPoint z) {
  switch (z) {
    case ZeroPoint::None: return "none";
    case ZeroPoint::Midpoint: return "mid";
    case ZeroPoint::Integer: return "int";
    case ZeroPoint::Float: return "float";
  }
  return "?";
}

std::string weight_granularity_text(const WeightQuant& w) {
  switch (w.granularity) {
    case WeightGranularity::PerTensor: return "t";
    case WeightGranularity::PerChannel: return "ch";
    case WeightGranularity::Group: return fmt::format("g{}", w.group);
    case WeightGranularity::Block: return fmt::format("b{}x{}", w.block_n, w.block_k);
  }
  return "?";
}

std::string activation_scaling_text(const ActivationQuant& a) {
  switch (a.scaling) {
    case ActivationScaling::None: return "";
    case ActivationScaling::StaticTensor: return "t";
    case ActivationScaling::DynamicToken: return "tok";
    case ActivationScaling::DynamicGroup: return fmt::format("g{}", a.group);
    case ActivationScaling::MX: return "mx";
    case ActivationScaling::NV: return "nv";
  }
  return "?";
}

WeightQuant parse_weight(std::string_view text, std::string_view context) {
  auto fields = split(text, ':');
  WeightQuant w;
  w.format = parse_format(fields[0]);
  for (std::size_t i = 1; i < fields.size(); ++i) {
    const std::string& field = fields[i];
    if (field == "t") {
      w.granularity = WeightGranularity::PerTensor;
    } else if (field == "ch") {
      w.granularity = WeightGranularity::PerChannel;
    } else if (field.size() > 1 && field[0] == 'g' &&
               std::isdigit(static_cast<unsigned char>(field[1]))) {
      w.granularity = WeightGranularity::Group;
      w.group = parse_positive(std::string_view(field).substr(1), "weight group", context);
    } else if (field.size() > 1 && field[0] == 'b' && field.find('x') != std::string::npos) {
      auto x = field.find('x');
      w.granularity = WeightGranularity::Block;
      w.block_n =
          parse_positive(std::string_view(field).substr(1, x - 1), "weight block rows", context);
      w.block_k =
          parse_positive(std::string_view(field).substr(x + 1), "weight block columns", context);
    } else if (field.rfind("s=", 0) == 0) {
      w.scale_format = parse_format(field.substr(2));
    } else if (field.rfind("zp=", 0) == 0) {
      std::string z = field.substr(3);
      if (z == "none")
        w.zero_point = ZeroPoint::None;
      else if (z == "mid")
        w.zero_point = ZeroPoint::Midpoint;
      else if (z == "int")
        w.zero_point = ZeroPoint::Integer;
      else if (z == "float")
        w.zero_point = ZeroPoint::Float;
      else
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("scheme '{}': weight zero point '{}' is not one of none, mid, int, "
                                "float",
                                context, z));
    } else if (field == "global") {
      w.global_scale = true;
    } else {
      throw Error(
          ErrorCode::InvalidArgument,
          fmt::format("scheme '{}': weight option '{}' is not one of t, ch, g<G>, b<N>x<K>, "
                      "s=<format>, zp=<none|mid|int|float>, global",
                      context, field));
    }
  }
  return w;
}

ActivationQuant parse_activation(std::string_view text, std::string_view context) {
  auto fields = split(text, ':');
  ActivationQuant a;
  a.format = parse_format(fields[0]);
  bool quantized = !is_one_of(a.format, {formats::fp16, formats::bf16, formats::fp32});
  if (quantized) a.scaling = ActivationScaling::DynamicToken;
  bool scale_given = false;
  for (std::size_t i = 1; i < fields.size(); ++i) {
    const std::string& field = fields[i];
    // The last scaling given wins, with its own group (none for t and tok): "nv:t" must equal
    // "t", the text to_string prints for it.
    if (field == "t") {
      a.scaling = ActivationScaling::StaticTensor;
      a.group = 0;
    } else if (field == "tok") {
      a.scaling = ActivationScaling::DynamicToken;
      a.group = 0;
    } else if (field.size() > 1 && field[0] == 'g' &&
               std::isdigit(static_cast<unsigned char>(field[1]))) {
      a.scaling = ActivationScaling::DynamicGroup;
      a.group = parse_positive(std::string_view(field).substr(1), "activation group", context);
    } else if (field == "mx") {
      a.scaling = ActivationScaling::MX;
      a.group = 32;
    } else if (field == "nv") {
      a.scaling = ActivationScaling::NV;
      a.group = 16;
    } else if (field.rfind("s=", 0) == 0) {
      a.scale_format = parse_format(field.substr(2));
      scale_given = true;
    } else {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("scheme '{}': activation option '{}' is not one of t, tok, g<G>, mx, "
                              "nv, s=<format>",
                              context, field));
    }
  }
  if (!scale_given) {
    if (a.scaling == ActivationScaling::MX) a.scale_format = formats::e8m0;
    if (a.scaling == ActivationScaling::NV) a.scale_format = formats::ue4m3;
  }
  return a;
}

Scheme parse_text_form(const std::string& context) {
  Scheme scheme;
  bool have_weight = false;
  for (const auto& part : split(context, ';')) {
    if (part.empty()) continue;
    auto eq = part.find('=');
    std::string key = eq == std::string::npos ? part : trim(part.substr(0, eq));
    std::string value = eq == std::string::npos ? "" : trim(part.substr(eq + 1));
    if (key == "w") {
      scheme.weight = parse_weight(value, context);
      have_weight = true;
    } else if (key == "a") {
      scheme.activation = parse_activation(value, context);
    } else if (key == "o") {
      scheme.output = parse_format(value);
    } else {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("scheme '{}': part '{}' is not one of w=, a=, o=", context, part));
    }
  }
  if (!have_weight)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("scheme '{}': the weight part 'w=<format>...' is required", context));
  validate(scheme);
  return scheme;
}

}  // namespace

bool operator==(const WeightQuant& a, const WeightQuant& b) {
  return a.format == b.format && a.granularity == b.granularity &&
         (a.granularity != WeightGranularity::Group || a.group == b.group) &&
         (a.granularity != WeightGranularity::Block ||
          (a.block_n == b.block_n && a.block_k == b.block_k)) &&
         a.scale_format == b.scale_format && a.zero_point == b.zero_point &&
         a.global_scale == b.global_scale;
}

bool operator==(const ActivationQuant& a, const ActivationQuant& b) {
  if (!(a.format == b.format) || a.scaling != b.scaling) return false;
  if (!a.is_quantized()) return true;
  return a.group == b.group && a.scale_format == b.scale_format;
}

bool operator==(const Scheme& a, const Scheme& b) {
  return a.weight == b.weight && a.activation == b.activation && a.output == b.output;
}

Scheme parse_scheme(std::string_view text) {
  const std::string context = trim(text);
  for (const auto& preset : presets())
    if (preset.name == context) return preset.scheme;
  if (context.find('=') == std::string::npos) {
    std::string names;
    for (const auto& preset : presets()) names += (names.empty() ? "" : ", ") + preset.name;
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("scheme '{}' is neither a preset ({}) nor the text form "
                            "'w=<fmt>[:...];a=<fmt>[:...];o=<fmt>'",
                            context, names));
  }
  return parse_text_form(context);
}

std::string to_string(const Scheme& s) {
  const WeightQuant& w = s.weight;
  std::string text = fmt::format("w={}:{}:s={}", w.format.name(), weight_granularity_text(w),
                                 w.scale_format.name());
  if (w.zero_point != ZeroPoint::None) text += fmt::format(":zp={}", zero_point_name(w.zero_point));
  if (w.global_scale) text += ":global";
  const ActivationQuant& a = s.activation;
  text += fmt::format(";a={}", a.format.name());
  if (a.is_quantized())
    text += fmt::format(":{}:s={}", activation_scaling_text(a), a.scale_format.name());
  text += fmt::format(";o={}", s.output.name());
  return text;
}

void validate(const Scheme& s) {
  const std::string where = to_string(s);
  auto fail = [&](const std::string& message) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("scheme '{}': {}", where, message));
  };
  const WeightQuant& w = s.weight;
  if (w.format.bits > 8)
    fail(fmt::format("weight format {} has {} bits; a quantized weight has at most 8",
                     w.format.name(), w.format.bits));
  if (!is_one_of(w.scale_format, {formats::fp32, formats::fp16, formats::bf16, formats::e4m3,
                                  formats::ue4m3, formats::e8m0}))
    fail(fmt::format("weight scale format {} is not one of fp32, fp16, bf16, e4m3, ue4m3, e8m0",
                     w.scale_format.name()));
  if (w.granularity == WeightGranularity::Group && w.group <= 0)
    fail(fmt::format("weight group {} must be positive", w.group));
  if (w.granularity == WeightGranularity::Block && (w.block_n <= 0 || w.block_k <= 0))
    fail(fmt::format("weight block {}x{} must be positive", w.block_n, w.block_k));
  switch (w.zero_point) {
    case ZeroPoint::None: break;
    case ZeroPoint::Midpoint:
    case ZeroPoint::Integer:
      if (!w.format.is_integer() || w.format.is_signed)
        fail(fmt::format("zero point '{}' needs an unsigned integer weight format, not {}",
                         zero_point_name(w.zero_point), w.format.name()));
      break;
    case ZeroPoint::Float:
      if (!w.format.is_integer())
        fail(fmt::format("a float zero point needs an integer weight format, not {}",
                         w.format.name()));
      break;
  }
  const ActivationQuant& a = s.activation;
  if (!a.is_quantized()) {
    if (!is_one_of(a.format, {formats::fp16, formats::bf16}))
      fail(
          fmt::format("unquantized activation format {} is not fp16 or bf16; quantized formats "
                      "are e4m3, e5m2, int8, int4, e2m1",
                      a.format.name()));
  } else {
    if (!is_one_of(a.format,
                   {formats::e4m3, formats::e5m2, formats::int8, formats::int_(4), formats::e2m1}))
      fail(fmt::format("quantized activation format {} is not one of e4m3, e5m2, int8, int4, e2m1",
                       a.format.name()));
    switch (a.scaling) {
      case ActivationScaling::None: break;
      case ActivationScaling::StaticTensor:
      case ActivationScaling::DynamicToken:
        if (!(a.scale_format == formats::fp32))
          fail(fmt::format("activation scaling '{}' uses fp32 scales, not {}",
                           activation_scaling_text(a), a.scale_format.name()));
        break;
      case ActivationScaling::DynamicGroup:
        if (a.group <= 0) fail(fmt::format("activation group {} must be positive", a.group));
        if (!(a.scale_format == formats::fp32))
          fail(fmt::format("per-group activation scales are fp32, not {}", a.scale_format.name()));
        break;
      case ActivationScaling::MX:
        if (a.group != 32 || !(a.scale_format == formats::e8m0))
          fail("MX activation scaling is 1x32 blocks with e8m0 scales");
        if (!is_one_of(a.format, {formats::e4m3, formats::e5m2, formats::e2m1, formats::int8}))
          fail(fmt::format("MX activation format {} is not one of e4m3, e5m2, e2m1, int8",
                           a.format.name()));
        break;
      case ActivationScaling::NV:
        if (a.group != 16 || !(a.scale_format == formats::ue4m3) || !(a.format == formats::e2m1))
          fail("NV activation scaling is e2m1 values in 1x16 blocks with ue4m3 scales");
        break;
    }
  }
  if (!is_one_of(s.output, {formats::fp16, formats::bf16, formats::fp32}))
    fail(fmt::format("output format {} is not one of fp16, bf16, fp32", s.output.name()));
}

void validate_shape(const Scheme& s, std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::string where = s.name.empty() ? to_string(s) : s.name;
  auto fail = [&](const std::string& message) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("scheme '{}': {}", where, message));
  };
  // Groups need not divide K: the last group of a row is shorter (ceil(K / G) scale columns,
  // as GPTQ/AWQ checkpoints store it), so only the sizes themselves can be wrong here.
  if (m < 1 || n < 1 || k < 1)
    fail(fmt::format("shape M={} N={} K={}: every size must be at least 1", m, n, k));
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = [] {
    struct Row {
      const char* name;
      const char* description;
      const char* text;
    };
    const Row rows[] = {
        {"w4a16", "uint4 symmetric (midpoint zero), groups of 128, bf16 scales; bf16 activations",
         "w=uint4:g128:s=bf16:zp=mid;a=bf16;o=bf16"},
        {"w4a16-zp", "uint4 with integer zero points, groups of 128, bf16 scales",
         "w=uint4:g128:s=bf16:zp=int;a=bf16;o=bf16"},
        {"w2a16", "uint2 symmetric, groups of 128, bf16 scales",
         "w=uint2:g128:s=bf16:zp=mid;a=bf16;o=bf16"},
        {"w3a16", "uint3 symmetric, groups of 128, bf16 scales",
         "w=uint3:g128:s=bf16:zp=mid;a=bf16;o=bf16"},
        {"w8a16", "uint8 symmetric, groups of 128, bf16 scales",
         "w=uint8:g128:s=bf16:zp=mid;a=bf16;o=bf16"},
        {"gptq-w4a16-g128", "GPTQ: uint4 with integer zero points, g128, fp16 scales, fp16",
         "w=uint4:g128:s=fp16:zp=int;a=fp16;o=fp16"},
        {"awq-w4a16-g128", "AWQ: uint4 with integer zero points, g128, fp16 scales, fp16",
         "w=uint4:g128:s=fp16:zp=int;a=fp16;o=fp16"},
        {"w4a8-fp8", "int4 g128 bf16 scales; e4m3 activations, dynamic per token",
         "w=int4:g128:s=bf16;a=e4m3:tok:s=fp32;o=bf16"},
        {"w8a8-fp8", "e4m3 weights per channel (fp32); e4m3 activations per token",
         "w=e4m3:ch:s=fp32;a=e4m3:tok:s=fp32;o=bf16"},
        {"fp8-block", "e4m3 weights, 128x128 fp32 block scales; e4m3 activations in 1x128 groups",
         "w=e4m3:b128x128:s=fp32;a=e4m3:g128:s=fp32;o=bf16"},
        {"w8a8-int8", "int8 weights per channel (fp32); int8 activations per token",
         "w=int8:ch:s=fp32;a=int8:tok:s=fp32;o=bf16"},
        {"mxfp4-a16", "MXFP4 weights (e2m1, 1x32 e8m0 scales); bf16 activations",
         "w=e2m1:g32:s=e8m0;a=bf16;o=bf16"},
        {"mxfp4-a8", "MXFP4 weights; e4m3 activations per token",
         "w=e2m1:g32:s=e8m0;a=e4m3:tok:s=fp32;o=bf16"},
        {"mxfp8-mxfp4", "MXFP4 weights; MXFP8 activations (e4m3, 1x32 e8m0 scales)",
         "w=e2m1:g32:s=e8m0;a=e4m3:mx;o=bf16"},
        {"nvfp4-a16", "NVFP4 weights (e2m1, 1x16 ue4m3 scales, fp32 global); bf16 activations",
         "w=e2m1:g16:s=ue4m3:global;a=bf16;o=bf16"},
        {"nvfp4", "NVFP4 weights and activations (W4A4)",
         "w=e2m1:g16:s=ue4m3:global;a=e2m1:nv;o=bf16"},
        {"bitnet", "BitNet b1.58: ternary weights, per-tensor absmean scale; int8 per token",
         "w=ternary:t:s=fp32;a=int8:tok:s=fp32;o=bf16"},
    };
    std::vector<Preset> out;
    for (const Row& row : rows) {
      // Presets are written in the text form, so that each one reads as its own documentation.
      Scheme scheme = parse_text_form(row.text);
      scheme.name = row.name;
      out.push_back({row.name, row.description, scheme});
    }
    return out;
  }();
  return table;
}

ScaleGrid weight_scale_grid(const WeightQuant& w, std::int64_t n, std::int64_t k) {
  switch (w.granularity) {
    case WeightGranularity::PerTensor: return {1, 1, n, k};
    case WeightGranularity::PerChannel: return {n, 1, 1, k};
    case WeightGranularity::Group: return {n, ceil_div(k, w.group), 1, w.group};
    case WeightGranularity::Block:
      return {ceil_div(n, w.block_n), ceil_div(k, w.block_k), w.block_n, w.block_k};
  }
  return {};
}

ScaleGrid activation_scale_grid(const ActivationQuant& a, std::int64_t m, std::int64_t k) {
  switch (a.scaling) {
    case ActivationScaling::None: return {0, 0, m, k};
    case ActivationScaling::StaticTensor: return {1, 1, m, k};
    case ActivationScaling::DynamicToken: return {m, 1, 1, k};
    case ActivationScaling::DynamicGroup:
    case ActivationScaling::MX:
    case ActivationScaling::NV: return {m, ceil_div(k, a.group), 1, a.group};
  }
  return {};
}

}  // namespace qgemm
