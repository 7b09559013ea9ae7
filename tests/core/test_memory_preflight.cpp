// The memory check's measurement (core/memory_preflight.h) with a step whose need is known: it touches `batch`
// blocks of kBlock bytes, so the measured line must have that slope, and the batches it measures follow the rule
// (doubling while a step is short, half the first batch when the first step is already slow).
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/memory_preflight.h"
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

}  // namespace
}  // namespace moh
