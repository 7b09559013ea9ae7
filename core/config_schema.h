#pragma once
// Strict, typed YAML <-> struct mapping. Every config struct declares its keys once in
//   template <class V> void visit(V& v) { v.field("lr", lr, "peak learning rate"); v.section("ema", ema, "..."); }
// and three visitors walk it: Reader (YAML -> struct; unknown keys, wrong types and missing required keys are
// UserErrors naming the dotted path), Writer (struct -> YAML, the resolved config) and SchemaLister (key, type,
// default, meaning: `moh config --schema`). Enums are parsed once here and never compared as strings afterwards.
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moh::config {

/// How a config section reports a broken rule: bad(dotted key, why, hint) throws the UserError naming the key (and the
/// file); a section's validate() checks its own fields with it, ExperimentConfig::validate the rules across sections.
using RuleError = std::function<void(const std::string& key, const std::string& why, const std::string& hint)>;

/// The names of an enum's values. Specialise by declaring `const EnumTable<E>& enum_table(E)` next to the enum.
template <class E>
using EnumTable = std::vector<std::pair<E, const char*>>;

template <class T, class = void>
struct HasEnumTable : std::false_type {};
template <class T>
struct HasEnumTable<T, std::void_t<decltype(enum_table(std::declval<T>()))>> : std::true_type {};

/// Name of an enum value.
template <class E>
std::string to_string(E e) {
  for (const auto& [v, n] : enum_table(e))
    if (v == e) return n;
  return "?";
}

/// "mha|moh|moa"
template <class E>
std::string enum_choices() {
  std::string s;
  for (const auto& [v, n] : enum_table(E{})) {
    if (!s.empty()) s += '|';
    s += n;
  }
  return s;
}

/// Parses an enum name; throws UserError(`what`, ...) listing the choices.
template <class E>
E enum_from_string(const std::string& name, const std::string& what) {
  std::vector<std::string> names;
  for (const auto& [v, n] : enum_table(E{})) {
    if (name == n) return v;
    names.emplace_back(n);
  }
  std::string near = nearest_name(name, names);
  throw UserError(what, "expected one of " + enum_choices<E>() + ", got \"" + name + "\"",
                  near.empty() ? "valid: " + join(names) : "did you mean '" + near + "'?");
}

/// Human type name used in messages and the schema.
template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<T>)
    return "integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "number";
  else if constexpr (std::is_same_v<T, std::string>)
    return "string";
  else if constexpr (std::is_enum_v<T>)
    return enum_choices<T>();
  else
    return "list of " + type_name<typename T::value_type>();
}

/// Short text of a YAML node for "got ..." messages.
std::string describe_node(const YAML::Node& n);

/// Every number of a config must be finite and within fp32's range (the tensors it reaches are fp32): NaN, ±inf
/// and magnitudes above 3.4e38 are UserErrors naming the key.
void check_number(double v, const std::string& text, const std::string& what);

/// Converts one YAML node to T (strict), throwing UserError(`what`) on a type mismatch.
template <class T>
T decode(const YAML::Node& n, const std::string& what) {
  auto fail = [&]() -> T {
    throw UserError(
        what, "expected " +
                  [] {
                    if constexpr (std::is_same_v<T, bool>)
                      return std::string("true or false");
                    else if constexpr (std::is_integral_v<T>)
                      return std::string("an integer");
                    else if constexpr (std::is_floating_point_v<T>)
                      return std::string("a number");
                    else if constexpr (std::is_same_v<T, std::string>)
                      return std::string("a string");
                    else
                      return "a " + type_name<T>();
                  }() +
                  ", got " + describe_node(n));
  };
  if constexpr (std::is_enum_v<T>) {
    if (!n.IsScalar()) return fail();
    return enum_from_string<T>(n.Scalar(), what);
  } else if constexpr (std::is_same_v<T, bool> || std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    if (!n.IsScalar()) {
      if constexpr (std::is_same_v<T, std::string>)
        if (n.IsNull()) return std::string();
      return fail();
    }
    if constexpr (std::is_same_v<T, bool>) {
      const std::string& s = n.Scalar();
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      return fail();
    } else {
      T v;
      try {
        v = n.as<T>();
      } catch (const YAML::Exception&) {
        return fail();
      }
      if constexpr (std::is_floating_point_v<T>) check_number(static_cast<double>(v), n.Scalar(), what);
      return v;
    }
  } else {
    using E = typename T::value_type;
    if (!n.IsSequence()) return fail();
    T out;
    for (size_t i = 0; i < n.size(); ++i) out.push_back(decode<E>(n[i], what + "[" + std::to_string(i) + "]"));
    return out;
  }
}

/// Shortest decimal text of a double that parses back to the same value ("0.1", not "0.10000000000000001").
std::string shortest_double(double v);

