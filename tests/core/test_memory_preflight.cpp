// The memory check's measurement (core/memory_preflight.h) with a step whose need is known: it touches `batch`
// blocks of kBlock bytes, so the measured line must have that slope, and the batches it measures follow the rule
// (doubling while a step is short, half the first batch when the first step is already slow).
#include <ATen/Parallel.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory_preflight.h"
#include "core/run_context.h"
#include "tests/test_util.h"

namespace moh {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr size_t kBlock = 48 << 20;
volatile char g_sink = 0;  // read from every block: the writes cannot be left out

// build(batch) for measure_memory_need: a step that holds batch × kBlock bytes, every page written, then frees them;
// `built` records the batches in the order they were built.
std::function<std::function<void()>(int64_t)> touching(std::vector<int64_t>& built) {
  return [&built](int64_t batch) {
    built.push_back(batch);
    return [batch] {
      std::vector<std::unique_ptr<char[]>> blocks;
      for (int64_t i = 0; i < batch; ++i) {
        blocks.emplace_back(new char[kBlock]);
        std::memset(blocks.back().get(), static_cast<int>(i + 1), kBlock);
        g_sink = static_cast<char>(g_sink + blocks.back()[kBlock / 2]);
      }
    };
  };
}

// The slope within a tenth of a block: the resident set also moves by what the allocator and the test keep (a few
// MiB), far less than the blocks between the two measured batches.
void expect_slope_of_one_block(const MemoryNeed& need) {
  EXPECT_NEAR(need.per_sample / kMiB, kBlock / kMiB, 0.1 * kBlock / kMiB);
  EXPECT_GT(need.fixed, 0.0);
}

TEST(MemoryCheck, ShortStepsDoubleTheBatchUpToTheRunsBatch) {
  std::vector<int64_t> built;
  const MemoryNeed need = measure_memory_need(touching(built), 2, 12, c10::Device(c10::kCPU), /*step_seconds=*/1e9);
  EXPECT_EQ(built, (std::vector<int64_t>{2, 4, 8, 12}));
  expect_slope_of_one_block(need);
}

TEST(MemoryCheck, ASlowFirstStepIsPairedWithHalfItsBatch) {
  std::vector<int64_t> built;
  const MemoryNeed need = measure_memory_need(touching(built), 4, 64, c10::Device(c10::kCPU), /*step_seconds=*/0);
  EXPECT_EQ(built, (std::vector<int64_t>{4, 2}));
  expect_slope_of_one_block(need);
}

TEST(MemoryCheck, NoLargerBatchThanTheRunsIsMeasured) {
  std::vector<int64_t> built;
  const MemoryNeed need = measure_memory_need(touching(built), 4, 4, c10::Device(c10::kCPU), /*step_seconds=*/0);
  EXPECT_EQ(built, (std::vector<int64_t>{4}));
  EXPECT_EQ(need.per_sample, 0.0);
  EXPECT_GE(need.fixed, 4 * static_cast<double>(kBlock));
}

// The memory check's measurement and the image loader leave malloc to a user who tunes it through the environment.
TEST(MemoryCheck, MallocTunedByUserFollowsTheEnvironment) {
  const char* names[] = {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
  for (const char* n : names) unsetenv(n);
  EXPECT_FALSE(malloc_tuned_by_user());
  for (const char* n : names) {
    setenv(n, "1", 1);
    EXPECT_TRUE(malloc_tuned_by_user()) << n;
    unsetenv(n);
  }
  EXPECT_FALSE(malloc_tuned_by_user());
  for (const auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}

TEST(MemoryCheck, TheRefusalNamesTheEstimateAndTheLargestSettingThatFits) {
  const MemoryNeed need{1 * kGiB, 0.5 * kGiB, 0};
  MemoryPlan plan;
  plan.what = "training X", plan.batch = 64, plan.per_batch = 2, plan.sharing = 2, plan.setting = "data.batch_size";
  const MemoryAvailable available{10 * kGiB, "this machine"};
  EXPECT_EQ(check_memory_fits(need, {plan.what, 18, 2, 2, plan.setting, ""}, available), 10 * kGiB);
  const std::string msg = test::user_error_of([&] { check_memory_fits(need, plan, available); });
  EXPECT_NE(msg.find("needs about 66.0 GiB on this machine (2 processes × 33.0 GiB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20.0 GiB available"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower data.batch_size to at most 36"), std::string::npos) << msg;  // 18 per process × 2
}

// An all-reduce over `world` ranks in threads of this process: each call returns the sum of every rank's vector.
class ThreadSum {
 public:
  explicit ThreadSum(int world) : world_(world) {}
  std::vector<double> operator()(const std::vector<double>& v) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (sum_.empty()) sum_.assign(v.size(), 0.0);
    for (size_t i = 0; i < v.size(); ++i) sum_[i] += v[i];
    if (++arrived_ == world_) done_.notify_all();
    done_.wait(lock, [this] { return arrived_ == world_; });
    return sum_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<double> sum_;
  int world_, arrived_ = 0;
};

// Ranks 0..3 with the given machine keys and local ranks, each in a thread; returns what each rank took and records
// which ranks measured.
std::vector<std::vector<double>> share_over(const std::vector<uint32_t>& hosts, const std::vector<int>& local_ranks,
                                            std::vector<int>& measured) {
  const int world = static_cast<int>(hosts.size());
  ThreadSum sum(world);
  std::mutex m;
  std::vector<std::vector<double>> took(hosts.size());
  auto rank = [&](int r) {
    RunContext ctx;
    ctx.rank = r, ctx.world = world, ctx.local_rank = local_ranks[static_cast<size_t>(r)], ctx.local_world = 2;
    const double h = hosts[static_cast<size_t>(r)];
    took[static_cast<size_t>(r)] = once_per_machine(
        [&, r, h] {
          const std::lock_guard<std::mutex> lock(m);
          measured.push_back(r);
          return std::vector<double>{h + 0.25, 1e12 + r};
        },
        2, ctx, [&sum](const std::vector<double>& v) { return sum(v); }, hosts[static_cast<size_t>(r)]);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank, r);
  for (auto& t : threads) t.join();
  std::sort(measured.begin(), measured.end());
  return took;
}

TEST(MemoryCheck, OneProcessPerMachineMeasuresAndEveryRankTakesItsMachinesNumbers) {
  std::vector<int> measured;
  const auto took = share_over({7, 7, 2147483647u, 2147483647u}, {0, 1, 0, 1}, measured);
  EXPECT_EQ(measured, (std::vector<int>{0, 2}));
  const std::vector<double> first{7.25, 1e12}, second{2147483647.25, 1e12 + 2};  // exact: one writer per slot
  EXPECT_EQ(took, (std::vector<std::vector<double>>{first, first, second, second}));
}

TEST(MemoryCheck, ARankWhoseMachineHasNoLocalRankZeroMeasuresItself) {
  std::vector<int> measured;
  const auto took = share_over({7, 7, 9}, {0, 1, 1}, measured);
  EXPECT_EQ(measured, (std::vector<int>{0, 2}));
  EXPECT_EQ(took[1], (std::vector<double>{7.25, 1e12}));
  EXPECT_EQ(took[2], (std::vector<double>{9.25, 1e12 + 2}));
}

// The measuring process computes with the threads of every process of its machine (at most its cores) and gives them
// back; a run that does not fit is refused on every rank with the one measurement's numbers.
TEST(MemoryCheck, TheMeasuringProcessUsesTheMachinesThreadsAndEveryRankIsRefused) {
  ThreadSum sum(2);
  std::vector<std::string> errors(2);
  std::vector<int> before(2), inside(2, -1), after(2);
  auto rank = [&](int r) {
    RunContext ctx;
    ctx.rank = r, ctx.world = 2, ctx.local_rank = r, ctx.local_world = 2;
    before[static_cast<size_t>(r)] = at::get_num_threads();
    MemoryProbe probe;
    probe.what = "training X";
    probe.build = [&, r](const RunContext&, int64_t batch) {
      inside[static_cast<size_t>(r)] = at::get_num_threads();
      return std::function<void()>([batch] {  // 4 MiB per sample: a few small steps before the line is drawn
        const std::vector<char> held(static_cast<size_t>(batch) << 22, 1);
        g_sink = static_cast<char>(g_sink + held[held.size() / 2]);
      });
    };
    MemoryPlan plan;
    plan.batch = int64_t{1} << 40, plan.sharing = 2, plan.setting = "data.batch_size";
    errors[static_cast<size_t>(r)] = test::user_error_of(
        [&] { preflight_memory(probe, ctx, plan, [&sum](const std::vector<double>& v) { return sum(v); }); });
    after[static_cast<size_t>(r)] = at::get_num_threads();
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join(), t1.join();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(inside[0], std::min(2 * before[0], std::max(cores, before[0])));
  EXPECT_EQ(inside[1], -1);  // rank 1 built no step
  EXPECT_EQ(after[0], before[0]);
  EXPECT_NE(errors[0].find("needs about"), std::string::npos) << errors[0];
  const std::string estimate = errors[0].substr(0, errors[0].find(" per sample)"));
  EXPECT_EQ(errors[1].substr(0, errors[1].find(" per sample)")), estimate);  // the one measurement on both ranks
}

}  // namespace
}  // namespace moh
