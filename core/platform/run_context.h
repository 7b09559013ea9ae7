#pragma once
// Where and how a run executes: device, precision, seed, and the data-parallel rank/world (read once from the
// torchrun or Slurm environment). Decided once in the app and passed down; modules never look at globals.
#include <c10/core/Device.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/train_config.h"

namespace moh {

struct PrecisionProbe;

/// Execution context of one process.
struct RunContext {
  c10::Device device{c10::kCPU};
  Precision precision = Precision::fp32;
  uint64_t seed = 0;
  int rank = 0, world = 1, local_rank = 0;
  int local_world = 1;  ///< processes of the run on this machine (LOCAL_WORLD_SIZE)
  /// The how-manyth start after a failure this is, and the most allowed (torchrun's TORCHELASTIC_RESTART_COUNT /
  /// TORCHELASTIC_MAX_RESTARTS, set by `moh launch --max-restarts`); 0 and 0 outside a restarting launcher.
  int restart = 0, max_restarts = 0;

  bool is_main() const { return rank == 0; }
  /// Builds the context: `device` is auto|cpu|cuda|cuda:N; rank/world from RANK/WORLD_SIZE/LOCAL_RANK or
  /// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID. Errors (no CUDA, fp16 on CPU; bf16 is fine) are UserErrors.
  /// Precision::automatic is resolved here: bf16 on CUDA; on a CPU by cpu_auto_precision(probe)
  /// (core/platform/cpu_precision.h: measured, cached per machine); precision_summary() says to what and why, for the
  /// run's start line.
  static RunContext create(const std::string& device, Precision precision, uint64_t seed,
                           const PrecisionProbe* probe = nullptr);
};

/// The world size a launcher set for this process (WORLD_SIZE, else SLURM_NTASKS); none outside a launch. A value that
/// is not an integer is a UserError.
std::optional<int> launched_world();

/// The run's precision for its start line: "fp32", "bf16 (auto: CUDA)", "fp32 (auto: no native bf16 on this CPU)",
/// "fp32 (auto: a bf16 step takes 1.18x the fp32 one on this CPU and build, measured ...)".
std::string precision_summary(Precision requested, const RunContext& ctx, const PrecisionProbe* probe = nullptr);
/// A one-line warning (without "warning: ") when bf16 autocast runs on a CPU without native bf16, where bf16 matrix
/// products are many times slower than fp32 (LibTorch's fallback GEMM); "" otherwise.
std::string slow_bf16_warning(const RunContext& ctx);

/// Whether this CPU has native bf16 arithmetic (avx512_bf16 or amx_bf16 in /proc/cpuinfo). Without it LibTorch's CPU
/// bf16 autocast is several times slower than fp32; with it bf16 may still lose (docs/BENCHMARKS.md), which is why
/// precision: auto measures.
bool cpu_has_native_bf16();

/// The CPU's model name (/proc/cpuinfo "model name"; "unknown" elsewhere), for benchmark records.
std::string cpu_model_name();

/// Physical memory of this machine in bytes (sysconf), for refusing sizes that cannot be allocated before any work.
int64_t physical_memory_bytes();

/// The memory of the device a run's `device` setting (auto|cpu|cuda|cuda:N) resolves to: the GPU's total memory, or
/// this machine's (auto without a visible GPU, cpu), with a name for messages ("GPU cuda:0", "this machine").
struct DeviceMemory {
  int64_t bytes = 0;
  std::string name;
};
DeviceMemory device_memory(const std::string& device);

/// Toolkit version string ("0.1.0").
std::string toolkit_version();
/// The commit this binary was built from ("7a4de96", "7a4de96-dirty", or "unknown" when built outside a git
/// checkout): stamped at build time (core/platform/commit_stamp.cmake), so it names the binary, not the checkout beside
/// it.
std::string toolkit_commit();
/// LibTorch version string ("1.13.1").
std::string libtorch_version();
/// Where a result was computed, for the files it is read from later (sampling.json, the FID and evaluation reports):
/// {"device": "cpu" | "cuda:N", "device_name": the CPU model or the GPU's name, "threads": LibTorch's intra-op threads
/// (CPU), "blas": "OpenBLAS (Cooperlake)" | "MKL" (CPU), "libtorch", "commit": toolkit_commit()}. Two numbers that
/// differ by device, library or BLAS kernel in the last digits can then be told apart from a real difference.
nlohmann::json provenance(const c10::Device& device);
/// provenance() for a log line: "cuda:0 (NVIDIA H200)", "cpu (AMD EPYC, 2 threads, OpenBLAS (Cooperlake))".
std::string device_line(const c10::Device& device);
/// Whether this LibTorch has CUDA and a device is visible.
bool cuda_available();
/// Deterministic kernels from here on (train.deterministic): LibTorch's deterministic algorithms, erroring on an
/// operation that has none, and cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG, before its first handle).
void use_deterministic_kernels();
/// The file that defines the std::filesystem this process calls (its dynamic linker's choice).
std::string std_filesystem_library();
/// The pip wheel's libtorch_cpu.so exports a std::filesystem of its own, built by another GCC; where the dynamic
/// linker binds this program's std::filesystem calls to it (LibTorch ahead of libstdc++ among the needed libraries,
/// which some linkers do whatever the link line says), they can crash. Then this runs the program again (same
/// arguments, same pid) with the system libstdc++ preloaded, as `LD_PRELOAD=libstdc++.so.6` does by hand; otherwise
/// it returns at once. Called first thing by `moh` and the test binaries.
void prefer_system_libstdcxx();
/// Number of visible CUDA devices (0 without CUDA).
int cuda_device_count();
/// The device of a process: `device` (auto|cpu|cuda|cuda:N) for local rank `local_rank` of `local_world` processes
/// on a node with `gpus` visible GPUs. cuda gives each process the GPU of its local rank and refuses more processes
/// than GPUs (NCCL needs a GPU per rank); auto takes the GPUs only when each process gets one, else the CPU; cuda:N
/// must name a visible GPU. Refusals are UserErrors. Pure: tests simulate any GPU count.
c10::Device choose_device(const std::string& device, int local_rank, int local_world, int gpus);

/// The CUDA version this LibTorch was built with ("13.0"), or "" for a CPU-only LibTorch (from at::show_config()).
std::string libtorch_cuda_build();

/// Intra-op CPU threads: LibTorch's default here is 1 (omp_get_max_threads() reports 1 inside Debian's LibTorch
/// although the machine has 2 cores), so use every core unless OMP_NUM_THREADS / TORCH_NUM_THREADS say otherwise.
/// Returns the thread count in effect.
int configure_cpu_threads();

/// Sets this process's CPU threads (LibTorch's intra-op threads and OpenBLAS's pool, when it has one) to `threads`
/// while it lives, then restores both: the one process of a machine that works for all of them while they wait, or
/// one process that measures what each of several ranks would see.
class ScopedCpuThreads {
 public:
  explicit ScopedCpuThreads(int threads);
  ~ScopedCpuThreads();
  ScopedCpuThreads(const ScopedCpuThreads&) = delete;
  ScopedCpuThreads& operator=(const ScopedCpuThreads&) = delete;

