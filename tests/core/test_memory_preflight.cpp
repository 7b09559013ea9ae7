// The memory check's measurement (core/platform/memory_preflight.h) with a step whose need is known: it touches `batch`
// blocks of kBlock bytes, so the measured line must have that slope, and the batches it measures follow the rule
// (doubling while a step is short, half the first batch when the first step is already slow).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/platform/memory_preflight.h"
#include "core/platform/run_context.h"
#include "core/tensor_count.h"
#include "tests/test_util.h"

namespace moh {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr size_t kBlock = 48 << 20;
volatile char g_sink = 0;  // read from every block: the writes cannot be left out

// build(batch) for measure_memory_need: a step whose tensors hold batch × `block` bytes, every page written when
// `touch` (else allocated only: counted, but not resident), then frees them; `built` records the batches in the order
// they were built.
std::function<std::function<void()>(int64_t)> touching(std::vector<int64_t>& built, bool touch = true,
                                                       size_t block = kBlock) {
  return [&built, touch, block](int64_t batch) {
    built.push_back(batch);
    return [batch, touch, block] {
      std::vector<at::Tensor> blocks;
      for (int64_t i = 0; i < batch; ++i) {
        blocks.push_back(at::empty({static_cast<int64_t>(block)}, at::kByte));
        if (!touch) continue;
        std::memset(blocks.back().data_ptr(), static_cast<int>(i + 1), block);
        g_sink = static_cast<char>(g_sink + static_cast<const char*>(blocks.back().data_ptr())[block / 2]);
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

// Burns `seconds` of CPU time per intra-op thread (the check's clock): a step slowed by a loaded machine.
void burn_cpu(double seconds) {
  const std::clock_t start = std::clock();
  const double per_thread = static_cast<double>(CLOCKS_PER_SEC) * std::max(1, at::get_num_threads());
  while (static_cast<double>(std::clock() - start) / per_thread < seconds) g_sink = static_cast<char>(g_sink + 1);
}

// A first step slowed by one-time set-up (its CPU time per intra-op thread, as the check counts it, above the limit)
// is measured again once half its batch proves fast, and then doubled as a short step.
TEST(MemoryCheck, AFirstStepSlowedBySetUpIsMeasuredAgainAndDoubled) {
  std::vector<int64_t> built;
  const auto touch = touching(built);
  bool first = true;
  auto build = [&](int64_t batch) {
    std::function<void()> step = touch(batch);
    return std::function<void()>([step, &first] {
      if (std::exchange(first, false)) burn_cpu(0.8);
      step();
    });
  };
  const MemoryNeed need = measure_memory_need(build, 2, 8, c10::Device(c10::kCPU), /*step_seconds=*/1.2);
  EXPECT_EQ(built, (std::vector<int64_t>{2, 1, 2, 4, 8}));
  expect_slope_of_one_block(need);
}

// build(batch) for a step of `touching` whose first call also allocates `blocks` blocks of state that later calls
// find in place (an optimizer's moments), before its activations or after they are freed, and burns `slow(batch)`
// seconds of CPU.
std::function<std::function<void()>(int64_t)> with_state(std::vector<int64_t>& built, int64_t blocks, bool before,
                                                         const std::function<double(int64_t)>& slow,
                                                         size_t block = kBlock) {
  return [touch = touching(built, true, block), blocks, before, slow, block](int64_t batch) {
    auto state = std::make_shared<at::Tensor>();
    std::function<void()> step = touch(batch);
    return std::function<void()>([step, state, batch, blocks, before, slow, block] {
      if (!before) step();
      if (!state->defined()) {
        *state = at::ones({blocks * static_cast<int64_t>(block)}, at::kByte);
        burn_cpu(slow(batch));
      }
      if (before) step();
    });
  };
}

// Every batch is measured the same way, whatever its step's time: a step's first call allocates state that later
// calls find in place (here 6 blocks), so a line through a step measured at its second call and one measured at its
// first would rise by that state too. Here the first call at batch 8 is slowed (as another test's load once slowed a
// CI run's largest probe step), which used to end the measurement at that first call: a slope of 2.5 blocks per
// sample (a run that fits, refused: 2 × 16.4 GiB estimated for a 16-px latent DiT beside ctest's other tests).
TEST(MemoryCheck, EveryBatchIsMeasuredAtTheSameCallOfItsStep) {
  std::vector<int64_t> built;
  const auto build = with_state(built, 6, /*before=*/true, [](int64_t batch) { return batch == 8 ? 0.8 : 0.0; });
  const MemoryNeed need = measure_memory_need(build, 2, 8, c10::Device(c10::kCPU), /*step_seconds=*/1.2);
  EXPECT_EQ(built, (std::vector<int64_t>{2, 4, 8}));
  expect_slope_of_one_block(need);
}

// A small model's step slowed at every first call (by the process's set-up, or a loaded machine): its first calls'
// peaks are its optimizer phase (here 8 blocks of state allocated after the activations are freed), the same at one
// sample and at two, so their line was flat (one CI run's demo classifier: estimated at 0.58 of its peak). Both are
// measured again at their second calls, whose line has the activations' slope, and doubled from there.
TEST(MemoryCheck, FirstCallsDominatedByTheOptimizerPhaseAreMeasuredAgain) {
  std::vector<int64_t> built;
  const auto build = with_state(built, 8, /*before=*/false, [](int64_t) { return 0.7; });
  const MemoryNeed need = measure_memory_need(build, 2, 4, c10::Device(c10::kCPU), /*step_seconds=*/1.2);
  EXPECT_EQ(built, (std::vector<int64_t>{2, 1, 1, 2, 4}));
  expect_slope_of_one_block(need);
}

// A small model's step slowed at every call by a loaded machine: its first calls' peaks are its optimizer phase, so
// it is measured at its second calls, and its tensors being small it is doubled up to the run's batch whatever its
// time. One CI run's demo classifier stopped at one and two samples (1.1 and 1.3 s per step beside ctest's other
// tests), whose tensors' scatter of a few MiB, multiplied by the run's batch, estimated it at 1.54 times its peak.
TEST(MemoryCheck, ASmallStepSlowedByALoadedMachineIsStillDoubled) {
  std::vector<int64_t> built;
  constexpr size_t kSmall = 1 << 20;
  const auto step_of = with_state(
      built, 8, /*before=*/false, [](int64_t) { return 0.0; }, kSmall);
  auto build = [&step_of](int64_t batch) {
    std::function<void()> step = step_of(batch);
    return std::function<void()>([step] {
      burn_cpu(0.15);
      step();
    });
  };
  const MemoryNeed need = measure_memory_need(build, 2, 16, c10::Device(c10::kCPU), /*step_seconds=*/0.2);
  EXPECT_EQ(built, (std::vector<int64_t>{2, 1, 1, 2, 4, 8, 16}));
  EXPECT_EQ(need.per_sample, static_cast<double>(kSmall));
}

// The line's slope is the growth of the step's own tensors, not of the resident set, which rises only by what the
// heap could not absorb: here the tensors are never written, so the resident set hardly moves.
TEST(MemoryCheck, TheSlopeIsTheGrowthOfTheStepsTensors) {
  std::vector<int64_t> built;
  const MemoryNeed need =
      measure_memory_need(touching(built, /*touch=*/false), 4, 64, c10::Device(c10::kCPU), /*step_seconds=*/0);
  EXPECT_EQ(built, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(need.per_sample, static_cast<double>(kBlock));
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

// Page faults of this thread while it fills a freshly allocated 8 MiB block: the second of two allocations in a row,
// the first freed, so the count says whether its pages came back from the allocator or fresh from the system.
long faults_of_second_block() {
  constexpr size_t kBytes = size_t{8} << 20;
  auto fill = [](size_t bytes) {
    auto* p = static_cast<char*>(std::malloc(bytes));
    std::memset(p, 1, bytes);
    asm volatile("" : : "r"(p) : "memory");  // the writes stay
    std::free(p);
  };
  fill(kBytes);
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  fill(kBytes);
  getrusage(RUSAGE_THREAD, &after);
  return after.ru_minflt - before.ru_minflt;
}

// Every command computes with freed memory kept (a training step's activations are not faulted in afresh each step);
// under glibc's initial settings the same block comes back as fresh pages. Exit code 0 when so (both counts on
// stderr).
int kept_block_comes_back_without_faults() {
  mallopt(M_MMAP_THRESHOLD, 128 << 10);  // glibc's initial thresholds
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
  malloc_trim(0);
  const long fresh = faults_of_second_block();
  keep_freed_heap();
  const long kept = faults_of_second_block();
  std::fprintf(stderr, "page faults: fresh %ld, kept %ld\n", fresh, kept);
  // At least one fault per page (per huge page where the kernel backs the block with them) when fresh.
  return fresh >= 1 && kept * 8 <= fresh ? 0 : 1;
}

// In a fresh copy of this test binary (gtest's "threadsafe" death-test style re-executes it): free memory that
// another test left in the heap would serve both blocks without a fault.
TEST(MemoryCheckDeathTest, KeepFreedHeapHandsFreedMemoryBackWithoutPageFaults) {
#ifndef __GLIBC__
  GTEST_SKIP() << "glibc's malloc only";
#else
  if (malloc_tuned_by_user()) GTEST_SKIP() << "malloc tuned through the environment: keep_freed_heap leaves it alone";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(kept_block_comes_back_without_faults()), ::testing::ExitedWithCode(0), "page faults");
#endif
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

// A step whose tensors hold `mib_per_sample` MiB per sample, every page written.
std::function<std::function<void()>(const RunContext&, int64_t)> holding(int64_t mib_per_sample) {
  return [mib_per_sample](const RunContext&, int64_t batch) {
    return std::function<void()>([batch, mib_per_sample] {
      const at::Tensor held = at::ones({batch, mib_per_sample << 20}, at::kByte);
      g_sink = static_cast<char>(g_sink + held[batch / 2][0].item<uint8_t>());
    });
  };
}

// On a CPU the evaluation forward's tensors come on top of the training step's whole peak (the heap keeps the step's
// freed pages), not only on top of its fixed part: with them, the estimate grows by the evaluation's tensors (2 MiB ×
// 64 images, counted) over the training step's own estimate, where the fixed part alone (0.5 GiB of training
// activations) would hide them.
TEST(MemoryCheck, OnACpuTheEvaluationComesOnTopOfTheTrainingStepsPeak) {
  RunContext ctx;
  MemoryProbe probe;
  probe.what = "training X";
  probe.build = holding(64);
  MemoryPlan plan;
  plan.batch = 8, plan.setting = "data.batch_size";
  const double train = preflight_memory(probe, ctx, plan).estimate;
  probe.build_eval = holding(2);
  probe.eval_batch = 64, probe.eval_setting = "data.eval_batch_size";
  const double with_eval = preflight_memory(probe, ctx, plan).estimate;
  // The resident set moves by a few MiB between measurements (the allocator's and the test's own memory).
  EXPECT_NEAR((with_eval - train) / kMiB, 128.0, 24.0);
}

// The counted peak is of the tensors allocated while the work runs (not those alive before), LibTorch's CPU
// allocator is its own again after, and a tensor kept beyond the count is freed through it safely later.
TEST(TensorCount, ThePeakIsOfTheTensorsAllocatedWhileTheWorkRuns) {
  const at::Tensor before = at::zeros({1 << 20}, at::kByte);
  c10::Allocator* const allocator = c10::GetCPUAllocator();
  at::Tensor kept;
  const std::optional<double> peak = cpu_tensor_peak_during([&kept] {
    {
      const at::Tensor a = at::empty({3 << 20}, at::kByte), b = at::empty({2 << 20}, at::kByte);  // 5 MiB at once
    }
    kept = at::empty({2 << 20}, at::kByte);
    const at::Tensor c = at::empty({1 << 20}, at::kByte);  // 3 MiB at once
  });
  ASSERT_TRUE(peak.has_value());
  EXPECT_EQ(*peak, 5.0 * (1 << 20));
  EXPECT_EQ(c10::GetCPUAllocator(), allocator);
  kept = at::Tensor();
  EXPECT_EQ(cpu_tensor_peak_during([] {}).value_or(-1), 0.0);
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
        const at::Tensor held = at::ones({batch << 22}, at::kByte);
        g_sink = static_cast<char>(g_sink + static_cast<const char*>(held.data_ptr())[held.numel() / 2]);
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
