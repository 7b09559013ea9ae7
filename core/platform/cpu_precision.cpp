#include "core/platform/cpu_precision.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/io/atomic_io.h"
#include "core/io/sha256.h"
#include "core/platform/amp.h"
#include "core/platform/blas_core.h"
#include "core/platform/run_context.h"

namespace moh {

namespace fs = std::filesystem;

// The calibration's time budget: the decision comes within about 10 s for any model. The probe's steps are timed at
// the largest batch up to the run's whose fp32 and bf16 warm-up steps should fit kProbeLargeMs (from a step at
// kFirstBatch, time taken as linear in the batch): bf16's gain is in the products, which a small batch hides (the
// demo's DiT on an AVX-512 BF16 CPU: 1.0x fp32's time at 8 images, 0.7-0.8x at its 64). Warm-up steps beyond
// kProbeLargeMs mean a model too large to time in the budget: the fixed block decides for it (its steps are
// product-bound as such a model's are); a first step of one image beyond half of it says so before any larger batch
// runs (a 224-px classifier's takes seconds per image on one thread). The first three timed rounds stop when the next
// would pass kBudgetMs; more, up to kMaxRounds, while they fit kSteadyMs: one round's ratio of a small model's steps
// scatters by ±20 % on a 2-core VM, so three rounds' median could decide either way (docs/BENCHMARKS.md).
constexpr double kProbeLargeMs = 3000;
constexpr double kBudgetMs = 8000;
constexpr double kSteadyMs = 2000;
constexpr int kMaxRounds = 15;
constexpr int64_t kFirstBatch = 8;

Precision precision_from_timing(double fp32_ms, double bf16_ms) {
  return bf16_ms > 0 && fp32_ms > 0 && bf16_ms < 0.9 * fp32_ms ? Precision::bf16 : Precision::fp32;
}

namespace {

// The calibration's network: one DiT-style transformer block (adaLN-modulated LayerNorm, attention of 6 heads,
// gated residuals, GELU MLP of 4x width) on 8 sequences of 256 tokens of width 384 (a DiT-S/2 batch of 8), forward
// and backward. Elementwise work and attention count as well as the products: bf16 autocast casts around them.
struct Block {
  at::Tensor x, mod, wqkv, wproj, w1, w2;
};

Block make_block() {
  at::Generator g = at::detail::createCPUGenerator(7);
  auto param = [&](std::initializer_list<int64_t> shape) {
    return (at::randn(shape, g) * 0.05).set_requires_grad(true);
  };
  return {at::randn({8, 256, 384}, g), param({8, 6, 384}), param({1152, 384}),
          param({384, 384}),           param({1536, 384}), param({384, 1536})};
}

void block_step(bool bf16, const Block& b) {
  AutocastState s = AutocastState::current();
  s.cpu = bf16, s.cpu_dtype = at::kBFloat16;
  {
    AutocastRestore autocast(s);
    const auto m = b.mod.unbind(1);  // shift, scale, gate for attention, then for the MLP; each (8, 384)
    auto modulate = [&](const at::Tensor& x, int i) {
      return at::layer_norm(x, {384}) * (1 + m[i + 1].unsqueeze(1)) + m[i].unsqueeze(1);
    };
    const auto qkv = at::linear(modulate(b.x, 0), b.wqkv).view({8, 256, 3, 6, 64}).permute({2, 0, 3, 1, 4});
    const at::Tensor att = at::softmax(at::matmul(qkv[0], qkv[1].transpose(-2, -1)) * 0.125, -1);
    const at::Tensor o = at::linear(at::matmul(att, qkv[2]).transpose(1, 2).reshape({8, 256, 384}), b.wproj);
    const at::Tensor h = b.x + m[2].unsqueeze(1) * o;
    const at::Tensor out = h + m[5].unsqueeze(1) * at::linear(at::gelu(at::linear(modulate(h, 3), b.w1)), b.w2);
    out.to(at::kFloat).pow(2).mean().backward();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string cache_path() {
  if (const char* p = std::getenv("MOH_CPU_PRECISION_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/moh/cpu_precision.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/moh/cpu_precision.json";
  return "";
}

// What the verdict depends on: the CPU, the library code and the threads the products run on.
std::string machine_key() {
  std::string flags;
  for (const auto& f : cpu_flags()) flags += f + " ";
  const BlasCore core = blas_core();
  return sha256_hex(cpu_model_name() + "|" + flags + "|" + libtorch_version() + "|" + detect_blas().name + "|" +
                    core.used + "|" + std::to_string(at::get_num_threads()));
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// The cached verdict for this machine, measuring (under the lock) when there is none.
CpuPrecision cached_or_measured(const PrecisionProbe* probe, const std::string& workload) {
  CpuPrecision r;
  const std::string path = cache_path(), key = sha256_hex(machine_key() + "|" + workload);
  int fd = -1;
  std::error_code ec;
  if (!path.empty() && (fs::create_directories(fs::path(path).parent_path(), ec), true))
    fd = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (fd >= 0) ::flock(fd, LOCK_EX);  // ranks starting together: one measures, the others wait for its verdict
  if (fd < 0 && launched_world().value_or(1) > 1) {  // ranks measuring apart could disagree: take the safe one
    r.how = "no writable cache for the ranks to agree on a measurement (" + path + ")";
    return r;
  }
  nlohmann::json cache = nlohmann::json::object();
  if (fd >= 0 && fs::exists(path)) {
    try {
      cache = nlohmann::json::parse(read_file(path, "precision cache"));
    } catch (const std::exception&) {
      cache = nlohmann::json::object();  // a damaged cache is measured again
    }
  }
  if (cache.is_object() && cache.contains(key) && cache[key].contains("fp32_ms")) {
    r.fp32_ms = cache[key]["fp32_ms"].get<double>(), r.bf16_ms = cache[key]["bf16_ms"].get<double>();
    r.how = "measured " + cache[key].value("date", std::string("?")) + ", cached in " + path;
  } else {
    std::tie(r.fp32_ms, r.bf16_ms) = measure_cpu_precision(probe);
    r.how = "measured now";
    if (fd >= 0) {
      cache[key] = {{"workload", workload},
                    {"fp32_ms", r.fp32_ms},
                    {"bf16_ms", r.bf16_ms},
                    {"date", today()},
                    {"cpu", cpu_model_name()},
                    {"libtorch", libtorch_version()},
                    {"threads", at::get_num_threads()}};
      try {
        write_file_atomic(path, cache.dump(1) + "\n");
        r.how += ", cached in " + path;
      } catch (const std::exception&) {
      }
    }
  }
  if (fd >= 0) ::close(fd);  // releases the lock
  r.precision = precision_from_timing(r.fp32_ms, r.bf16_ms);
  return r;
}

double elapsed_ms(const std::function<void()>& step) {
  const auto start = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The two steps the rounds time, each run once already (warm-up: allocations, kernel dispatch, weight casts), and the
// milliseconds their choice took.
struct TimedSteps {
  std::function<void()> fp32, bf16;
  double spent = 0;
};

// The probe's steps at the largest batch whose warm-ups fit kProbeLargeMs, or the block's for a model too large.
TimedSteps steps_to_time(const PrecisionProbe* probe) {
  TimedSteps s;
  bool large = !probe;
  if (probe) {
    s.spent = probe->batch > 1 ? elapsed_ms(probe->build(Precision::fp32, 1)) : 0;  // the first look
    large = s.spent > kProbeLargeMs / 2;
    const int64_t first = std::min(probe->batch, kFirstBatch);
    int64_t batch = first;
    double warm = 0;
    if (!large) s.fp32 = probe->build(Precision::fp32, first), warm = elapsed_ms(s.fp32);
    auto next = [&] { return std::min(2 * batch, probe->batch); };
    while (!large && batch < probe->batch && 2 * warm * static_cast<double>(next()) / first <= kProbeLargeMs)
      batch = next();
    if (batch > first) s.spent += warm, s.fp32 = probe->build(Precision::fp32, batch), warm = elapsed_ms(s.fp32);
    large = large || warm > kProbeLargeMs;
    if (!large) s.bf16 = probe->build(Precision::bf16, batch), warm += elapsed_ms(s.bf16);
    large = large || warm > kProbeLargeMs;
    s.spent += warm;
  }
  if (large) {
    auto block = std::make_shared<Block>(make_block());
    s.fp32 = [block] { block_step(false, *block); }, s.bf16 = [block] { block_step(true, *block); };
    s.spent += elapsed_ms(s.fp32) + elapsed_ms(s.bf16);
  }
  return s;
}

}  // namespace

std::pair<double, double> measure_cpu_precision(const PrecisionProbe* probe) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  const TimedSteps steps = steps_to_time(probe);
  // Interleaved rounds, each precision first in every other one (the step after the other precision's ran slower).
  std::vector<double> fp32, bf16;
  double spent = steps.spent;
  for (int round = 0; round < kMaxRounds; ++round) {
    const double next = round == 0 ? 0 : fp32.back() + bf16.back();
    if (round > 0 && spent + next > (round < 3 ? kBudgetMs : kSteadyMs)) break;
    if (round % 2 == 0) fp32.push_back(elapsed_ms(steps.fp32)), bf16.push_back(elapsed_ms(steps.bf16));
    if (round % 2 == 1) bf16.push_back(elapsed_ms(steps.bf16)), fp32.push_back(elapsed_ms(steps.fp32));
    spent += fp32.back() + bf16.back();
  }
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  return {median(fp32), median(bf16)};
}

const CpuPrecision& cpu_auto_precision(const PrecisionProbe* probe) {
  static std::mutex mu;
  static std::map<std::string, CpuPrecision> memo;
  const std::string name = probe ? probe->name : "transformer block";
  std::lock_guard<std::mutex> lock(mu);
  auto it = memo.find(name);
  if (it != memo.end()) return it->second;
  CpuPrecision r;
  if (!cpu_has_native_bf16())
    r.how = "no native bf16 on this CPU";
  else
    r = cached_or_measured(probe, name);
  return memo.emplace(name, r).first->second;
}

}  // namespace moh
