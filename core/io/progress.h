#pragma once
// Progress reporting for long work: a redrawn bar with rate and ETA when stderr is a terminal, plain periodic lines
// otherwise (logs, CI). Metrics go to JSONL (MetricsWriter), not here.
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace moh {

class TensorBoardWriter;  // core/io/tensorboard.h

/// A progress bar over `total` units (images, steps, ...).
class Progress {
 public:
  /// `interactive`: -1 = detect (isatty(stderr)), 0 = plain lines, 1 = redrawn bar, 2 = silent (data-parallel ranks
  /// other than 0).
  /// `initial`: units already done before this process (a resumed run): shown in the count, not in the rate.
  Progress(std::string label, int64_t total, std::string unit = "it", int interactive = -1, int64_t initial = 0);
  ~Progress();
  /// Changes the text before the count (e.g. "epoch 2/4 step").
  void set_label(std::string label) { label_ = std::move(label); }
  /// Ends the current line (a bar is kept as a finished line) so other messages can follow; the bar goes on after.
  void end_line(const std::string& status = "");
  /// Advances by n units; `status` (e.g. "loss=0.123") is shown after the rate.
  void advance(int64_t n = 1, const std::string& status = "");
  /// Prints the final line (idempotent).
  void finish(const std::string& status = "");
  /// "1:02:03" / "4:05".
  static std::string format_duration(double seconds);

 private:
  void render(bool final_line, const std::string& status);
  std::string label_, unit_, last_status_;
  int64_t total_, done_ = 0, initial_ = 0, rendered_ = -1;  // rendered_: done_ at the last printed line
  bool tty_, silent_, finished_ = false, open_ = false;     // open_: a terminal bar drawn without its newline
  std::chrono::steady_clock::time_point start_, last_print_;
};

/// Appends one JSON object per line to a metrics file (flushed per line, so a killed run keeps every line). Every
/// line gets "time" (UTC wall clock, ISO 8601 with milliseconds) and "elapsed_s" (seconds since the writer opened,
/// i.e. since this process started or resumed the run).
class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// Opens `path` for appending (truncate=true starts a new file).
  explicit MetricsWriter(const std::string& path, bool truncate = false);
  /// Appends one line (a default-constructed writer, as on non-main ranks, writes nothing).
  void write(const nlohmann::json& record);
  /// Every line with a "step" also goes to `tb`: each number (but the step) as a scalar of its key, each matrix of
  /// numbers (the head-load shares) as a heat map.
  void mirror_to(std::shared_ptr<TensorBoardWriter> tb) { tb_ = std::move(tb); }

 private:
  std::string path_;
  std::shared_ptr<TensorBoardWriter> tb_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// While alive, everything written to std::cerr is also appended to `path` (a run's log.txt): whole lines only, a
/// terminal bar's redraws reduced to the line it ends with, escape sequences removed.
class ConsoleLog {
 public:
  explicit ConsoleLog(const std::string& path);
  ~ConsoleLog();
  ConsoleLog(const ConsoleLog&) = delete;
  ConsoleLog& operator=(const ConsoleLog&) = delete;

 private:
  class Tee;
  std::unique_ptr<Tee> tee_;
};

/// "2026-11-23T00:20:01.123Z".
std::string utc_timestamp();

/// Info and warning lines about the input that wait until every input check has passed (e.g. "train: 16 images
/// decoded, 0 unreadable skipped"): a refused input then gets its one `error:` line and nothing else. print_notes()
/// writes them to stderr (once every check has passed: a trainer when it starts writing, a command when its data are
/// loaded) and forgets them.
void note_later(const std::string& line);
void print_notes();

}  // namespace moh
