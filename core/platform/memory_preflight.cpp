#include "core/platform/memory_preflight.h"
#include "core/environment.h"

#include <ATen/Parallel.h>
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/platform/run_context.h"
#include "core/tensor_count.h"

#ifdef MOH_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace moh {

namespace {

// A "Name:   123 kB" line of /proc/self/status or /proc/meminfo, in bytes (0 if absent).
double proc_kb(const char* file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + ":", 0) == 0) return std::atof(line.c_str() + name.size() + 1) * 1024.0;
  return 0;
}

// The cgroup's memory limit (v2, then v1), or 0 when there is none.
double cgroup_limit() {
  for (const char* f : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(f);
    std::string v;
    if (in >> v && v != "max") {
      const double b = std::atof(v.c_str());
      if (b > 0 && b < 1e18) return b;
    }
  }
  return 0;
}

double cgroup_usage() {
  for (const char* f : {"/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}) {
    std::ifstream in(f);
    double v = 0;
    if (in >> v) return v;
  }
  return 0;
}

}  // namespace

int64_t MemoryNeed::at(int64_t batch) const {
  return static_cast<int64_t>(std::ceil(std::max(fixed + per_sample * static_cast<double>(batch), floor)));
}

int64_t MemoryNeed::largest_batch(double bytes) const {
  if (bytes < floor) return 0;
  if (per_sample <= 0) return bytes >= fixed ? INT64_MAX : 0;
  return std::max<int64_t>(0, static_cast<int64_t>(std::floor((bytes - fixed) / per_sample)));
}

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", bytes / kGiB);
  return s;
}

MemoryAvailable memory_available(const c10::Device& device, int sharing) {
  const double share = std::max(1, sharing);
#ifdef MOH_TORCH_CUDA
  if (device.is_cuda()) {
    size_t free = 0, total = 0;  // of the current device: the run's (RunContext::create made it current)
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
      const double held = static_cast<double>(stats.reserved_bytes[0].current);
      return {(static_cast<double>(free) + held * share) / share, "GPU " + device.str()};
    }
  }
#endif
  (void)device;
  const double rss = proc_kb("/proc/self/status", "VmRSS");
  double free = proc_kb("/proc/meminfo", "MemAvailable");
  if (const double limit = cgroup_limit(); limit > 0) free = std::min(free, limit - cgroup_usage());
  return {(free + rss * share) / share, "this machine"};
}

bool malloc_tuned_by_user() {
  for (const char* v : {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(v)) return true;
  return false;
}

void keep_freed_heap() {
#ifdef __GLIBC__
  if (malloc_tuned_by_user()) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest (HEAP_MAX / 2); setting it ends glibc's own adjustment
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  mallopt(M_TOP_PAD, 64 << 20);  // a heap grows 64 MiB at a time (pages count only once touched)
#endif
}

double peak_memory_so_far(const c10::Device& device) {
#ifdef MOH_TORCH_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    return static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(index).reserved_bytes[0].peak);
  }
#endif
  (void)device;
  return std::max(proc_kb("/proc/self/status", "VmHWM"), proc_kb("/proc/self/status", "VmRSS"));
}

double peak_memory_during(const std::function<void()>& run, const c10::Device& device) {
#ifdef MOH_TORCH_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    c10::cuda::CUDACachingAllocator::resetPeakStats(index);
    run();
    return peak_memory_so_far(device);
  }
#endif
  (void)device;
  // Freed heap memory goes back to the system first: kept by the allocator, it would be reused by `run` without
  // raising the resident set, and the measured peak would miss what `run` needs on its own. Writing 5 to clear_refs
  // then resets the high-water mark to the current resident set (Linux >= 4.0).
  ::malloc_trim(0);
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
  run();
  return peak_memory_so_far(device);
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
// At most b1·2^5: a cheap step's check stays short however large the run's batch.
constexpr size_t kMaxProbePoints = 6;
constexpr int64_t kReach = int64_t{1} << (kMaxProbePoints - 1);

// How a step is measured: at its first call only (a step too slow to run twice), or at its second. Every batch of one
// check is measured the same way: the first call allocates state that later calls find in place (an optimizer's
// moments), and a line through one batch measured at its first call and another at its second would rise by it.
enum class Calls { decide, first, second };

// One measured step: its peak memory (bytes) and its seconds, the step built first (model, optimizer, inputs).
struct ProbePoint {
  int64_t batch = 0;
  double peak = 0, seconds = 0;
  double tensors = -1;  // the peak of the step's own CPU tensors (core/tensor_count.h); -1: not counted
  Calls calls{};        // the call measured
};

