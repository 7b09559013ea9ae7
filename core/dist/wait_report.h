#pragma once
// What a rank says while a collective waits: a rank blocked in an all-reduce because another rank stopped answering
// (SIGSTOP, a hung kernel, a machine cut off) would otherwise sit silent until the backend's timeout. After a short
// wait the rank posts how far it got (the number of its collective) where the others can read it; after
// `first_report` it prints one line naming the ranks that have not reached that collective and when it will give up,
// then one line every `repeat`. The posting and reading go through callbacks (the run's store) that may block for
// ever when the rank holding the store is the stopped one: they run on threads of their own, and a reading that does
// not come back within `answer_within` is reported as such instead.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moh::dist {

struct WaitReportTimes {
  std::chrono::milliseconds post{2000};           ///< wait after which this rank posts its collective's number
  std::chrono::milliseconds first_report{30000};  ///< wait after which the first line is printed
  std::chrono::milliseconds repeat{60000};        ///< then one line per `repeat`
  std::chrono::milliseconds answer_within{5000};  ///< how long a reading of the store may take
  double give_up_s = 300;                         ///< the backend's timeout (MOH_DIST_TIMEOUT), for the message
};

struct WaitReportIO {
  /// Publishes "this rank waits in collective number n".
  std::function<void(int64_t n)> post;
  /// The last number each rank posted (index = rank; -1 = none yet).
  std::function<std::vector<int64_t>()> read;
  /// "rank 1 (host h1, pid 4242)" for a line.
  std::function<std::string(int rank)> describe;
  /// "rank 0 (host h0, pid 17)": who holds the store, for the line when it does not answer.
  std::string store_holder;
};

/// The ranks a waiting rank waits for: those whose posted number is below `mine` (or that posted none).
std::vector<int> ranks_behind(const std::vector<int64_t>& posted, int me, int64_t mine);

class WaitReporter {
 public:
  /// `say` prints one line (std::cerr in a run).
  WaitReporter(int rank, WaitReportIO io, WaitReportTimes times, std::function<void(const std::string&)> say);
  ~WaitReporter();
  WaitReporter(const WaitReporter&) = delete;
  WaitReporter& operator=(const WaitReporter&) = delete;

  /// A collective starts (`what`: "all-reduce"); returns its number. end() when it returns or throws.
  int64_t begin(const char* what);
  void end();

 private:
  void watch();
  std::string line(double waited_s, int64_t mine, const std::string& what) const;
  int rank_;
  WaitReportIO io_;
  WaitReportTimes times_;
  std::function<void(const std::string&)> say_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, active_ = false;
  int64_t seq_ = 0;
  const char* what_ = "";
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace moh::dist
