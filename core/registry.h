#pragma once
// Lookup in a model family's variant table (one table per family, e.g. dit_variants(), classifier_variants()):
// an unknown name is a UserError that suggests the nearest valid name or lists them all.
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moh {

/// The options registered under `name` in `table`; `family` names the table in the error ("DiT variant").
template <class Options>
const Options& find_variant(const std::vector<std::pair<std::string, Options>>& table, const std::string& name,
                            const std::string& family) {
  std::vector<std::string> names;
  for (const auto& [n, o] : table) {
    if (n == name) return o;
    names.push_back(n);
  }
  std::string near = nearest_name(name, names);
  throw UserError("model '" + name + "'", "unknown " + family,
                  near.empty() ? "valid: " + join(names) : "did you mean '" + near + "'?");
}

}  // namespace moh