// A step's peak memory and, where counted, the peak of its own tensors.
struct Peaks {
  double memory = 0, tensors = -1;
};
using ReadPeaks = std::function<Peaks(const std::function<void()>& run)>;

// On a CPU, the seconds this process's threads have computed, divided by its intra-op threads: a step's time as on a
// machine with nothing else running, so that the check measures the same batches whatever else loads the machine.
// On a GPU, wall time (the host mostly waits).
double step_clock(const c10::Device& device) {
  if (!device.is_cpu())
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec)) / std::max(1, at::get_num_threads());
}

ProbePoint probe_point(const std::function<std::function<void()>(int64_t)>& build, int64_t batch,
                       const c10::Device& device, double step_seconds, const ReadPeaks& read, Calls calls) {
  const std::function<void()> step = build(batch);
  double start = step_clock(device);
  Peaks peaks = read(step);
  const ProbePoint first{batch, peaks.memory, step_clock(device) - start, peaks.tensors, Calls::first};
  if (calls == Calls::first || (calls == Calls::decide && first.seconds > step_seconds / 2)) return first;
  // A short step is measured again: the first allocates what every later step finds in place (the optimizer's
  // state, the thread pools' and the BLAS's buffers), which at a few samples outweighs the activations; a run's peak
  // is its activations on top of all that.
  start = step_clock(device);
  peaks = read(step);
  return {batch, peaks.memory, step_clock(device) - start, peaks.tensors, Calls::second};
}

// The line through two points, its slope the growth of the step's own tensors where they were counted: over a few
// samples the resident set rises only by what the heap's free space could not absorb (MoH-ViT-Nano at 224 px: 186 MiB
// per image between 1 and 2 images, where its tensors grew by 389 and the run's peak by 420 per image between 8 and
// 16, docs/BENCHMARKS.md).
MemoryNeed line_through(const ProbePoint& small, const ProbePoint& large) {
  if (large.batch <= small.batch) return {large.peak, 0};
  const bool counted = small.tensors >= 0 && large.tensors >= 0;
  const double rise = counted ? large.tensors - small.tensors : large.peak - small.peak;
  const double slope = std::max(0.0, rise / static_cast<double>(large.batch - small.batch));
  return {large.peak - slope * static_cast<double>(large.batch), slope};
}

bool memory_check_verbose() {
  return env_word("MOH_MEMORY_CHECK").value_or("1") == "verbose";
}

// Whether a line through two steps measured at their first calls shows the activations: a first call's peak is the
// larger of its activations and its optimizer phase, which allocates the optimizer's state (2 × the parameters for
// AdamW); while that phase dominates, the peaks hardly rise with the batch whatever the activations do (MoH-ViT-Nano
// at 28 px: 30 MiB of tensors at one image and at two, where its second calls rise by 2.3 MiB per image). The
// activations show when the rise is at least a quarter of the larger peak (MoH-ViT-Nano at 224 px: 466 → 855 MiB).
bool activations_show(const ProbePoint& small, const ProbePoint& large) {
  const bool counted = small.tensors >= 0 && large.tensors >= 0;
  const double lo = counted ? small.tensors : small.peak, hi = counted ? large.tensors : large.peak;
  return 4 * (hi - lo) >= hi;
}

using ProbeAt = std::function<ProbePoint(int64_t batch, Calls calls)>;

// A step whose own tensors (at its second call) stay within this is doubled whatever its time: its time is then the
// machine's load rather than its work (the demo classifier's 50-ms step at one sample took 1.1 s beside ctest's other
// tests, its two threads waiting on each other's cores), and a line through one and two samples multiplies the scatter
// of their peaks (8 and 14-18 MiB there) by the run's batch: estimated at 1.54 times its peak.
constexpr double kCheapStepTensors = 64 * kMiB;

bool cheap_to_double(const ProbePoint& p) {
  return p.calls == Calls::second && p.tensors >= 0 && p.tensors <= kCheapStepTensors;
}

