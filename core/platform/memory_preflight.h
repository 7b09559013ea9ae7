#pragma once
// Whether a run fits in memory, decided before it does any work. A run that does not fit is otherwise killed by the
// kernel (or fails with "CUDA out of memory") minutes in, after loading its data and compiling its first steps. The
// check measures instead of modelling: the peak memory of one real step at a few small batches on the run's device,
// extrapolated linearly to the run's batch (activations grow with the batch; weights, gradients, optimizer and EMA
// state do not), times the processes that share this machine or GPU, against what is available there.
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moh {

/// Peak memory of one step as a line in the batch, fixed + per_sample · batch (bytes), or of a later phase that does
/// not depend on the batch (floor), whichever is higher.
struct MemoryNeed {
  double fixed = 0, per_sample = 0, floor = 0;
  int64_t at(int64_t batch) const;
  /// The largest batch whose need is at most `bytes` (0 when not even one sample fits).
  int64_t largest_batch(double bytes) const;
};

/// Memory this process may use on `device`, with a name for messages: on a CPU, the machine's available memory
/// (MemAvailable, or the cgroup's limit when lower) plus this process's resident set, split among the `sharing`
/// processes of this machine (each holds about what this one holds now); on a GPU, its free memory plus what this
/// process's allocator holds.
struct MemoryAvailable {
  double bytes = 0;
  std::string name;
};
MemoryAvailable memory_available(const c10::Device& device, int sharing);

/// The peak memory while `run` runs: the process's resident set on a CPU (its high-water mark, reset first), the
/// CUDA caching allocator's peak of reserved bytes on a GPU.
double peak_memory_during(const std::function<void()>& run, const c10::Device& device);

/// The process's peak memory since it started (or since the last peak_memory_during): its resident set's high-water
/// mark on a CPU, the CUDA caching allocator's peak of reserved bytes on a GPU. What a run reports beside the estimate.
double peak_memory_so_far(const c10::Device& device);

/// Whether the user tunes glibc's malloc through the environment (GLIBC_TUNABLES, MALLOC_*_): then the toolkit's own
/// mallopt settings (the memory check's measurement, keep_freed_heap) leave malloc alone.
bool malloc_tuned_by_user();

/// glibc's malloc as every moh command computes with it: allocations below 32 MiB from the heap, and freed heap memory
/// kept there (up to 2 GiB at a heap's top) for the next step, batch or image. Under glibc's defaults each training
/// step's activations went back to the system when freed and came back as fresh pages (page faults and zeroing). A
/// process then stays at its peak resident set, the figure the memory check budgets. Idempotent; nothing where the
/// user tunes malloc (malloc_tuned_by_user) or the C library is not glibc.
void keep_freed_heap();

/// Measures the need: `build(batch)` returns one step of the real model at that batch (built afresh, its first call
/// allocating the optimizer's state); every batch's step is measured at its second call when the first batch's first
/// call is short, else at its first (never a line through one batch's first call and another's second: it would rise
/// by the optimizer's state). Batches b1, 2·b1, 4·b1, … (at most 32·b1) while the next step should take at most
/// `step_seconds` (twice the last one's computing time per thread, so that a loaded machine measures the same batches)
/// or, measured at its second call, its own tensors stay within 64 MiB (a loaded machine's time then says nothing of
/// its work), up to b2 (the run's batch); when the step at b1 is already too slow to double, b1/2 and b1 instead (b1
/// measured again, and doubled, when b1/2 is fast: the first step paid the process's set-up; both measured again at
/// their second calls when their first calls' peaks hardly differ: the optimizer phase, not the activations, set them).
/// The need is the line through the two largest (with b2 ≤ b1, the one measurement: no extrapolation): through the
/// larger one's peak, its slope on a CPU the growth of the step's own tensors (core/tensor_count.h).
/// MOH_MEMORY_CHECK=verbose prints every point. `peak` reads a step's peak instead of peak_memory_during (then the
/// slope is the peaks' too).
using PeakOf = std::function<double(const std::function<void()>& run)>;
MemoryNeed measure_memory_need(const std::function<std::function<void()>(int64_t)>& build, int64_t b1, int64_t b2,
                               const c10::Device& device, double step_seconds = 1.0, const PeakOf& peak = nullptr);

/// What a refusal names.
struct MemoryPlan {
  std::string what;       ///< "training MoH-ViT-Nano at 224 px"
  int64_t batch = 1;      ///< per process (the batch one step of one process sees)
  int64_t per_batch = 1;  ///< what the setting counts per process batch (e.g. ranks × accumulation for data.batch_size)
  int sharing = 1;        ///< processes on this machine or GPU
  std::string setting;    ///< the setting to lower ("data.batch_size")
  std::string other;      ///< other ways out ("model.img_size, or train.grad_checkpoint: blocks")
};

/// The refusal: a UserError naming the estimate, what is available and the largest setting that fits, when
/// need.at(batch) exceeds the available memory. Returns the estimate (bytes per process) otherwise.
double check_memory_fits(const MemoryNeed& need, const MemoryPlan& plan, const MemoryAvailable& available);

/// What a command hands the check: one step of its real model at a batch, on the run's device and precision.
struct RunContext;
struct MemoryProbe {
  std::string what;   ///< "training MoH-ViT-Nano at 224 px"
  std::string other;  ///< other settings that lower the need ("model.img_size, or train.grad_checkpoint: blocks")
  std::string step = "training";  ///< what `build` runs, for the log line ("sampling")
  /// Bytes the run holds beside its step whatever the batch, computed rather than measured (e.g. the features of
  /// every image an evaluation has seen); added to the step's fixed part.
  double held = 0;
  /// Bytes of a later phase without the step's activations, beyond the step's fixed part (an evaluation's metrics
  /// over the features of every image).
  double held_after = 0;
  std::string after;  ///< that phase, for the log line ("the metrics")
  /// The smallest batch measured (measure_memory_need raises it towards the run's batch while a step stays short):
  /// small keeps a large model's check short.
  int64_t probe_batch = 2;
  /// Whether the run's batch lies far beyond the batches measured (a feature forward probed at 512 images for a batch
  /// of 60,000): then, on a CPU, every allocation of the probe above 128 KiB is mapped on its own, so that the measured
  /// peaks are the step's live memory, not lowered by free space the heap already holds (LiveSetHeap).
  bool live_set = false;
  std::function<std::function<void()>(const RunContext& ctx, int64_t batch)> build;
  /// One evaluation forward (no gradients) at a batch, when the run evaluates during training; its batch setting.
  /// On a CPU its own tensors are counted (core/tensor_count.h) and come on top of the training step's peak.
  std::function<std::function<void()>(const RunContext& ctx, int64_t batch)> build_eval;
  int64_t eval_batch = 0;
  std::string eval_setting;  ///< "data.eval_batch_size"
};

/// What the check decided: the line for the log and the estimate it gives (bytes per process; 0 when skipped).
struct MemoryVerdict {
  std::string line;
  double estimate = 0;
};

/// The check as a command runs it, before any work: skipped when MOH_MEMORY_CHECK=0; measures the step (training,
/// sampling) at a few batches (the evaluation forward too, when there is one), refuses (UserError) or returns the
/// verdict, whose line reads "memory: about 1.2 GiB per process (training batch 64: 1.2 GiB, evaluation batch 256:
/// 0.9 GiB) of 10.3 GiB available (measured in 0.8 s)". With `sum_over_ranks` (the run's group: every rank calls it)
/// and several processes on one CPU machine, only local rank 0 measures, with all their threads, while the others
/// wait (once_per_machine).
using SumOverRanks = std::function<std::vector<double>(const std::vector<double>&)>;
MemoryVerdict preflight_memory(const MemoryProbe& probe, const RunContext& ctx, MemoryPlan plan,
                               const SumOverRanks& sum_over_ranks = nullptr);

/// A measurement shared by the processes of each machine: local rank 0 runs `measure` (`width` numbers), the other
/// ranks run nothing, and after `sum` (an all-reduce over every rank of ctx.world, each rank calling it once) every
/// rank returns the numbers of local rank 0 on its own machine (`host`, a key of the machine's name). The measuring
/// rank's numbers are exact: each rank writes only its own slots of the summed vector.
std::vector<double> once_per_machine(const std::function<std::vector<double>()>& measure, size_t width,
                                     const RunContext& ctx, const SumOverRanks& sum, uint32_t host);

/// A key of this machine's name (gethostname) for once_per_machine.
uint32_t this_machine_key();

/// Whether the user turned the check off (MOH_MEMORY_CHECK=0): a command skips what it computes only for the check.
bool memory_check_skipped();

/// "12.3 GiB".
std::string gib(double bytes);
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace moh
