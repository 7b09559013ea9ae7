#pragma once
// Numbers written by users (flags, environment variables, spec strings such as "ddim50" or "rand-m9"): the whole text
// must be one decimal number. Every parser of such text goes through these two, so "12x", " 12", "+3", "" and "1e999"
// are refused alike, whatever the locale; the caller says what the text was and what it expects.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace moh {

/// `text` as a decimal integer (an optional leading '-'); nullopt when it is anything else or out of int64's range.
inline std::optional<int64_t> parse_int(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || stop != end) return std::nullopt;
  return v;
}

/// `text` as a finite decimal number (1, -0.5, 2e-4, .5); nullopt for anything else, inf and nan included.
inline std::optional<double> parse_double(const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v, std::chars_format::general);
  if (text.empty() || ec != std::errc() || stop != end || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace moh
