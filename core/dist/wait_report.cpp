#include "core/dist/wait_report.h"

#include <future>
#include <optional>

namespace moh::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Runs `f` on a thread of its own and waits at most `within` for it: a store call that never returns (its holder is
// stopped) leaves only that thread behind, never the caller.
template <class T>
std::optional<T> within(std::function<T()> f, std::chrono::milliseconds wait) {
  std::packaged_task<T()> task(std::move(f));
  std::future<T> answer = task.get_future();
  std::thread(std::move(task)).detach();
  if (answer.wait_for(wait) != std::future_status::ready) return std::nullopt;
  try {
    return answer.get();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::vector<int> ranks_behind(const std::vector<int64_t>& posted, int me, int64_t mine) {
  std::vector<int> out;
  for (size_t r = 0; r < posted.size(); ++r)
    if (static_cast<int>(r) != me && posted[r] < mine) out.push_back(static_cast<int>(r));
  return out;
}

WaitReporter::WaitReporter(int rank, WaitReportIO io, WaitReportTimes times,
                           std::function<void(const std::string&)> say)
    : rank_(rank), io_(std::move(io)), times_(times), say_(std::move(say)), thread_([this] { watch(); }) {}

WaitReporter::~WaitReporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t WaitReporter::begin(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  active_ = true, what_ = what, since_ = Clock::now();
  const int64_t n = ++seq_;
  cv_.notify_all();
  return n;
}

void WaitReporter::end() {
  std::lock_guard<std::mutex> lock(mu_);
  active_ = false;
  cv_.notify_all();
}

// One line: how long, in which collective, for whom, and when the backend gives up.
std::string WaitReporter::line(double waited_s, int64_t mine, const std::string& what) const {
  auto read = io_.read;
  const auto posted = within<std::vector<int64_t>>([read] { return read(); }, times_.answer_within);
  std::string whom;
  if (!posted) {
    whom = " and cannot ask the others: the store held by " + io_.store_holder +
           " does not answer (is that process stopped?)";
  } else {
    const auto behind = ranks_behind(*posted, rank_, mine);
    for (size_t i = 0; i < behind.size() && i < 4; ++i) whom += (i ? ", " : " for ") + io_.describe(behind[i]);
    if (behind.size() > 4) whom += ", …";
    whom = behind.empty() ? ", which every rank has reached (the backend itself is stuck)"
                          : whom + (behind.size() > 1 ? ", which have" : ", which has") + " not reached it";
  }
  const auto left = static_cast<long>(times_.give_up_s - waited_s + 0.5);
  return "moh: rank " + std::to_string(rank_) + " has waited " + std::to_string(static_cast<long>(waited_s + 0.5)) +
         " s in " + what + " #" + std::to_string(mine) + whom + "; it gives up after " +
         std::to_string(static_cast<long>(times_.give_up_s)) + " s (MOH_DIST_TIMEOUT), in " +
         std::to_string(left > 0 ? left : 0) + " s";
}

void WaitReporter::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || active_; });
    if (stop_) return;
    const int64_t n = seq_;
    const auto start = since_;
    const auto over = [this, n] { return stop_ || !active_ || seq_ != n; };
    if (cv_.wait_until(lock, start + times_.post, over)) continue;
    auto post = io_.post;  // published from a thread of its own: the store may not answer
    within<bool>(
        [post, n] {
          post(n);
          return true;
        },
        std::chrono::milliseconds(0));
    for (auto next = start + times_.first_report; !cv_.wait_until(lock, next, over); next += times_.repeat) {
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      const std::string what = what_;
      lock.unlock();  // the reading may take answer_within: begin() and end() must not wait for it
      const std::string text = line(waited, n, what);
      lock.lock();
      if (over()) break;
      say_(text);
    }
  }
}

}  // namespace moh::dist