// The first points: b1, or, when its step is already too slow to double (a large image, a large model), half its
// batch and b1, so that the refusal of a run far too large comes in 1.5 such steps rather than 3. At such sizes the
// activations outweigh the optimizer phase even at one or two samples; where they do not (a small model's step slowed
// by the process's set-up or by a loaded machine), both are measured again at their second calls.
std::vector<ProbePoint> first_points(const ProbeAt& at, int64_t b1, int64_t b2, double step_seconds) {
  std::vector<ProbePoint> points{at(b1, Calls::decide)};
  if (b1 <= 1 || b2 <= b1 || 2 * points[0].seconds <= step_seconds) return points;
  ProbePoint half = at(b1 / 2, points[0].calls);
  // The process's first step also pays one-time set-up (LibTorch 2.x: 2.2 s at batch 2 for a 60-ms step): when
  // half the batch is fast, b1 is measured again and, fast too, doubled as any short step.
  if (4 * half.seconds <= step_seconds) points[0] = at(b1, Calls::decide);
  if (2 * points[0].seconds <= step_seconds) return points;
  if (half.calls != points[0].calls) half = at(b1 / 2, points[0].calls);
  if (points[0].calls == Calls::first && !activations_show(half, points[0]))
    return {at(b1 / 2, Calls::second), at(b1, Calls::second)};
  return {half, points[0]};
}

void print_points(const std::vector<ProbePoint>& points) {
  std::string line = "memory check:";
  for (const ProbePoint& p : points)
    line += " batch " + std::to_string(p.batch) + " " + std::to_string(static_cast<int64_t>(p.peak / kMiB)) + " MiB (" +
            (p.tensors >= 0 ? "tensors " + std::to_string(static_cast<int64_t>(p.tensors / kMiB)) + " MiB, " : "") +
            std::to_string(static_cast<int64_t>(p.seconds * 1000)) + " ms, call " +
            (p.calls == Calls::first ? "1" : "2") + ")";
  std::cerr << line << "\n";
}

}  // namespace

MemoryNeed measure_memory_need(const std::function<std::function<void()>(int64_t)>& build, int64_t b1, int64_t b2,
                               const c10::Device& device, double step_seconds, const PeakOf& peak) {
  const ReadPeaks read = [&](const std::function<void()>& run) {
    if (peak) return Peaks{peak(run), -1};
    if (!device.is_cpu()) return Peaks{peak_memory_during(run, device), -1};
    std::optional<double> tensors;
    const double memory = peak_memory_during([&] { tensors = cpu_tensor_peak_during(run); }, device);
    return Peaks{memory, tensors.value_or(-1)};
  };
  // The batch doubles from b1 while the next step should stay within step_seconds (twice the last one's time) or the
  // step is cheap (cheap_to_double), up to b2, and the two largest batches give the line: at a few samples a step's
  // peak is its optimizer phase (gradients, the AdamW state, the EMA), which does not grow with the batch, and what the
  // heap already holds absorbs small activations, so a line through small batches is too flat (docs/BENCHMARKS.md).
  const ProbeAt at = [&](int64_t batch, Calls calls) {
    return probe_point(build, batch, device, step_seconds, read, calls);
  };
  std::vector<ProbePoint> points = first_points(at, b1, b2, step_seconds);
  while (points.back().batch < b2 && points.size() < kMaxProbePoints &&
         (points.size() < 2 || 2 * points.back().seconds <= step_seconds || cheap_to_double(points.back())))
    points.push_back(at(std::min(2 * points.back().batch, b2), points[0].calls));
  if (memory_check_verbose()) print_points(points);
  if (points.size() == 1) return {points[0].peak, 0};
  return line_through(points[points.size() - 2], points.back());
}

double check_memory_fits(const MemoryNeed& need, const MemoryPlan& plan, const MemoryAvailable& available) {
  const double estimate = static_cast<double>(need.at(plan.batch));
  if (estimate <= available.bytes) return estimate;
  std::ostringstream why, hint;
  why << plan.what << " needs about " << gib(estimate * plan.sharing) << " on " << available.name;
  if (plan.sharing > 1) why << " (" << plan.sharing << " processes × " << gib(estimate) << ")";
  why << " by one measured step at batch " << plan.batch << " per process (" << gib(need.fixed) << " + "
      << gib(need.per_sample) << " per sample); " << gib(available.bytes * plan.sharing) << " available";
  const int64_t fits = need.largest_batch(available.bytes);
  if (fits > 0)
    hint << "lower " << plan.setting << " to at most " << fits * plan.per_batch;
  else
    hint << "not even one sample fits: " << (plan.other.empty() ? "" : "lower " + plan.other + " or ")
         << "use a machine with more memory";
  if (fits > 0 && !plan.other.empty()) hint << ", or lower " << plan.other;
  throw UserError("memory", why.str(), hint.str() + "; MOH_MEMORY_CHECK=0 skips this check");
}

