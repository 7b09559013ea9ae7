#pragma once
// Reading JSON files users can damage (sweep records, reference statistics' meta, run markers) with input errors that
// name the file and say what is wrong, instead of the JSON library's own text ("[json.exception.type_error.302] ...").
#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"

namespace moh {

/// The JSON document in `text`, read from `what` (a file, a member); UserError(what, "is not valid JSON (at byte N)",
/// hint) for anything else.
nlohmann::json parse_json(const std::string& text, const std::string& what, const std::string& hint);

/// read(doc) for a parsed document; a JSON error inside it (a field of another type, an array where an object was
/// expected) becomes UserError(what, "is not " + kind + " (" + where + ")", hint).
template <class F>
auto read_json_fields(const std::string& what, const std::string& kind, const std::string& hint, F&& read)
    -> decltype(read()) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw UserError(what, "is not " + kind + " (a field has another type)", hint);
  }
}

}  // namespace moh
