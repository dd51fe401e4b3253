// qgemm schemes: the preset quantization schemes, expanded field by field.
//
//   qgemm schemes [--json]               every preset: name, description, compact text form, fields
//   qgemm schemes SCHEME... [--json]     the same for the given presets or compact text forms
//
// The text form comes from qgemm::to_string, so what is printed can be pasted back wherever a
// scheme is asked for (--scheme of `qgemm check`, the C++ and Python APIs).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "qgemm/scheme.hpp"
#include "text_table.hpp"

namespace qgemm::cli {
namespace {

// Keys in the order written (name first), for readers of the JSON.
using Json = nlohmann::ordered_json;

const char* granularity_name(WeightGranularity granularity) {
  switch (granularity) {
    case WeightGranularity::PerTensor: return "per-tensor";
    case WeightGranularity::PerChannel: return "per-channel";
    case WeightGranularity::Group: return "group";
    case WeightGranularity::Block: return "block";
  }
  return "?";
}

const char* zero_point_name(ZeroPoint zero_point) {
  switch (zero_point) {
    case ZeroPoint::None: return "none";
    case ZeroPoint::Midpoint: return "midpoint";
    case ZeroPoint::Integer: return "integer";
    case ZeroPoint::Float: return "float";
  }
  return "?";
}

const char* scaling_name(ActivationScaling scaling) {
  switch (scaling) {
    case ActivationScaling::None: return "none";
    case ActivationScaling::StaticTensor: return "static-tensor";
    case ActivationScaling::DynamicToken: return "dynamic-token";
    case ActivationScaling::DynamicGroup: return "dynamic-group";
    case ActivationScaling::MX: return "mx";
    case ActivationScaling::NV: return "nv";
  }
  return "?";
}

// "128" (group), "128x128" (block), "-": the size a weight scale covers, for the text table.
std::string weight_extent_text(const WeightQuant& w) {
  if (w.granularity == WeightGranularity::Group) return fmt::format("{}", w.group);
  if (w.granularity == WeightGranularity::Block) return fmt::format("{}x{}", w.block_n, w.block_k);
  return "-";
}

// Whether `group` means something for this activation scaling (groups, MX and NV blocks).
bool activation_group_applies(const ActivationQuant& a) {
  return a.scaling == ActivationScaling::DynamicGroup || a.scaling == ActivationScaling::MX ||
         a.scaling == ActivationScaling::NV;
}

Json weight_json(const WeightQuant& w) {
  Json out;
  out["format"] = w.format.name();
  out["granularity"] = granularity_name(w.granularity);
  out["group"] = w.granularity == WeightGranularity::Group ? Json(w.group) : nullptr;
  out["block"] = w.granularity == WeightGranularity::Block ? Json::array({w.block_n, w.block_k})
                                                           : Json(nullptr);
  out["scale_format"] = w.scale_format.name();
  out["zero_point"] = zero_point_name(w.zero_point);
  out["global_scale"] = w.global_scale;
  return out;
}

Json activation_json(const ActivationQuant& a) {
  Json out;
  out["format"] = a.format.name();
  out["quantized"] = a.is_quantized();
  out["scaling"] = scaling_name(a.scaling);
  out["group"] = activation_group_applies(a) ? Json(a.group) : nullptr;
  out["scale_format"] = a.is_quantized() ? Json(a.scale_format.name()) : nullptr;
  return out;
}

struct NamedScheme {
  std::string name;
  std::string description;
  Scheme scheme;
};

std::vector<NamedScheme> selected_schemes(const std::vector<std::string>& requested) {
  std::vector<NamedScheme> out;
  if (requested.empty()) {
    for (const Preset& preset : presets())
      out.push_back({preset.name, preset.description, preset.scheme});
    return out;
  }
  for (const std::string& text : requested) {
    Scheme scheme = parse_scheme(text);  // throws qgemm::Error naming the text
    std::string description;
    for (const Preset& preset : presets())
      if (preset.name == scheme.name) description = preset.description;
    out.push_back({scheme.name.empty() ? text : scheme.name, description, scheme});
  }
  return out;
}

void print_schemes(const std::vector<NamedScheme>& schemes, bool json) {
  if (json) {
    Json out = Json::array();
    for (const NamedScheme& s : schemes) {
      out.push_back({{"name", s.name},
                     {"description", s.description},
                     {"text", to_string(s.scheme)},
                     {"weight", weight_json(s.scheme.weight)},
                     {"activation", activation_json(s.scheme.activation)},
                     {"output", s.scheme.output.name()}});
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::vector<std::vector<std::string>> fields = {
      {"name", "weight", "granularity", "size", "scale", "zero point", "global", "activation",
       "act scaling", "act group", "act scale", "output"}};
  std::vector<std::vector<std::string>> texts = {{"name", "text form", "description"}};
  for (const NamedScheme& s : schemes) {
    const WeightQuant& w = s.scheme.weight;
    const ActivationQuant& a = s.scheme.activation;
    fields.push_back({s.name, w.format.name(), granularity_name(w.granularity),
                      weight_extent_text(w), w.scale_format.name(), zero_point_name(w.zero_point),
                      w.global_scale ? "yes" : "no", a.format.name(), scaling_name(a.scaling),
                      activation_group_applies(a) ? std::to_string(a.group) : "-",
                      a.is_quantized() ? a.scale_format.name() : "-", s.scheme.output.name()});
    texts.push_back({s.name, to_string(s.scheme), s.description});
  }
  print_text_table(fields);
  fmt::print("\n");
  print_text_table(texts);
}

struct SchemesOptions {
  bool json = false;
  std::vector<std::string> requested;
};

const CommandRegistration registration([](CLI::App& app, int& status) {
  auto options = std::make_shared<SchemesOptions>();
  CLI::App* command = app.add_subcommand(
      "schemes", "List the preset quantization schemes, expanded (or the schemes given)");
  command->add_flag("--json", options->json, "Print JSON instead of text tables");
  command->add_option("schemes", options->requested,
                      "Presets or compact text forms to expand (default: every preset)");
  command->callback([options, &status] {
    print_schemes(selected_schemes(options->requested), options->json);
    status = 0;
  });
});

}  // namespace
}  // namespace qgemm::cli