// The evaluation forward's smallest batch (MemoryProbe::probe_batch says why it matters), raised so that the doubling
// reaches the run's evaluation batch itself while its forward stays short, rather than extending a smaller one's line.
constexpr int64_t kEvalProbeBatch = 4;
// How long the check's largest step may take: a run's start waits for about twice this per measured step kind.
constexpr double kProbeStepSeconds = 1.0;

bool memory_check_skipped() {
  return env_word("MOH_MEMORY_CHECK").value_or("1") == "0";
}

std::vector<double> once_per_machine(const std::function<std::vector<double>()>& measure, size_t width,
                                     const RunContext& ctx, const SumOverRanks& sum, uint32_t host) {
  // Slots per rank: the machine's key, 1 for the rank that measured, its numbers.
  const size_t slot = 2 + width, me = static_cast<size_t>(ctx.rank) * slot;
  std::vector<double> all(static_cast<size_t>(ctx.world) * slot, 0.0);
  all[me] = host;
  if (ctx.local_rank == 0) {
    const std::vector<double> mine = measure();
    all[me + 1] = 1;
    std::copy_n(mine.begin(), std::min(width, mine.size()), all.begin() + static_cast<std::ptrdiff_t>(me + 2));
  }
  all = sum(all);
  for (size_t r = 0; r < static_cast<size_t>(ctx.world); ++r)
    if (all[r * slot] == host && all[r * slot + 1] == 1)
      return {all.begin() + static_cast<std::ptrdiff_t>(r * slot + 2),
              all.begin() + static_cast<std::ptrdiff_t>(r * slot + slot)};
  return measure();  // no local rank 0 on this machine (ranks numbered by hand): its own measurement
}

uint32_t this_machine_key() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return static_cast<uint32_t>(std::hash<std::string>{}(name)&0x7fffffffu);
}

namespace {

// While it lives, glibc maps every allocation above 128 KiB on its own and unmaps it when freed, so that a probe's
// peak resident set is its live memory. Under glibc's default, allocations below a threshold that rises to 32 MiB come
// from the heap, whose free space absorbed part of a small batch's activations: the feature forward's growth per
// image at 256-512 images was below its growth at thousands, and a batch 100 times larger was estimated at half its
// need (docs/BENCHMARKS.md, "Memory check before training"). Afterwards malloc is as every command runs it
// (keep_freed_heap). A user's own malloc settings (environment) are left alone.
class LiveSetHeap {
 public:
  explicit LiveSetHeap(bool on) : on_(on && !malloc_tuned_by_user()) {
#ifdef __GLIBC__
    if (on_) mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
  }
  ~LiveSetHeap() {
    if (on_) keep_freed_heap();
  }
  LiveSetHeap(const LiveSetHeap&) = delete;
  LiveSetHeap& operator=(const LiveSetHeap&) = delete;

