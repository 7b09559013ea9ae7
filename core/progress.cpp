#include "core/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace moh {

// Plain (non-terminal) mode prints at most one line per this many seconds.
constexpr double kPlainIntervalSeconds = 10.0;
// Terminal mode redraws at most this often.
constexpr double kTtyIntervalSeconds = 0.1;
constexpr int kBarWidth = 24;

Progress::Progress(std::string label, int64_t total, std::string unit, int interactive)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      tty_(interactive < 0 ? ::isatty(STDERR_FILENO) != 0 : interactive == 1), silent_(interactive == 2),
      start_(std::chrono::steady_clock::now()), last_print_(start_) {}

Progress::~Progress() {
  if (!finished_ && done_ > 0 && tty_ && !silent_) std::cerr << "\n";
}

std::string Progress::format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

void Progress::advance(int64_t n, const std::string& status) {
  done_ += n;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_print_).count();
  bool last = total_ > 0 && done_ >= total_;
  if (last || since >= (tty_ ? kTtyIntervalSeconds : kPlainIntervalSeconds)) {
    render(false, status);
    last_print_ = now;
  }
}

void Progress::finish(const std::string& status) {
  if (finished_) return;
  render(true, status);
  finished_ = true;
}

void Progress::render(bool final_line, const std::string& status) {
  if (silent_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? done_ / elapsed : 0.0;
  std::ostringstream line;
  line << label_ << " ";
  if (total_ > 0) {
    double frac = std::min(1.0, static_cast<double>(done_) / total_);
    if (tty_) {
      int fill = static_cast<int>(frac * kBarWidth);
      line << "[" << std::string(fill, '#') << std::string(kBarWidth - fill, '.') << "] ";
    }
    line << done_ << "/" << total_ << " (" << static_cast<int>(frac * 100) << "%)";
  } else {
    line << done_;
  }
  char r[64];
  std::snprintf(r, sizeof r, " %.2f %s/s", rate, unit_.c_str());
  line << r << " elapsed " << format_duration(elapsed);
  if (total_ > 0 && !final_line) line << " ETA " << format_duration(rate > 0 ? (total_ - done_) / rate : -1);
  if (!status.empty()) line << " " << status;
  if (tty_)
    std::cerr << "\r\033[K" << line.str() << (final_line ? "\n" : "") << std::flush;
  else
    std::cerr << line.str() << "\n" << std::flush;
}

MetricsWriter::MetricsWriter(const std::string& path, bool truncate) : path_(path) {
  std::ofstream f(path, truncate ? std::ios::trunc : std::ios::app);
  if (!f) throw std::runtime_error("cannot open metrics file " + path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  std::ofstream f(path_, std::ios::app);
  f << record.dump() << "\n";
  f.flush();
}

}  // namespace moh
