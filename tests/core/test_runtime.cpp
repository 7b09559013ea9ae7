// Progress bar (plain mode lines, durations), JSONL metrics, and RunContext (torchrun/Slurm environment, errors).
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/progress.h"
#include "core/platform/amp.h"
#include "core/platform/blas_core.h"
#include "core/platform/cpu_precision.h"
#include "core/platform/run_context.h"
#include "core/train/ema.h"
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
    for (int i = 0; i < 4; ++i) p.advance(1, "loss=0.5");
    p.finish();  // the final line, with the last status
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
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"], ++n);
    EXPECT_EQ(j["time"].get<std::string>().size(), 24u) << line;  // 2026-11-23T00:18:18.151Z
    EXPECT_GE(j["elapsed_s"].get<double>(), 0.0);
  }
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

// This process calls the system libstdc++'s std::filesystem, not the copy the pip wheel's libtorch_cpu.so exports
// (CMakeLists.txt, prefer_system_libstdcxx): on the GPU machines that copy crashed every temporary-directory test.
TEST(RunContext, StdFilesystemIsTheSystemOne) {
  EXPECT_EQ(std_filesystem_library().find("libtorch"), std::string::npos) << std_filesystem_library();
}

// The device of each process on simulated nodes (no GPU is needed to check the rule): one GPU per process.
TEST(RunContext, DeviceChoiceOnSimulatedNodes) {
  const auto cuda = [](int i) { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)); };
  EXPECT_EQ(choose_device("auto", 0, 1, 0), c10::Device(c10::kCPU));
  EXPECT_EQ(choose_device("auto", 1, 2, 2), cuda(1));
  EXPECT_EQ(choose_device("auto", 1, 2, 1), c10::Device(c10::kCPU));  // 2 processes, 1 GPU: both on the CPU
  EXPECT_EQ(choose_device("auto", 0, 2, 1), c10::Device(c10::kCPU));
  EXPECT_EQ(choose_device("cuda", 3, 4, 8), cuda(3));
  EXPECT_EQ(choose_device("cuda:1", 0, 1, 2), cuda(1));
  EXPECT_EQ(choose_device("cpu", 5, 8, 8), c10::Device(c10::kCPU));
  for (auto [dev, rank, world, gpus, says] :
       {std::tuple<const char*, int, int, int, const char*>{"cuda", 1, 2, 1, "2 processes on this node but 1 GPU"},
        {"cuda", 0, 2, 1, "each process needs a GPU"},  // rank 0 refuses too: nothing starts
        {"cuda", 0, 1, 0, "CUDA"},                      // a CPU-only LibTorch or no GPU visible
        {"cuda:2", 0, 1, 2, "cuda:0 .. cuda:1"},
        {"cuda:x", 0, 1, 2, "expected auto, cpu, cuda or cuda:N"},
        {"tpu", 0, 1, 1, "expected auto"}}) {
    try {
      choose_device(dev, rank, world, gpus);
      ADD_FAILURE() << dev << " rank " << rank << "/" << world << " with " << gpus << " GPUs was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

TEST(RunContext, DeviceAndPrecisionErrors) {
  EXPECT_THROW(RunContext::create("tpu", Precision::fp32, 0), UserError);
  EXPECT_THROW(RunContext::create("cpu", Precision::fp16, 0), UserError);  // fp16 autocast needs CUDA
  EXPECT_NO_THROW(RunContext::create("cpu", Precision::bf16, 0));          // bf16 autocast runs on CPU
  if (!cuda_available()) {
    EXPECT_THROW(RunContext::create("cuda", Precision::fp32, 0), UserError);
  }
  EXPECT_TRUE(RunContext::create("auto", Precision::fp32, 0).device.is_cpu() || cuda_available());
  EXPECT_FALSE(libtorch_version().empty());
  EXPECT_FALSE(detect_blas().name.empty());
}

// What a result file says about where it was computed: read from the process, so it follows a change of threads.
TEST(RunContext, ProvenanceNamesTheCpuItsThreadsBlasAndBuild) {
  const int before = at::get_num_threads();
  const nlohmann::json p = provenance(c10::Device(c10::kCPU));
  EXPECT_EQ(p.at("device"), "cpu");
  EXPECT_EQ(p.at("device_name"), cpu_model_name());
  EXPECT_EQ(p.at("threads"), before);
  EXPECT_EQ(p.at("libtorch"), libtorch_version());
  EXPECT_EQ(p.at("commit"), toolkit_commit());
  const std::string blas = p.at("blas");
  EXPECT_EQ(blas.rfind(detect_blas().name, 0), 0u) << blas;
  const std::string core = blas_core().used;
  if (!core.empty()) {
    EXPECT_NE(blas.find("(" + core + ")"), std::string::npos) << blas;
  }
  at::set_num_threads(1);
  EXPECT_EQ(provenance(c10::Device(c10::kCPU)).at("threads"), 1);
  EXPECT_EQ(device_line(c10::Device(c10::kCPU)), "cpu (" + cpu_model_name() + ", 1 thread, " + blas + ")");
  at::set_num_threads(before);
}

TEST(Amp, AutocastScopeIsScopedAndFp32IsANoOp) {
  const at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
  {
    AutocastScope scope(RunContext::create("cpu", Precision::bf16, 0));
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  {
    AutocastScope scope(RunContext::create("cpu", Precision::fp32, 0));
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  }
}

// precision: tf32 allows TF32 for CUDA's fp32 products and convolutions (a process setting) while a Tf32Scope lives,
// and puts back what was there; other precisions leave it alone; no autocast, and a CPU computes exact fp32.
TEST(Amp, Tf32ScopeSetsAndRestoresTheProcessSetting) {
  EXPECT_EQ(config::enum_from_string<Precision>("tf32", "train.precision"), Precision::tf32);
  const std::pair<bool, bool> before = Tf32Scope::current();
  at::globalContext().setAllowTF32CuBLAS(false), at::globalContext().setAllowTF32CuDNN(false);
  {
    const Tf32Scope on(Precision::tf32);
    EXPECT_EQ(Tf32Scope::current(), std::make_pair(true, true));
    {
      const Tf32Scope off(false);  // a feature network inside a tf32 run
      EXPECT_EQ(Tf32Scope::current(), std::make_pair(false, false));
    }
    EXPECT_EQ(Tf32Scope::current(), std::make_pair(true, true));
  }
  EXPECT_EQ(Tf32Scope::current(), std::make_pair(false, false));
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const Tf32Scope untouched(p);
    EXPECT_EQ(Tf32Scope::current(), std::make_pair(false, false));
  }
  const RunContext ctx = RunContext::create("cpu", Precision::tf32, 0);
  EXPECT_FALSE(autocasts(ctx.precision));
  EXPECT_EQ(precision_summary(Precision::tf32, ctx), "tf32 (fp32 on a CPU)");
  const at::Tensor a = at::randn({64, 48}), b = at::randn({48, 32});
  const at::Tensor exact = at::matmul(a, b);
  {
    const Tf32Scope on(Precision::tf32);
    const AutocastScope no_autocast(ctx);
    const at::Tensor c = at::matmul(a, b);
    EXPECT_EQ(c.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(c, exact));
  }
  at::globalContext().setAllowTF32CuBLAS(before.first), at::globalContext().setAllowTF32CuDNN(before.second);
}

TEST(Amp, GradScalerUnscalesSkipsAndGrows) {
  at::Tensor p = at::zeros({3}).set_requires_grad(true);
  GradScaler off(Precision::bf16);
  EXPECT_EQ(off.scale(at::ones({})).item<float>(), 1.0f);
  GradScaler scaler(Precision::fp16);
  EXPECT_EQ(scaler.current_scale(), 65536.0);
  (scaler.scale(p.sum() * 2)).backward();
  EXPECT_TRUE(scaler.unscale_and_update({p}));
  EXPECT_TRUE(at::allclose(p.grad(), at::full({3}, 2.0f)));
  p.mutable_grad().fill_(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(scaler.unscale_and_update({p}));  // inf: skip the step, halve the scale
  EXPECT_EQ(scaler.current_scale(), 32768.0);
  GradScaler restored(Precision::fp16);
  restored.load_state(scaler.state());
  EXPECT_EQ(restored.current_scale(), 32768.0);
}

TEST(Ema, UpdateAndWarmup) {
  torch::nn::Linear model(2, 2), ema(2, 2);
  ema_update(*ema, *model, 0.0);  // a copy
  EXPECT_TRUE(at::equal(ema->weight, model->weight));
  const at::Tensor before = ema->weight.clone();
  {
    torch::NoGradGuard ng;
    model->weight.add_(1.0);
  }
  ema_update(*ema, *model, 0.75);
  EXPECT_TRUE(at::allclose(ema->weight, before + 0.25));
  EXPECT_DOUBLE_EQ(ema_decay_at(0.999, true, 0), 0.1);
  EXPECT_DOUBLE_EQ(ema_decay_at(0.999, false, 0), 0.999);
  EXPECT_DOUBLE_EQ(ema_decay_at(0.5, true, 1000), 0.5);
}

// The OpenBLAS core moh switches to, by the CPU flags of real machines (/proc/cpuinfo of this project's machine
// kinds and of older CPUs): only upward from a known, lower core; never for an unknown name.
TEST(BlasCore, BestCoreForTheCpuAndWhenToSwitch) {
  const std::set<std::string> avx2{"sse4_2", "avx", "avx2", "fma"};
  std::set<std::string> skx = avx2, spr = avx2;
  for (const char* f : {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}) skx.insert(f), spr.insert(f);
  spr.insert("avx512_bf16"), spr.insert("amx_bf16");  // Sapphire Rapids; the AMD EPYC days of this machine alike
  EXPECT_EQ(best_openblas_core(spr), "Cooperlake");
  EXPECT_EQ(best_openblas_core(skx), "SkylakeX");
  EXPECT_EQ(best_openblas_core(avx2), "Haswell");
  EXPECT_EQ(best_openblas_core({"sse4_2", "avx"}), "SandyBridge");
  EXPECT_EQ(best_openblas_core({"sse4_2"}), "");
  std::set<std::string> partial = skx;
  partial.erase("avx512vl");  // an incomplete AVX-512 set is not enough for the SkylakeX kernels
  EXPECT_EQ(best_openblas_core(partial), "Haswell");
  EXPECT_EQ(openblas_core_upgrade("Prescott", spr), "Cooperlake");  // Debian's OpenBLAS on Sapphire Rapids
  EXPECT_EQ(openblas_core_upgrade("Haswell", skx), "SkylakeX");
  EXPECT_EQ(openblas_core_upgrade("Cooperlake", spr), "");  // already the best
  EXPECT_EQ(openblas_core_upgrade("SkylakeX", avx2), "");   // never downward
  EXPECT_EQ(openblas_core_upgrade("Zen", avx2), "");
  EXPECT_EQ(openblas_core_upgrade("Sandybridge", avx2), "Haswell");  // OpenBLAS's own spelling
  EXPECT_EQ(openblas_core_upgrade("ThunderX2T99", spr), "");         // not a core this table knows
  EXPECT_EQ(openblas_core_level("SAPPHIRERAPIDS"), 5);
}

// The self-check of a core: the products through LibTorch agree with the plain loop.
TEST(BlasCore, SelfCheckPassesOnTheBlasInUse) {
  EXPECT_EQ(check_blas_products(), "");
}

// `precision: auto` decides within its budget whatever the model (core/platform/cpu_precision.h): a probe whose steps
// are quick is timed at the run's batch in a warm-up and fifteen interleaved rounds; one whose steps at the run's batch
// would be too slow at a smaller batch; one whose warm-up steps alone take longer than a small model's ever do is timed
// once and the fixed transformer block decides instead; one whose first step of a single image is already that slow is
// not run at a larger batch at all. Counted calls by batch, not wall times.
TEST(CpuPrecision, TheProbeIsTimedWithinTheBudgetOrTheBlockDecides) {
  using std::chrono::milliseconds;
  struct Calls {
    std::map<int64_t, int> fp32, bf16;  // by batch
  };
  // A probe of the run's batch 64 whose step sleeps `one_image` at batch 1, `per_image` per image above it.
  const auto counting_probe = [](Calls& calls, milliseconds one_image, double per_image) {
    PrecisionProbe p;
    p.name = "test probe";
    p.batch = 64;
    p.build = [&calls, one_image, per_image](Precision precision, int64_t batch) {
      return std::function<void()>([&calls, one_image, per_image, precision, batch] {
        ++(precision == Precision::fp32 ? calls.fp32 : calls.bf16)[batch];
        std::this_thread::sleep_for(batch == 1 ? one_image : milliseconds(std::lround(per_image * batch)));
      });
    };
    return p;
  };
  Calls quick, mid, slow, slow_one;
  const PrecisionProbe fast = counting_probe(quick, milliseconds(2), 0.1);
  const auto [f32, b16] = measure_cpu_precision(&fast);
  const std::map<int64_t, int> first_look_then_64 = {{1, 1}, {8, 1}, {64, 16}};
  EXPECT_EQ(quick.fp32, first_look_then_64);  // one warm-up step and fifteen rounds at the run's batch
  EXPECT_EQ(quick.bf16, (std::map<int64_t, int>{{64, 16}}));
  EXPECT_GE(f32, 6.0);
  EXPECT_GE(b16, 6.0);
  // 400 ms at 8 images: the warm-ups at 16 should take 1.6 s, at 32 3.2 s, so 16 is timed, in three rounds.
  const PrecisionProbe middle = counting_probe(mid, milliseconds(2), 50);
  measure_cpu_precision(&middle);
  EXPECT_EQ(mid.fp32, (std::map<int64_t, int>{{1, 1}, {8, 1}, {16, 4}}));
  EXPECT_EQ(mid.bf16, (std::map<int64_t, int>{{16, 4}}));
  const PrecisionProbe large = counting_probe(slow, milliseconds(2), 200);  // 1.6 s at 8
  const auto [block_f32, block_b16] = measure_cpu_precision(&large);
  EXPECT_EQ(slow.fp32, (std::map<int64_t, int>{{1, 1}, {8, 1}}));  // too large: the block's steps were timed instead
  EXPECT_EQ(slow.bf16[8], 1);
  EXPECT_GT(block_f32, 0.0);
  EXPECT_GT(block_b16, 0.0);
  const PrecisionProbe slow_image = counting_probe(slow_one, milliseconds(1600), 0.1);
  measure_cpu_precision(&slow_image);
  EXPECT_EQ(slow_one.fp32, (std::map<int64_t, int>{{1, 1}}));  // one image already past half the limit
  EXPECT_TRUE(slow_one.bf16.empty());
}

}  // namespace
}  // namespace moh