 private:
  bool on_;
};

// The needs a check measures: its step's, and its evaluation forward's when it has one (eval_batch 0: none, or not
// measured because the step alone does not fit); the evaluation's as the bytes of its own tensors when eval_counted
// (on a CPU), else as the device's peak.
struct MeasuredNeeds {
  MemoryNeed train, eval;
  bool eval_counted = false;
  std::vector<double> numbers() const {
    return {train.fixed, train.per_sample, eval.fixed, eval.per_sample, eval_counted ? 1.0 : 0.0};
  }
  static MeasuredNeeds from(const std::vector<double>& v) { return {{v[0], v[1]}, {v[2], v[3]}, v[4] != 0}; }
};
constexpr size_t kMeasuredNumbers = 5;

// The step's need with what the run holds beside it (MemoryProbe::held, held_after).
MemoryNeed with_held(MemoryNeed need, const MemoryProbe& probe) {
  need.floor = need.fixed + probe.held_after;
  need.fixed += probe.held;
  return need;
}

// The peak of a step's own CPU tensors (core/tensor_count.h), or nullptr where they cannot be counted.
PeakOf counted_tensors(const c10::Device& device) {
  if (!device.is_cpu() || !cpu_tensor_peak_during([] {})) return nullptr;
  return [](const std::function<void()>& run) { return cpu_tensor_peak_during(run).value_or(0.0); };
}

MeasuredNeeds measure_needs(const MemoryProbe& probe, const RunContext& ctx, const MemoryPlan& plan,
                            const MemoryAvailable& available) {
  const LiveSetHeap live(probe.live_set && ctx.device.is_cpu());
  auto need_at = [&](const auto& build, int64_t batch, int64_t b1, const PeakOf& peak) {
    return measure_memory_need([&](int64_t b) { return build(ctx, b); }, std::min<int64_t>(b1, batch), batch,
                               ctx.device, kProbeStepSeconds, peak);
  };
  MeasuredNeeds n;
  n.train = need_at(probe.build, plan.batch, probe.probe_batch, nullptr);
  const bool step_fits = with_held(n.train, probe).at(plan.batch) <= available.bytes;  // else refused without it
  if (step_fits && probe.build_eval && probe.eval_batch > 0) {
    const PeakOf counted = counted_tensors(ctx.device);
    n.eval = need_at(probe.build_eval, probe.eval_batch,
                     std::max(kEvalProbeBatch, (probe.eval_batch + kReach - 1) / kReach), counted);
    n.eval_counted = counted != nullptr;
  }
  return n;
}

// The refusal (UserError) or the log line, from the measured needs.
MemoryVerdict verdict_of(const MeasuredNeeds& needs, const MemoryProbe& probe, const MemoryPlan& plan,
                         const MemoryAvailable& available, std::chrono::steady_clock::time_point start) {
  const MemoryNeed train_need = with_held(needs.train, probe);
  const double train = check_memory_fits(train_need, plan, available);
  double eval = 0;
  if (probe.build_eval && probe.eval_batch > 0) {
    MemoryPlan ep = plan;
    ep.what = "evaluating " + plan.what.substr(plan.what.find(' ') + 1);
    ep.batch = probe.eval_batch, ep.per_batch = 1, ep.setting = probe.eval_setting;
    // A run evaluates while its training state (weights, gradients, optimizer and EMA state) stays allocated: the
    // evaluation's activations come on top of the training step's fixed part. On a CPU they come on top of the whole
    // step: the heap keeps the pages of the step's freed activations, and the evaluation's tensors (another batch,
    // other shapes) mostly do not fit in their holes, so its forward raises the resident set above the step's peak
    // (docs/BENCHMARKS.md); its tensors are counted there, not read from a resident set that the heap's free space
    // blurs. A GPU's caching allocator hands its cached blocks back before it fails.
    MemoryNeed eval_need = needs.eval;
    if (needs.eval_counted)
      eval_need.fixed = static_cast<double>(train_need.at(plan.batch)) + std::max(0.0, eval_need.fixed);
    else
      eval_need.fixed = std::max(eval_need.fixed, train_need.fixed);
    eval = check_memory_fits(eval_need, ep, available);
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double step = train_need.fixed + train_need.per_sample * static_cast<double>(plan.batch);
  std::ostringstream line;
  line << std::fixed;
  line.precision(2);
  line << "memory: about " << gib(std::max(train, eval)) << " per process (" << probe.step << " batch " << plan.batch
       << ": " << gib(step);
  if (eval > 0) line << ", evaluation batch " << probe.eval_batch << ": " << gib(eval);
  if (probe.held_after > 0) line << ", then " << probe.after << ": " << gib(train_need.floor);
  line << ") of " << gib(available.bytes) << " available (measured in " << took << " s)";
  return {line.str(), std::max(train, eval)};
}

}  // namespace

MemoryVerdict preflight_memory(const MemoryProbe& probe, const RunContext& ctx, MemoryPlan plan,
                               const SumOverRanks& sum_over_ranks) {
  if (memory_check_skipped()) return {};
  const auto start = std::chrono::steady_clock::now();
  plan.what = probe.what, plan.other = probe.other;
  const MemoryAvailable available = memory_available(ctx.device, plan.sharing);
  MeasuredNeeds needs;
  if (sum_over_ranks && ctx.world > 1 && ctx.local_world > 1 && ctx.device.is_cpu()) {
    // The processes of a machine would each measure the same step on a share of its cores: one measures with all of
    // them (the refusal of a run that does not fit comes sooner), the others wait.
    needs = MeasuredNeeds::from(once_per_machine(
        [&] {
          const ScopedCpuThreads all_cores(std::min<int>(at::get_num_threads() * ctx.local_world,
                                                         static_cast<int>(std::thread::hardware_concurrency())));
          return measure_needs(probe, ctx, plan, available).numbers();
        },
        kMeasuredNumbers, ctx, sum_over_ranks, this_machine_key()));
  } else {
    needs = measure_needs(probe, ctx, plan, available);
  }
  return verdict_of(needs, probe, plan, available, start);
}

}  // namespace moh
