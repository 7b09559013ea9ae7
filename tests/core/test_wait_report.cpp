// What a rank prints while a collective waits (core/dist/wait_report.h), against a store kept in memory: it names the
// ranks that have not reached the collective, repeats, says so when the store does not answer, and is silent once
// the collective ends. The times are shortened; every check waits for an event, none for a fixed time.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "core/dist/wait_report.h"

namespace moh::dist {
namespace {

using namespace std::chrono_literals;

struct FakeStore {
  std::mutex mu;
  std::vector<int64_t> posted = std::vector<int64_t>(3, -1);
  std::vector<std::string> said;
  std::shared_future<void> answers;  // reads wait for it (a store whose holder is stopped)
};

WaitReportIO fake_io(const std::shared_ptr<FakeStore>& store, int me) {
  WaitReportIO io;
  io.post = [store, me](int64_t n) {
    std::lock_guard<std::mutex> lock(store->mu);
    store->posted[static_cast<size_t>(me)] = n;
  };
  io.read = [store] {
    if (store->answers.valid()) store->answers.wait();
    std::lock_guard<std::mutex> lock(store->mu);
    return store->posted;
  };
  io.describe = [](int r) { return "rank " + std::to_string(r) + " (host h" + std::to_string(r) + ", pid 17)"; };
  io.store_holder = io.describe(0);
  return io;
}

WaitReporter reporter(const std::shared_ptr<FakeStore>& store, int me) {
  WaitReportTimes t;
  t.post = 20ms, t.first_report = 100ms, t.repeat = 100ms, t.answer_within = 200ms, t.give_up_s = 300;
  return WaitReporter(me, fake_io(store, me), t, [store](const std::string& line) {
    std::lock_guard<std::mutex> lock(store->mu);
    store->said.push_back(line);
  });
}

// Waits (up to a minute, for a loaded machine) until `ready` holds under the store's lock.
template <class F>
bool eventually(FakeStore& store, F ready) {
  for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until;) {
    {
      std::lock_guard<std::mutex> lock(store.mu);
      if (ready()) return true;
    }
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST(WaitReport, RanksBehindAreThoseBelowThisRanksCollective) {
  EXPECT_EQ(ranks_behind({3, 3, 2, -1}, 1, 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(ranks_behind({4, 3, 5}, 1, 3), (std::vector<int>{}));
}

TEST(WaitReport, NamesTheRankThatHasNotArrivedRepeatsAndFallsSilentWhenTheCollectiveEnds) {
  auto store = std::make_shared<FakeStore>();
  store->posted[2] = 1;  // rank 2 waits in the same collective; rank 0 never came
  WaitReporter w = reporter(store, 1);
  EXPECT_EQ(w.begin("all-reduce"), 1);
  ASSERT_TRUE(eventually(*store, [&] { return store->posted[1] == 1 && store->said.size() >= 2; }));
  w.end();
  size_t said = 0;
  {
    std::lock_guard<std::mutex> lock(store->mu);
    said = store->said.size();
    for (const auto& line : store->said) {
      EXPECT_EQ(line.rfind("moh: rank 1 has waited ", 0), 0u) << line;
      EXPECT_NE(line.find(" s in all-reduce #1 for rank 0 (host h0, pid 17), which has not reached it; it gives up "
                          "after 300 s (MOH_DIST_TIMEOUT), in "),
                std::string::npos)
          << line;
      EXPECT_EQ(line.find("rank 2"), std::string::npos) << line;
    }
  }
  // A collective that ends before the posting time posts nothing and says nothing.
  store->posted[1] = -1;
  EXPECT_EQ(w.begin("broadcast"), 2);
  w.end();
  std::this_thread::sleep_for(300ms);  // longer than first_report: a line now would be one too many
  std::lock_guard<std::mutex> lock(store->mu);
  EXPECT_EQ(store->said.size(), said);
  EXPECT_EQ(store->posted[1], -1);
}

TEST(WaitReport, AStoreThatDoesNotAnswerIsNamedInsteadOfHangingTheRank) {
  auto store = std::make_shared<FakeStore>();
  std::promise<void> release;
  store->answers = release.get_future().share();
  {
    WaitReporter w = reporter(store, 2);
    w.begin("barrier");
    ASSERT_TRUE(eventually(*store, [&] { return !store->said.empty(); }));
    w.end();
  }
  release.set_value();  // lets the reads left behind finish
  std::lock_guard<std::mutex> lock(store->mu);
  EXPECT_NE(store->said[0].find(
                "in barrier #1 and cannot ask the others: the store held by rank 0 (host h0, pid 17) does not answer"),
            std::string::npos)
      << store->said[0];
}

}  // namespace
}  // namespace moh::dist
