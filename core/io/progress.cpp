#include "core/io/progress.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <streambuf>
#include <vector>

#include "core/io/tensorboard.h"

namespace moh {

// Plain (non-terminal) mode prints at most one line per this many seconds.
constexpr double kPlainIntervalSeconds = 10.0;
// Terminal mode redraws at most this often.
constexpr double kTtyIntervalSeconds = 0.1;
constexpr int kBarWidth = 24;

Progress::Progress(std::string label, int64_t total, std::string unit, int interactive, int64_t initial)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      done_(initial),
      initial_(initial),
      tty_(interactive < 0 ? ::isatty(STDERR_FILENO) != 0 : interactive == 1),
      silent_(interactive == 2),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

Progress::~Progress() {
  if (open_) std::cerr << "\n";
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
  if (!status.empty()) last_status_ = status;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_print_).count();
  bool last = total_ > 0 && done_ >= total_;
  if ((last && tty_) || since >= (tty_ ? kTtyIntervalSeconds : kPlainIntervalSeconds)) {
    render(false, status);
    last_print_ = now;
  }
}

void Progress::end_line(const std::string& status) {
  if (finished_ || (!tty_ && done_ == rendered_)) return;  // plain mode: that line is already out
  render(true, status);
  last_print_ = std::chrono::steady_clock::now();
}

void Progress::finish(const std::string& status) {
  if (finished_) return;
  render(true, status);
  finished_ = true;
}

void Progress::render(bool final_line, const std::string& status) {
  if (silent_) return;
  rendered_ = done_;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? static_cast<double>(done_ - initial_) / elapsed : 0.0;
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
  if (total_ > 0 && done_ < total_) line << " ETA " << format_duration(rate > 0 ? (total_ - done_) / rate : -1);
  if (!status.empty()) last_status_ = status;
  if (!last_status_.empty()) line << " " << last_status_;
  if (tty_) {
    std::cerr << "\r\033[K" << line.str() << (final_line ? "\n" : "") << std::flush;
    open_ = !final_line;
  } else {
    std::cerr << line.str() << "\n" << std::flush;
  }
}

namespace {

// [[...], [...]] of numbers (ragged allowed) -> rows; nullopt for anything else.
std::optional<std::vector<std::vector<double>>> number_matrix(const nlohmann::json& v) {
  if (!v.is_array() || v.empty()) return std::nullopt;
  std::vector<std::vector<double>> rows;
  for (const auto& r : v) {
    if (!r.is_array()) return std::nullopt;
    rows.emplace_back();
    for (const auto& x : r) {
      if (!x.is_number()) return std::nullopt;
      rows.back().push_back(x.get<double>());
    }
  }
  return rows;
}

void mirror_line(TensorBoardWriter& tb, const nlohmann::json& line) {
  const int64_t step = line["step"].get<int64_t>();
  for (const auto& [key, v] : line.items()) {
    if (key == "step") continue;
    if (v.is_number())
      tb.add_scalar(key, v.get<double>(), step);
    else if (auto m = number_matrix(v))
      tb.add_heatmap(key, *m, step);
  }
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool truncate) : path_(path) {
  std::ofstream f(path, truncate ? std::ios::trunc : std::ios::app);
  if (!f) throw std::runtime_error("cannot open metrics file " + path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  nlohmann::json line = record;
  line["time"] = utc_timestamp();
  line["elapsed_s"] =
      std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() * 1000) / 1000;
  std::ofstream f(path_, std::ios::app);
  f << line.dump() << "\n";
  f.flush();
  if (tb_ && line.contains("step") && line["step"].is_number_integer()) mirror_line(*tb_, line);
}

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];  // room for any int the format could print (GCC's -Wformat-truncation)
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

// Forwards every character to the original stderr buffer and appends finished lines to the log file.
class ConsoleLog::Tee : public std::streambuf {
 public:
  Tee(std::streambuf* original, const std::string& path) : original_(original), file_(path, std::ios::app) {}
  ~Tee() override {
    if (!line_.empty()) write_line();
  }
  std::streambuf* original() const { return original_; }

 protected:
  int overflow(int c) override {
    if (c == EOF) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    original_->sputc(static_cast<char>(c));
    if (c == '\n')
      write_line();
    else
      line_.push_back(static_cast<char>(c));
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard<std::mutex> lock(mu_);
    original_->sputn(s, n);
    for (std::streamsize i = 0; i < n; ++i) {
      if (s[i] == '\n')
        write_line();
      else
        line_.push_back(s[i]);
    }
    return n;
  }
  int sync() override { return original_->pubsync(); }

 private:
  void write_line() {
    std::string l = line_.substr(line_.rfind('\r') == std::string::npos ? 0 : line_.rfind('\r') + 1);
    for (size_t e; (e = l.find('\033')) != std::string::npos;) {  // drop ANSI sequences such as ESC[K
      size_t end = e + 1;
      if (end < l.size() && l[end] == '[')
        while (++end < l.size() && !std::isalpha(static_cast<unsigned char>(l[end]))) {
        }
      l.erase(e, std::min(l.size(), end + 1) - e);
    }
    line_.clear();
    file_ << l << '\n';
    file_.flush();
  }
  std::streambuf* original_;
  std::ofstream file_;
  std::string line_;
  std::mutex mu_;
};

ConsoleLog::ConsoleLog(const std::string& path) : tee_(std::make_unique<Tee>(std::cerr.rdbuf(), path)) {
  std::cerr.rdbuf(tee_.get());
}

ConsoleLog::~ConsoleLog() {
  std::cerr.rdbuf(tee_->original());
}

namespace {
std::mutex g_notes_mu;
std::vector<std::string> g_notes;
}  // namespace

void note_later(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_notes_mu);
  g_notes.push_back(line);
}

void print_notes() {
  std::lock_guard<std::mutex> lock(g_notes_mu);
  for (const auto& l : g_notes) std::cerr << l << "\n";
  g_notes.clear();
}

}  // namespace moh