/// Converts T to a YAML node (inverse of decode).
template <class T>
YAML::Node encode(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    return YAML::Node(shortest_double(static_cast<double>(v)));
  } else if constexpr (std::is_enum_v<T>) {
    return YAML::Node(to_string(v));
  } else if constexpr (std::is_same_v<T, bool> || std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    return YAML::Node(v);
  } else {
    YAML::Node seq(YAML::NodeType::Sequence);
    for (const auto& e : v) seq.push_back(encode(e));
    seq.SetStyle(YAML::EmitterStyle::Flow);
    return seq;
  }
}

/// Whether a field must be given (after `base:` inheritance and `--set`).
enum class Need { optional, required };

/// The values a numeric key takes (inclusive; for a list, each element): what `moh config --schema` prints after
/// its type and what the reader enforces, naming the key ("data.batch_size: 0 is outside [1, 1048576]").
struct Range {
  double min, max;
};
/// "[1, 65536]" (integers without a decimal point).
std::string range_text(const Range& r);
/// UserError(what, "V is outside [min, max]", help) unless min <= v <= max.
void check_range(double v, const Range& r, const std::string& what, const char* help);

/// YAML -> struct. Collects every known dotted key; `finish()` rejects unknown ones with a suggestion.
class Reader {
 public:
  Reader(YAML::Node node, std::string origin, std::string prefix = "");
  template <class T>
  void field(const char* key, T& value, const char* help, Need need = Need::optional) {
    std::string path = prefix_ + key;
    known_->push_back(path);
    YAML::Node n = node_.IsMap() ? node_[key] : YAML::Node();
    if (!n.IsDefined()) {
      if (need == Need::required) throw UserError("config " + origin_, "missing required key '" + path + "'", help);
      return;
    }
    // A key written without a value ("batch_size:" or --set key=) is a value forgotten, not a default asked for (a
    // string key reads it as ""): the decode says what it expected.
    value = decode<T>(n, "config " + origin_ + ": " + path);
  }
  template <class T>
  void field(const char* key, T& value, const char* help, Range range, Need need = Need::optional) {
    field(key, value, help, need);
    const std::string what = "config " + origin_ + ": " + prefix_ + key;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      check_range(static_cast<double>(value), range, what, help);
    } else {
      for (size_t i = 0; i < value.size(); ++i)
        check_range(static_cast<double>(value[i]), range, what + "[" + std::to_string(i) + "]", help);
    }
  }
  template <class S>
  void section(const char* key, S& sub, const char* help) {
    std::string path = prefix_ + key;
    known_->push_back(path);
    YAML::Node n = node_.IsMap() ? node_[key] : YAML::Node();
    if (n.IsDefined() && !n.IsNull() && !n.IsMap())
      throw UserError("config " + origin_ + ": " + path, "expected a map of keys, got " + describe_node(n), help);
    Reader child(n.IsDefined() ? n : YAML::Node(YAML::NodeType::Map), origin_, path + ".", known_, present_);
    sub.visit(child);
  }
  /// Throws on the first key present in the YAML that no visit() declared.
  void finish() const;

 private:
  Reader(YAML::Node node, std::string origin, std::string prefix, std::vector<std::string>* known,
         std::vector<std::string>* present);
  YAML::Node node_;
  std::string origin_, prefix_;
  std::vector<std::string> own_known_, own_present_;
  std::vector<std::string>* known_;
  std::vector<std::string>* present_;
};

/// struct -> YAML (the resolved config).
class Writer {
 public:
  explicit Writer(YAML::Node node) : node_(std::move(node)) {}
  template <class T>
  void field(const char* key, const T& value, const char*, Need = Need::optional) {
    node_[key] = encode(value);
  }
  template <class T>
  void field(const char* key, const T& value, const char* help, Range, Need need = Need::optional) {
    field(key, value, help, need);
  }
  template <class S>
  void section(const char* key, S& sub, const char*) {
    YAML::Node child(YAML::NodeType::Map);
    Writer w(child);
    sub.visit(w);
    node_[key] = child;
  }

 private:
  YAML::Node node_;
};

/// Converts T to a JSON value: the YAML writer's values (enums by name, lists as arrays), as numbers and strings.
template <class T>
nlohmann::json to_json_value(const T& v) {
  if constexpr (std::is_enum_v<T>) {
    return to_string(v);
  } else if constexpr (std::is_same_v<T, bool> || std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    return v;
  } else {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& e : v) a.push_back(to_json_value(e));
    return a;
  }
}

/// struct -> JSON object with the keys of the schema (records such as sampling.json carry a config section this way,
/// so a key added to the schema appears there without a second list).
class JsonWriter {
 public:
  explicit JsonWriter(nlohmann::json* out) : out_(out) {}
  template <class T>
  void field(const char* key, const T& value, const char*, Need = Need::optional) {
    (*out_)[key] = to_json_value(value);
  }
  template <class T>
  void field(const char* key, const T& value, const char* help, Range, Need need = Need::optional) {
    field(key, value, help, need);
  }
  template <class S>
  void section(const char* key, S& sub, const char*) {
    nlohmann::json child = nlohmann::json::object();
    JsonWriter w(&child);
    sub.visit(w);
    (*out_)[key] = child;
  }

