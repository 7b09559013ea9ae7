#include "core/config_schema.h"

#include <map>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

namespace moh::config {

namespace fs = std::filesystem;

std::string shortest_double(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // %g writes 50 as "5e+01" at the shortest precision: print plain decimals for ordinary magnitudes.
  const double a = std::fabs(v);
  if (s.find('e') != std::string::npos && a >= 1e-4 && a < 1e15) {
    const int digits =
        static_cast<int>(s.find('e') - (s[0] == '-' ? 1 : 0) - (s.find('.') != std::string::npos ? 1 : 0));
    const int exponent = static_cast<int>(std::floor(std::log10(a)));
    std::snprintf(buf, sizeof buf, "%.*f", std::max(0, digits - 1 - exponent), v);
    if (std::strtod(buf, nullptr) == v) s = buf;
  }
  // Keep it a float for YAML readers: "1" -> "1.0" (but leave exponents and inf/nan alone).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

namespace {
// "8", "0.5", "1e-08": whole numbers without a decimal point.
std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return shortest_double(v);
}
}  // namespace

std::string range_text(const Range& r) {
  return "[" + number_text(r.min) + ", " + number_text(r.max) + "]";
}

void check_range(double v, const Range& r, const std::string& what, const char* help) {
  if (v >= r.min && v <= r.max) return;
  throw UserError(what, number_text(v) + " is outside " + range_text(r), help);
}

void check_number(double v, const std::string& text, const std::string& what) {
  if (std::isnan(v)) throw UserError(what, "must be a number, got \"" + text + "\"", "NaN is not a setting");
  if (std::isinf(v) || std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max()))
    throw UserError(what, "must be finite and within fp32's range (|x| <= 3.4e38), got \"" + text + "\"", "");
}

void check_duplicate_keys(const YAML::Node& node, const std::string& origin, const std::string& prefix) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i)
      check_duplicate_keys(node[i], origin, prefix + "[" + std::to_string(i) + "]");
    return;
  }
  if (!node.IsMap()) return;
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : describe_node(kv.first);
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (!seen.insert(key).second)
      throw UserError("config " + origin, "key '" + path + "' appears twice",
                      "a YAML mapping holds each key once; delete one of them");
    check_duplicate_keys(kv.second, origin, path);
  }
}

std::string describe_node(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "\"" + n.Scalar() + "\"";
}

Reader::Reader(YAML::Node node, std::string origin, std::string prefix)
    : node_(std::move(node)),
      origin_(std::move(origin)),
      prefix_(std::move(prefix)),
      known_(&own_known_),
      present_(&own_present_) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap())
    throw UserError("config " + origin_, "expected a map of keys at the top level, got " + describe_node(node_));
  if (node_.IsMap())
    for (const auto& kv : node_) present_->push_back(prefix_ + kv.first.as<std::string>());
}

Reader::Reader(YAML::Node node, std::string origin, std::string prefix, std::vector<std::string>* known,
               std::vector<std::string>* present)
    : node_(std::move(node)), origin_(std::move(origin)), prefix_(std::move(prefix)), known_(known), present_(present) {
  if (node_.IsMap())
    for (const auto& kv : node_) present_->push_back(prefix_ + kv.first.as<std::string>());
}

void Reader::finish() const {
  std::set<std::string> known(known_->begin(), known_->end());
  for (const auto& key : *present_) {
    if (known.count(key)) continue;
    std::string near = nearest_name(key, *known_);
    if (near.empty()) {
      // Suggest among the siblings of the same section by the last component, else list them.
      auto dot = key.rfind('.');
      std::string parent = dot == std::string::npos ? "" : key.substr(0, dot + 1);
      std::vector<std::string> siblings;
      for (const auto& k : *known_)
        if (k.rfind(parent, 0) == 0 && k.find('.', parent.size()) == std::string::npos) siblings.push_back(k);
      throw UserError("config " + origin_, "unknown key '" + key + "'",
                      "valid keys here: " + join(siblings) + "; see `moh config --schema`");
    }
    throw UserError("config " + origin_, "unknown key '" + key + "'", "did you mean '" + near + "'?");
  }
}

namespace {

/// Length of the UTF-8 sequence starting at s[i] (1-4), or 0 when it is not well-formed.
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  return n;
}

void walk_tree(const YAML::Node& n, int depth, int64_t& budget, const std::string& origin) {
  if (--budget < 0)
    throw UserError(origin, "more than " + std::to_string(kMaxConfigNodes) + " YAML nodes once aliases are expanded",
                    "an experiment file has a few hundred; look for aliases (*name) that multiply each other");
  if (depth > kMaxConfigDepth)
    throw UserError(origin, "YAML nested deeper than " + std::to_string(kMaxConfigDepth) + " levels",
                    "an experiment file is a few levels deep");
  if (n.IsMap()) {
    for (const auto& kv : n) {
      walk_tree(kv.first, depth + 1, budget, origin);
      walk_tree(kv.second, depth + 1, budget, origin);
    }
  } else if (n.IsSequence()) {
    for (const auto& x : n) walk_tree(x, depth + 1, budget, origin);
  }
}

}  // namespace

