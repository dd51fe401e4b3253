#include "bench/recipe.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

struct NamedTiming {
  const char* name;
  TimingMode mode;
};
constexpr NamedTiming kTimingNames[] = {
    {"cold-l2", TimingMode::ColdL2}, {"warm", TimingMode::Warm}, {"graph", TimingMode::Graph}};

struct NamedBackend {
  const char* name;
  Backend backend;
};
constexpr NamedBackend kBackendNames[] = {{"qgemm", Backend::Qgemm},
                                          {"cublas-bf16", Backend::CublasBf16},
                                          {"cublaslt-fp8", Backend::CublasLtFp8},
                                          {"cublaslt-fp8-exact", Backend::CublasLtFp8Exact},
                                          {"qdq", Backend::Qdq},
                                          {"qgemm-codes", Backend::QgemmCodes}};

template <typename Table>
std::string joined_names(const Table& table) {
  std::string out;
  for (const auto& row : table) out += (out.empty() ? "" : " | ") + std::string(row.name);
  return out;
}

// True when `text` is UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
// yaml-cpp passes other bytes through as they are; the JSON the recipe's names and labels go
// into (dry-run listings, results) rejects them.
bool is_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    std::uint32_t code = 0, min = 0;
    if ((lead & 0xE0) == 0xC0) {
      length = 2, code = lead & 0x1F, min = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, code = lead & 0x0F, min = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, code = lead & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (text.size() - i < length) return false;
    for (std::size_t j = 1; j < length; ++j) {
      const auto next = static_cast<unsigned char>(text[i + j]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

// Validates one YAML document against the recipe rules; every failure names source, line, key.
class RecipeParser {
 public:
  explicit RecipeParser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& key,
                         const std::string& rule) const {
    fail_at(node.Mark(), key, rule);
  }
  [[noreturn]] void fail_at(const YAML::Mark& mark, const std::string& key,
                            const std::string& rule) const {
    // yaml-cpp counts lines from 0 and reports -1 when it has no position.
    const std::string line = mark.line >= 0 ? fmt::format(", line {}", mark.line + 1) : "";
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("recipe {}{}, key '{}': {}", source_, line, key, rule));
  }

  void require_map(const YAML::Node& node, const std::string& key) const {
    if (!node.IsMap()) fail(node, key, "must be a mapping of keys to values");
  }

  void reject_unknown_keys(const YAML::Node& map, const std::string& prefix,
                           const std::set<std::string>& allowed) const {
    for (const auto& item : map) {
      const std::string name = item.first.IsScalar() ? item.first.Scalar() : "?";
      if (allowed.count(name)) continue;
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(item.first, prefix + name, fmt::format("unknown key (allowed here: {})", list));
    }
  }

  std::string scalar(const YAML::Node& node, const std::string& key) const {
    if (!node.IsScalar()) fail(node, key, "must be a single value (not a list or mapping)");
    if (!is_utf8(node.Scalar())) fail(node, key, "is not UTF-8 text");
    return node.Scalar();
  }

  std::int64_t integer(const YAML::Node& node, const std::string& key, std::int64_t min) const {
    const std::string text = scalar(node, key);
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size())
      fail(node, key, fmt::format("'{}' is not an integer", text));
    if (value < min) fail(node, key, fmt::format("{} is below the minimum {}", value, min));
    return value;
  }

  int small_integer(const YAML::Node& node, const std::string& key, int min) const {
    const std::int64_t value = integer(node, key, min);
    if (value > std::numeric_limits<int>::max())
      fail(node, key, fmt::format("{} is too large", value));
    return static_cast<int>(value);
  }

  Recipe parse(const YAML::Node& root) const {
    Recipe recipe;
    recipe.source = source_;
    if (!root.IsDefined() || root.IsNull())
      fail_at(root.Mark(), "(document)", "the recipe is empty (a mapping with name and cases)");
    require_map(root, "(document)");
    reject_unknown_keys(root, "", {"name", "timing", "repeats", "warmup", "backends", "cases"});

    const YAML::Node name = root["name"];
    if (!name) fail(root, "name", "required key is missing");
    recipe.name = scalar(name, "name");
    if (recipe.name.empty()) fail(name, "name", "must not be empty");

    if (const YAML::Node timing = root["timing"]) {
      const std::string text = scalar(timing, "timing");
      bool found = false;
      for (const auto& row : kTimingNames) {
        if (text == row.name) recipe.timing = row.mode, found = true;
      }
      if (!found)
        fail(timing, "timing",
             fmt::format("'{}' is not a timing mode ({})", text, joined_names(kTimingNames)));
    }
    if (const YAML::Node repeats = root["repeats"])
      recipe.repeats = small_integer(repeats, "repeats", 1);
    if (const YAML::Node warmup = root["warmup"])
      recipe.warmup = small_integer(warmup, "warmup", 0);
    if (const YAML::Node backends = root["backends"]) recipe.backends = parse_backends(backends);

    const YAML::Node cases = root["cases"];
    if (!cases) fail(root, "cases", "required key is missing");
    if (!cases.IsSequence() || cases.size() == 0)
      fail(cases, "cases", "must be a non-empty list of cases");
    for (std::size_t i = 0; i < cases.size(); ++i)
      recipe.cases.push_back(parse_case(cases[i], fmt::format("cases[{}]", i)));
    return recipe;
  }

 private:
  std::vector<Backend> parse_backends(const YAML::Node& node) const {
    if (!node.IsSequence() || node.size() == 0)
      fail(node, "backends", "must be a non-empty list of backends");
    std::vector<Backend> out;
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string key = fmt::format("backends[{}]", i);
      const std::string text = scalar(node[i], key);
      const NamedBackend* match = nullptr;
      for (const auto& row : kBackendNames) {
        if (text == row.name) match = &row;
      }
      if (!match)
        fail(node[i], key,
             fmt::format("'{}' is not a backend ({})", text, joined_names(kBackendNames)));
      for (Backend seen : out) {
        if (seen == match->backend) fail(node[i], key, fmt::format("'{}' is listed twice", text));
      }
      out.push_back(match->backend);
    }
    return out;
  }

  RecipeCase parse_case(const YAML::Node& node, const std::string& prefix) const {
    require_map(node, prefix);
    reject_unknown_keys(node, prefix + ".",
                        {"scheme", "n", "k", "m", "kind", "experts", "top_k", "label"});
    RecipeCase c;
    c.line = node.Mark().line + 1;
    auto required = [&](const char* key) {
      const YAML::Node value = node[key];
      if (!value) fail(node, prefix + "." + key, "required key is missing");
      return value;
    };

    const YAML::Node scheme = required("scheme");
    c.scheme_text = scalar(scheme, prefix + ".scheme");
    try {
      c.scheme = parse_scheme(c.scheme_text);
    } catch (const Error& error) {
      fail(scheme, prefix + ".scheme", error.what());
    }
    const YAML::Node n = required("n");
    const YAML::Node k = required("k");
    c.n = integer(n, prefix + ".n", 1);
    c.k = integer(k, prefix + ".k", 1);

    const YAML::Node m = required("m");
    if (m.IsSequence()) {
      if (m.size() == 0) fail(m, prefix + ".m", "must be an integer or a non-empty list");
      for (std::size_t i = 0; i < m.size(); ++i)
        c.m.push_back(integer(m[i], fmt::format("{}.m[{}]", prefix, i), 1));
    } else {
      c.m.push_back(integer(m, prefix + ".m", 1));
    }

    if (const YAML::Node kind = node["kind"]) {
      const std::string text = scalar(kind, prefix + ".kind");
      if (text == "dense") {
        c.kind = CaseKind::Dense;
      } else if (text == "moe") {
        c.kind = CaseKind::Moe;
      } else {
        fail(kind, prefix + ".kind", fmt::format("'{}' is not a case kind (dense | moe)", text));
      }
    }
    const YAML::Node experts = node["experts"];
    const YAML::Node top_k = node["top_k"];
    if (c.kind == CaseKind::Moe) {
      if (!experts) fail(node, prefix + ".experts", "required when kind is moe");
      if (!top_k) fail(node, prefix + ".top_k", "required when kind is moe");
      c.experts = small_integer(experts, prefix + ".experts", 1);
      c.top_k = small_integer(top_k, prefix + ".top_k", 1);
      if (c.top_k > c.experts)
        fail(top_k, prefix + ".top_k",
             fmt::format("{} exceeds experts = {} (rule: top_k <= experts)", c.top_k, c.experts));
    } else {
      if (experts) fail(experts, prefix + ".experts", "only allowed when kind is moe");
      if (top_k) fail(top_k, prefix + ".top_k", "only allowed when kind is moe");
    }

    if (const YAML::Node label = node["label"]) {
      c.label = scalar(label, prefix + ".label");
      if (c.label.empty()) fail(label, prefix + ".label", "must not be empty when given");
    } else {
      c.label = fmt::format("{} {}x{}", c.scheme_text, c.n, c.k);
    }

    // The shape rules live with the scheme: ask it for each M.
    for (std::size_t i = 0; i < c.m.size(); ++i) {
      try {
        validate_shape(c.scheme, c.m[i], c.n, c.k);
      } catch (const Error& error) {
        // A group rule is about K; name that key so the fix is obvious.
        fail(k, prefix + ".k", fmt::format("with m = {}: {}", c.m[i], error.what()));
      }
    }
    return c;
  }

  std::string source_;
};

}  // namespace