 private:
  nlohmann::json* out_;
};

/// A whole struct as a JSON object (JsonWriter).
template <class S>
nlohmann::json to_json(S s) {
  nlohmann::json out = nlohmann::json::object();
  JsonWriter w(&out);
  s.visit(w);
  return out;
}

/// One documented key of the schema.
struct SchemaRow {
  std::string key, type, default_value, help;
  bool required = false;
};

/// struct -> list of documented keys (run on a default-constructed struct, so values are the defaults).
class SchemaLister {
 public:
  explicit SchemaLister(std::vector<SchemaRow>* rows, std::string prefix = "")
      : rows_(rows), prefix_(std::move(prefix)) {}
  template <class T>
  void field(const char* key, const T& value, const char* help, Need need = Need::optional) {
    YAML::Emitter e;
    e << YAML::Flow << encode(value);
    rows_->push_back({prefix_ + key, type_name<T>(), e.c_str(), help, need == Need::required});
  }
  template <class T>
  void field(const char* key, const T& value, const char* help, Range range, Need need = Need::optional) {
    field(key, value, help, need);
    rows_->back().type += " in " + range_text(range);
  }
  template <class S>
  void section(const char* key, S& sub, const char* help) {
    rows_->push_back({prefix_ + key, "section", "", help, false});
    SchemaLister child(rows_, prefix_ + key + ".");
    sub.visit(child);
  }

 private:
  std::vector<SchemaRow>* rows_;
  std::string prefix_;
};

/// Reads a whole struct from a YAML tree (strict).
template <class S>
S read_struct(const YAML::Node& root, const std::string& origin) {
  S s;
  Reader r(root, origin);
  s.visit(r);
  r.finish();
  return s;
}

/// Writes a whole struct to YAML text.
template <class S>
std::string write_struct(S s) {
  YAML::Node root(YAML::NodeType::Map);
  Writer w(root);
  s.visit(w);
  YAML::Emitter e;
  e << root;
  return std::string(e.c_str()) + "\n";
}

/// Lists all keys of a struct with defaults.
template <class S>
std::vector<SchemaRow> list_schema() {
  S s;
  std::vector<SchemaRow> rows;
  SchemaLister l(&rows);
  s.visit(l);
  return rows;
}

// ---- YAML trees: files with `base:` inheritance and `--set` overrides -------------------------------------------

/// Throws a UserError naming the first key that appears twice in one mapping of `node` (yaml-cpp would silently
/// keep the first).
void check_duplicate_keys(const YAML::Node& node, const std::string& origin, const std::string& prefix = "");
/// Limits of a config (stated at the top of docs/CONFIG.md): experiment files are a few KB, so a larger, binary or
/// exponentially aliased file ("billion laughs") is refused before anything walks it.
constexpr std::uintmax_t kMaxConfigBytes = 1u << 20;  ///< bytes of one YAML file
constexpr int64_t kMaxConfigNodes = 100000;           ///< nodes of a tree with every alias expanded
constexpr int kMaxConfigDepth = 64;                   ///< nesting of maps and sequences
/// The text of a YAML file: refuses a file over kMaxConfigBytes, one with a NUL byte and one that is not UTF-8.
std::string read_config_text(const std::string& path, const std::string& origin);
/// Refuses a tree with more than kMaxConfigNodes nodes once aliases are expanded, or nested deeper than
/// kMaxConfigDepth. Stops at the limit, so a hostile tree costs at most kMaxConfigNodes steps.
void check_tree_size(const YAML::Node& node, const std::string& origin);

/// Loads a YAML file, resolving `base: <relative path>` recursively (child keys override base keys, maps merge
/// deeply, lists replace). Missing files, parse errors and cycles are UserErrors.
YAML::Node load_tree(const std::string& path);

/// Applies one `a.b.c=value` override; the value is parsed as YAML (so `1e-3`, `[2,2,6,2]`, `moh` all work).
void apply_override(YAML::Node& root, const std::string& assignment);

/// Deep-merges `over` into a copy of `base`.
YAML::Node merge(const YAML::Node& base, const YAML::Node& over);

}  // namespace moh::config

namespace moh {

/// One key whose value differs between two resolved configs (YAML text of each side; "(absent)" if missing).
struct ConfigChange {
  std::string key, before, after;
};
/// The keys (dotted, sorted) whose values differ between two resolved config texts (e.g. a checkpoint's and the
/// resumed run's); `name` is ignored.
std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& after_yaml);

}  // namespace moh
