#pragma once
// Progress reporting for long work: a redrawn bar with rate and ETA when stderr is a terminal, plain periodic lines
// otherwise (logs, CI). Metrics go to JSONL (MetricsWriter), not here.
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace moh {

/// A progress bar over `total` units (images, steps, ...).
class Progress {
 public:
  /// `interactive`: -1 = detect (isatty(stderr)), 0 = plain lines, 1 = redrawn bar, 2 = silent (data-parallel ranks
  /// other than 0).
  Progress(std::string label, int64_t total, std::string unit = "it", int interactive = -1);
  ~Progress();
  /// Advances by n units; `status` (e.g. "loss=0.123") is shown after the rate.
  void advance(int64_t n = 1, const std::string& status = "");
  /// Prints the final line (idempotent).
  void finish(const std::string& status = "");
  /// "1:02:03" / "4:05".
  static std::string format_duration(double seconds);

 private:
  void render(bool final_line, const std::string& status);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool tty_, silent_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_print_;
};

/// Appends one JSON object per line to a metrics file (flushed per line, so a killed run keeps every line).
class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// Opens `path` for appending (truncate=true starts a new file).
  explicit MetricsWriter(const std::string& path, bool truncate = false);
  /// Appends one line (a default-constructed writer, as on non-main ranks, writes nothing).
  void write(const nlohmann::json& record);
  bool is_open() const { return !path_.empty(); }

 private:
  std::string path_;
};

}  // namespace moh