std::string read_config_text(const std::string& path, const std::string& origin) {
  std::error_code ec;
  const std::uintmax_t bytes = fs::file_size(path, ec);
  if (ec) throw UserError(origin, "cannot read: " + ec.message());
  if (bytes > kMaxConfigBytes)
    throw UserError(origin, std::to_string(bytes) + " bytes, over the limit of 1 MiB for a config",
                    "is this the YAML experiment file?");
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(bytes), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(bytes))) throw UserError(origin, "cannot read the file");
  const size_t nul = text.find('\0');
  if (nul != std::string::npos)
    throw UserError(origin, "a NUL byte at offset " + std::to_string(nul) + ": not a text file",
                    "give the YAML experiment file");
  for (size_t i = 0, n = 0; i < text.size(); i += n)
    if ((n = utf8_sequence(text, i)) == 0)
      throw UserError(origin, "not UTF-8 text (byte " + std::to_string(i) + ")", "give the YAML experiment file");
  return text;
}

void check_tree_size(const YAML::Node& node, const std::string& origin) {
  int64_t budget = kMaxConfigNodes;
  walk_tree(node, 0, budget, origin);
}

YAML::Node merge(const YAML::Node& base, const YAML::Node& over) {
  if (!base.IsMap() || !over.IsMap()) return YAML::Clone(over);
  YAML::Node out = YAML::Clone(base);
  for (const auto& kv : over) {
    const std::string key = kv.first.as<std::string>();
    if (out[key].IsMap() && kv.second.IsMap())
      out[key] = merge(out[key], kv.second);
    else
      out[key] = YAML::Clone(kv.second);
  }
  return out;
}

static YAML::Node load_tree_rec(const fs::path& path, std::vector<fs::path>& chain) {
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(path, ec);
  if (std::find(chain.begin(), chain.end(), canon) != chain.end())
    throw UserError("config " + path.string(), "`base:` inheritance forms a cycle", "check the base: chain");
  if (!fs::is_regular_file(path))
    throw UserError("config " + path.string(), "file not found",
                    chain.empty() ? "give a path to a YAML file, e.g. configs/fashion_mnist/moh_vit_nano.yaml"
                                  : "base: paths are relative to the including file " + chain.back().string());
  const std::string origin = "config " + path.string();
  const std::string text = read_config_text(path.string(), origin);
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw UserError("config " + path.string(),
                    "YAML syntax error at line " + std::to_string(e.mark.line + 1) + ", column " +
                        std::to_string(e.mark.column + 1) + ": " + e.msg,
                    "fix the YAML syntax");
  } catch (const YAML::Exception& e) {
    throw UserError("config " + path.string(), std::string("cannot read: ") + e.what());
  }
  if (node.IsNull()) node = YAML::Node(YAML::NodeType::Map);
  check_tree_size(node, origin);
  check_duplicate_keys(node, path.string());
  if (!node.IsMap()) throw UserError("config " + path.string(), "expected a map of keys at the top level");
  YAML::Node base_key = node["base"];
  if (!base_key.IsDefined()) return node;
  if (!base_key.IsScalar())
    throw UserError("config " + path.string() + ": base",
                    "expected a relative path string, got " + describe_node(base_key));
  fs::path base_path = path.parent_path() / base_key.Scalar();
  node.remove("base");
  chain.push_back(canon);
  YAML::Node base = load_tree_rec(base_path, chain);
  chain.pop_back();
  return merge(base, node);
}

YAML::Node load_tree(const std::string& path) {
  std::vector<fs::path> chain;
  return load_tree_rec(fs::path(path), chain);
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("--set " + assignment, "expected KEY=VALUE with a dotted key", "e.g. --set optim.lr=5e-4");
  std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = text.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(text);
    check_tree_size(value, "--set " + assignment);
    check_duplicate_keys(value, "--set " + assignment);
  } catch (const YAML::Exception& e) {
    throw UserError("--set " + assignment, "value is not valid YAML: " + e.msg, "quote strings, lists as [a,b]");
  }
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(key.substr(start, dot - start));
  parts.push_back(key.substr(start));
  for (const auto& p : parts)
    if (p.empty()) throw UserError("--set " + assignment, "empty key component", "e.g. --set optim.lr=5e-4");
  // Walk with copies of the handles (yaml-cpp nodes are references; operator= on a handle would rebind).
  std::vector<YAML::Node> path{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = path.back()[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      path.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = path.back()[parts[i]];
    } else if (!next.IsMap()) {
      throw UserError("--set " + assignment, "'" + parts[i] + "' is not a section", "");
    }
    path.push_back(next);
  }
  path.back()[parts.back()] = value;
}

}  // namespace moh::config

namespace moh {

namespace {

// Dotted key -> flow-style YAML text of every leaf (lists are leaves).
void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n)
      flatten(kv.second, prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar(), out);
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << n;
  out[prefix] = n.IsScalar() && n.Scalar().empty() ? "\"\"" : e.c_str();
}

}  // namespace

std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& after_yaml) {
  std::map<std::string, std::string> a, b;
  try {
    flatten(YAML::Load(before_yaml), "", a);
    flatten(YAML::Load(after_yaml), "", b);
  } catch (const YAML::Exception& e) {
    throw UserError("config.resolved.yaml", std::string("invalid YAML: ") + e.what(), "the stored config is corrupt");
  }
  std::vector<ConfigChange> out;
  for (const auto& [k, v] : a) {
    if (k == "name") continue;
    auto it = b.find(k);
    if (it == b.end())
      out.push_back({k, v, "(absent)"});
    else if (it->second != v)
      out.push_back({k, v, it->second});
  }
  for (const auto& [k, v] : b)
    if (k != "name" && !a.count(k)) out.push_back({k, "(absent)", v});
  std::sort(out.begin(), out.end(), [](const ConfigChange& x, const ConfigChange& y) { return x.key < y.key; });
  return out;
}

}  // namespace moh