std::string to_string(TimingMode mode) {
  for (const auto& row : kTimingNames) {
    if (row.mode == mode) return row.name;
  }
  throw Error(ErrorCode::Internal, "timing mode out of range");
}

std::string to_string(Backend backend) {
  for (const auto& row : kBackendNames) {
    if (row.backend == backend) return row.name;
  }
  throw Error(ErrorCode::Internal, "backend out of range");
}

std::string to_string(CaseKind kind) { return kind == CaseKind::Moe ? "moe" : "dense"; }

const std::vector<Backend>& all_backends() {
  static const std::vector<Backend> list = [] {
    std::vector<Backend> out;
    for (const auto& row : kBackendNames) out.push_back(row.backend);
    return out;
  }();
  return list;
}

Recipe parse_recipe(std::string_view yaml_text, const std::string& source) {
  const RecipeParser parser(source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& error) {
    parser.fail_at(error.mark, "(syntax)", fmt::format("not valid YAML: {}", error.msg));
  }
  return parser.parse(root);
}

Recipe load_recipe(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::IoError, fmt::format("recipe {}: cannot open the file", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::IoError, fmt::format("recipe {}: read failed", path));
  return parse_recipe(text.str(), path);
}

std::vector<ExpandedRun> expand(const Recipe& recipe) {
  std::vector<ExpandedRun> runs;
  for (std::size_t i = 0; i < recipe.cases.size(); ++i) {
    const RecipeCase& c = recipe.cases[i];
    for (std::int64_t m : c.m) {
      for (Backend backend : recipe.backends) runs.push_back({i, &c, m, backend});
    }
  }
  return runs;
}

