#include "core/json_read.h"

namespace moh {

nlohmann::json parse_json(const std::string& text, const std::string& what, const std::string& hint) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(what, "is not valid JSON (at byte " + std::to_string(e.byte) + ")", hint);
  }
}

}  // namespace moh
