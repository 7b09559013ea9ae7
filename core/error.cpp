#include "core/error.h"

#include <algorithm>

namespace moh {

UserError::UserError(std::string what, std::string why, std::string hint)
    : std::runtime_error(format_error_line(what, why, hint)),
      what_(std::move(what)),
      why_(std::move(why)),
      hint_(std::move(hint)) {}

std::string format_error_line(const std::string& what, const std::string& why, const std::string& hint) {
  std::string line = "error: " + what + ": " + why;
  if (!hint.empty()) line += " (" + hint + ")";
  // One line, always: fold embedded newlines.
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_name(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = static_cast<size_t>(-1);
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Plausible typo: at most a third of the key's length, and never more than 4 edits.
  size_t limit = std::max<size_t>(2, std::min<size_t>(4, key.size() / 3));
  return best_d <= limit ? best : "";
}

std::string join(const std::vector<std::string>& names, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? sep : "") + names[i];
  return out;
}

}  // namespace moh