std::string expanded_runs_json(const Recipe& recipe) {
  nlohmann::json doc;
  doc["recipe"] = recipe.name;
  doc["source"] = recipe.source;
  doc["timing"] = to_string(recipe.timing);
  doc["repeats"] = recipe.repeats;
  doc["warmup"] = recipe.warmup;
  doc["backends"] = nlohmann::json::array();
  for (Backend b : recipe.backends) doc["backends"].push_back(to_string(b));
  const std::vector<ExpandedRun> runs = expand(recipe);
  doc["count"] = runs.size();
  doc["runs"] = nlohmann::json::array();
  for (const ExpandedRun& run : runs) {
    const RecipeCase& c = *run.recipe_case;
    nlohmann::json row = {{"case", run.case_index},
                          {"label", c.label},
                          {"scheme", c.scheme_text},
                          {"scheme_text", to_string(c.scheme)},
                          {"kind", to_string(c.kind)},
                          {"m", run.m},
                          {"n", c.n},
                          {"k", c.k},
                          {"backend", to_string(run.backend)}};
    if (c.kind == CaseKind::Moe) {
      row["experts"] = c.experts;
      row["top_k"] = c.top_k;
    }
    doc["runs"].push_back(std::move(row));
  }
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // a non-UTF-8 path
}

std::string expanded_runs_csv(const Recipe& recipe) {
  // Labels and scheme texts may hold commas or quotes: quote every text field.
  auto quoted = [](const std::string& text) {
    std::string out = "\"";
    for (char ch : text) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return out + "\"";
  };
  std::string out = "case,label,scheme,kind,m,n,k,experts,top_k,backend\n";
  for (const ExpandedRun& run : expand(recipe)) {
    const RecipeCase& c = *run.recipe_case;
    out += fmt::format("{},{},{},{},{},{},{},{},{},{}\n", run.case_index, quoted(c.label),
                       quoted(c.scheme_text), to_string(c.kind), run.m, c.n, c.k, c.experts,
                       c.top_k, to_string(run.backend));
  }
  return out;
}

std::string describe_run(const ExpandedRun& run) {
  const RecipeCase& c = *run.recipe_case;
  std::string moe;
  if (c.kind == CaseKind::Moe) moe = fmt::format("  experts={} top_k={}", c.experts, c.top_k);
  return fmt::format("{:<28} {:<18} {:<5} m={:<5} n={:<6} k={:<6}{}  {}", c.label, c.scheme_text,
                     to_string(c.kind), run.m, c.n, c.k, moe, to_string(run.backend));
}

}  // namespace qgemm::bench
