// Progress bar (plain mode lines, durations), JSONL metrics, and RunContext (torchrun/Slurm environment, errors).
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/atomic_io.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/run_context.h"
#include "tests/test_util.h"

namespace moh {
namespace {

TEST(Progress, DurationsAndPlainLines) {
  EXPECT_EQ(Progress::format_duration(65), "1:05");
  EXPECT_EQ(Progress::format_duration(3725), "1:02:05");
  EXPECT_EQ(Progress::format_duration(-1), "?");
  testing::internal::CaptureStderr();
  {
    Progress p("train", 4, "img", /*interactive=*/0);
    for (int i = 0; i < 4; ++i) p.advance(1, "loss=0.5");  // the last step always prints
    p.finish("done");
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("train 4/4 (100%)"), std::string::npos) << err;
  EXPECT_NE(err.find("img/s"), std::string::npos) << err;
  EXPECT_NE(err.find("loss=0.5"), std::string::npos) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << "plain mode must not redraw";
}

TEST(Metrics, OneJsonObjectPerLine) {
  test::TempDir d;
  MetricsWriter m(d.file("metrics.jsonl"), /*truncate=*/true);
  m.write({{"step", 1}, {"loss", 0.25}});
  m.write({{"step", 2}, {"loss", 0.125}});
  std::istringstream in(read_file(d.file("metrics.jsonl")));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) EXPECT_EQ(nlohmann::json::parse(line)["step"], ++n);
  EXPECT_EQ(n, 2);
}

struct EnvGuard {
  std::vector<std::string> keys;
  void set(const std::string& k, const std::string& v) {
    keys.push_back(k);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~EnvGuard() {
    for (const auto& k : keys) ::unsetenv(k.c_str());
  }
};

TEST(RunContext, RanksFromTorchrunAndSlurmEnvironment) {
  {
    EnvGuard env;
    env.set("RANK", "1"), env.set("WORLD_SIZE", "4"), env.set("LOCAL_RANK", "1");
    RunContext c = RunContext::create("cpu", Precision::fp32, 7);
    EXPECT_EQ(c.rank, 1);
    EXPECT_EQ(c.world, 4);
    EXPECT_FALSE(c.is_main());
    EXPECT_EQ(c.seed, 7u);
  }
  {
    EnvGuard env;
    env.set("SLURM_PROCID", "2"), env.set("SLURM_NTASKS", "3");
    RunContext c = RunContext::create("auto", Precision::fp32, 0);
    EXPECT_EQ(c.rank, 2);
    EXPECT_EQ(c.world, 3);
  }
  {
    EnvGuard env;
    env.set("RANK", "5"), env.set("WORLD_SIZE", "2");
    EXPECT_THROW(RunContext::create("cpu", Precision::fp32, 0), UserError);
  }
  {
    EnvGuard env;
    env.set("RANK", "x");
    EXPECT_THROW(RunContext::create("cpu", Precision::fp32, 0), UserError);
  }
}

TEST(RunContext, DeviceAndPrecisionErrors) {
  EXPECT_THROW(RunContext::create("tpu", Precision::fp32, 0), UserError);
  EXPECT_THROW(RunContext::create("cpu", Precision::bf16, 0), UserError);  // autocast precisions need CUDA
  if (!cuda_available()) {
    EXPECT_THROW(RunContext::create("cuda", Precision::fp32, 0), UserError);
  }
  EXPECT_TRUE(RunContext::create("auto", Precision::fp32, 0).device.is_cpu() || cuda_available());
  EXPECT_FALSE(libtorch_version().empty());
  EXPECT_FALSE(detect_blas().name.empty());
}

}  // namespace
}  // namespace moh