 private:
  int intra_op_ = 0, blas_ = 0;
};

/// How the CPU's thread pools are set up, for `moh --version` and benchmark records.
struct ThreadSetup {
  int intra_op = 1;         ///< LibTorch's intra-op threads
  std::string backend;      ///< "OpenMP" or "native"
  std::string wait_policy;  ///< OMP_WAIT_POLICY in effect ("" = libgomp's default: spin, then sleep)
  int blas_threads = 0;     ///< OpenBLAS's own pthread pool (0 = the BLAS runs on the intra-op threads)
  bool set_by_moh = false;  ///< the wait policy was set by the re-exec below, not by the user
};
ThreadSetup thread_setup();

/// LibTorch's intra-op pool is OpenMP and, in Debian's build, matrix products run on OpenBLAS's own pthread pool:
/// idle OpenMP workers spin (libgomp's default) on the cores OpenBLAS computes on. With OMP_WAIT_POLICY=passive
/// they sleep; libgomp reads it only when it starts, so when it is needed and not set by the user (MOH_THREADS_SET
/// marks moh's own setting), the program runs again with it set (reexec_for_cpu, core/platform/blas_core.h). False for
/// MKL builds and user settings.
bool needs_sleeping_openmp();

/// Which BLAS LibTorch's matrix products run on.
struct BlasInfo {
  std::string name;  ///< "OpenBLAS", "reference BLAS (slow)", "MKL", "unknown"
  std::string path;  ///< the mapped library, if any
  bool reference = false;
};
/// Detects the BLAS by the libraries mapped into this process (/proc/self/maps).
BlasInfo detect_blas();
/// Prints one warning to stderr (once per process) if LibTorch runs on the reference BLAS.
void warn_if_reference_blas();

}  // namespace moh
