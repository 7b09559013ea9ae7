#include "core/platform/run_context.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#ifdef MOH_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <torch/cuda.h>
#include <torch/version.h>
#include <climits>
#include <thread>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/parse.h"
#include "core/platform/blas_core.h"
#include "core/platform/cpu_precision.h"
#include "moh_version.h"

namespace moh {

static int env_int(const char* a, const char* b, int fallback) {
  for (const char* k : {a, b}) {
    if (const char* v = std::getenv(k)) {
      const std::optional<int64_t> n = parse_int(v);
      if (!n || *n < INT_MIN || *n > INT_MAX)
        throw UserError(std::string("environment ") + k, std::string("not an integer: \"") + v + "\"", "");
      return static_cast<int>(*n);
    }
  }
  return fallback;
}

std::optional<int> launched_world() {
  if (!std::getenv("WORLD_SIZE") && !std::getenv("SLURM_NTASKS")) return std::nullopt;
  return env_int("WORLD_SIZE", "SLURM_NTASKS", 1);
}

RunContext RunContext::create(const std::string& device, Precision precision, uint64_t seed,
                              const PrecisionProbe* probe) {
  RunContext ctx;
  ctx.rank = env_int("RANK", "SLURM_PROCID", 0);
  ctx.world = launched_world().value_or(1);
  ctx.local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID", 0);
  ctx.restart = env_int("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", 0);
  ctx.max_restarts = env_int("TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_MAX_RESTARTS", 0);
  if (ctx.world < 1 || ctx.rank < 0 || ctx.rank >= ctx.world)
    throw UserError("environment", "RANK/WORLD_SIZE inconsistent", "launch with torchrun or `moh launch`");
  const int local_world = env_int("LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", 1);
  ctx.local_world = std::max(1, local_world);
  ctx.device = choose_device(device, ctx.local_rank, local_world, cuda_available() ? cuda_device_count() : 0);
  if (device == "auto" && !ctx.device.is_cuda() && cuda_available() && ctx.local_rank == 0)
    std::cerr << "note: device auto: " << local_world << " processes on this node, " << cuda_device_count()
              << " GPU(s): running on the CPU (one process per GPU; set train.processes or --nproc_per_node to "
              << cuda_device_count() << " to use the GPUs)" << std::endl;
  // This rank's GPU is the current one (torch.cuda.set_device): allocations without an explicit index, NCCL's
  // communicators and the CUDA generator then all belong to it.
  if (ctx.device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(ctx.device);
  if (precision == Precision::automatic)
    precision = ctx.device.is_cuda() ? Precision::bf16 : cpu_auto_precision(probe).precision;
  if (precision == Precision::fp16 && !ctx.device.is_cuda())
    throw UserError("precision fp16", "fp16 autocast needs a CUDA device", "use bf16 (CPU autocast) or fp32 on CPU");
  ctx.precision = precision;
  ctx.seed = seed;
  return ctx;
}

DeviceMemory device_memory(const std::string& device) {
  const bool gpu = device.rfind("cuda", 0) == 0 || (device == "auto" && cuda_available());
#ifdef MOH_TORCH_CUDA
  if (gpu && cuda_available()) {
    const int index = device.size() > 5 && device[4] == ':' ? std::atoi(device.c_str() + 5) : 0;
    if (index >= 0 && index < at::cuda::device_count())
      return {static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem),
              "GPU cuda:" + std::to_string(index)};
  }
#endif
  (void)gpu;
  return {physical_memory_bytes(), "this machine"};
}

int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : std::numeric_limits<int64_t>::max();
}

std::string toolkit_version() {
  return MOH_VERSION;
}

const char* moh_build_commit();  // generated: core/platform/commit_stamp.cmake

std::string toolkit_commit() {
  return moh_build_commit();
}

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

namespace {
std::string gpu_name(const c10::Device& device) {
#ifdef MOH_TORCH_CUDA
  if (cuda_available()) return at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->name;
#endif
  (void)device;
  return "unknown";
}
}  // namespace

nlohmann::json provenance(const c10::Device& device) {
  nlohmann::json p{{"device", device.str()}};
  if (device.is_cuda()) {
    p["device_name"] = gpu_name(device);
  } else {
    p["device_name"] = cpu_model_name();
    p["threads"] = at::get_num_threads();
    const BlasCore core = blas_core();
    p["blas"] = detect_blas().name + (core.used.empty() ? "" : " (" + core.used + ")");
  }
  p["libtorch"] = libtorch_version();
  p["commit"] = toolkit_commit();
  return p;
}

std::string device_line(const c10::Device& device) {
  const nlohmann::json p = provenance(device);
  std::string line = p["device"].get<std::string>() + " (" + p["device_name"].get<std::string>();
  if (p.contains("threads")) {
    const int n = p["threads"].get<int>();
    line += ", " + std::to_string(n) + (n == 1 ? " thread, " : " threads, ") + p["blas"].get<std::string>();
  }
  return line + ")";
}

bool cuda_available() {
  return torch::cuda::is_available();
}

void use_deterministic_kernels() {
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);  // a user's own setting stays
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
}

namespace {
constexpr const char* kRemoveAll = "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE";  // std::filesystem::remove_all
std::string object_of(void* symbol) {
  Dl_info info{};
  return symbol && dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "";
}
}  // namespace

std::string std_filesystem_library() {
  return object_of(dlsym(RTLD_DEFAULT, kRemoveAll));
}

void prefer_system_libstdcxx() {
  if (std::getenv("MOH_LIBSTDCXX_PRELOADED") || std_filesystem_library().find("libtorch") == std::string::npos) return;
  void* own = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
  const std::string lib = own ? object_of(dlsym(own, kRemoveAll)) : "";
  if (lib.empty() || lib.find("libstdc++") == std::string::npos) return;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  if (args.empty()) return;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const char* pre = std::getenv("LD_PRELOAD");
  ::setenv("LD_PRELOAD", (pre && *pre ? lib + ":" + pre : lib).c_str(), 1);
  ::setenv("MOH_LIBSTDCXX_PRELOADED", "1", 1);
  ::execv("/proc/self/exe", argv.data());  // returns only on failure: go on as we are
}

int cuda_device_count() {
  return static_cast<int>(torch::cuda::device_count());
}

c10::Device choose_device(const std::string& device, int local_rank, int local_world, int gpus) {
  auto cuda = [](int i) { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)); };
  const int on_node = std::max(local_world, local_rank + 1);
  if (device == "cpu") return c10::Device(c10::kCPU);
  if (device == "auto") return gpus > 0 && on_node <= gpus ? cuda(local_rank) : c10::Device(c10::kCPU);
  if (device.rfind("cuda", 0) != 0) throw UserError("device " + device, "expected auto, cpu, cuda or cuda:N", "");
  if (gpus == 0) {
    const std::string build = libtorch_cuda_build();
    throw UserError("device " + device,
                    build.empty() ? "this LibTorch " + libtorch_version() + " is CPU-only"
                                  : "no CUDA GPU is visible (LibTorch " + libtorch_version() + " is a CUDA " + build +
                                        " build; check nvidia-smi and CUDA_VISIBLE_DEVICES)",
                    build.empty()
                        ? "use device: cpu, or build against a CUDA LibTorch: MOH_LIBTORCH=pip scripts/setup.sh"
                        : "use device: cpu");
  }
  if (device == "cuda") {
    if (on_node > gpus)
      throw UserError("device cuda",
                      std::to_string(on_node) + " processes on this node but " + std::to_string(gpus) +
                          " GPU(s) visible: each process needs a GPU of its own",
                      "set train.processes or --nproc_per_node to " + std::to_string(gpus) + ", or use device: cpu");
    return cuda(local_rank);
  }
  c10::Device d(c10::kCPU);
  try {
    d = c10::Device(device);
  } catch (const c10::Error&) {
    throw UserError("device " + device, "expected auto, cpu, cuda or cuda:N", "");
  }
  if (d.index() >= gpus)
    throw UserError("device " + device,
                    std::to_string(gpus) + " GPU(s) visible (cuda:0 .. cuda:" + std::to_string(gpus - 1) + ")",
                    "check CUDA_VISIBLE_DEVICES");
  return d;
}

std::string precision_summary(Precision requested, const RunContext& ctx, const PrecisionProbe* probe) {
  std::string s = config::to_string(ctx.precision);
  if (ctx.precision == Precision::tf32 && !ctx.device.is_cuda()) return s + " (fp32 on a CPU)";
  if (requested != Precision::automatic) return s;
  if (ctx.device.is_cuda()) return s + " (auto: CUDA)";
  const CpuPrecision& c = cpu_auto_precision(probe);
  if (c.fp32_ms <= 0) return s + " (auto: " + c.how + ")";
  std::ostringstream why;
  why.precision(2);
  why << std::fixed << " (auto: a bf16 step takes " << c.bf16_ms / c.fp32_ms << "x the fp32 one on this CPU and build, "
      << c.how << ")";
  return s + why.str();
}

std::string slow_bf16_warning(const RunContext& ctx) {
  if (ctx.precision != Precision::bf16 || ctx.device.is_cuda() || cpu_has_native_bf16()) return "";
  return "precision bf16 on a CPU without native bf16 (no avx512_bf16/amx_bf16): matrix products run several times "
         "slower than in fp32 here (precision: auto picks fp32 on such CPUs)";
}

std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

bool cpu_has_native_bf16() {
  static const bool has = [] {
    std::ifstream info("/proc/cpuinfo");
    std::string line;
    while (std::getline(info, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      std::istringstream flags(line.substr(line.find(':') + 1));
      for (std::string f; flags >> f;)
        if (f == "avx512_bf16" || f == "amx_bf16") return true;
      return false;
    }
    return false;
  }();
  return has;
}

namespace {
/// The value of `key=` in LibTorch's build settings line ("" when absent).
std::string build_setting(const std::string& key) {
  static const std::string config = at::show_config();
  const std::string needle = key + "=";
  size_t at = config.find(needle);
  if (at == std::string::npos) return "";
  at += needle.size();
  return config.substr(at, config.find_first_of(",\n", at) - at);
}
}  // namespace

std::string libtorch_cuda_build() {
  const std::string use = build_setting("USE_CUDA");
  if (use != "1" && use != "ON") return "";
  const std::string v = build_setting("CUDA_VERSION");
  return v.empty() ? "?" : v;
}

BlasInfo detect_blas() {
  // Make sure LibTorch's BLAS is loaded (a tiny GEMM), then look at what is mapped.
  (void)at::mm(at::ones({2, 2}), at::ones({2, 2}));
  // The pip wheels carry MKL inside libtorch_cpu (BLAS_INFO=mkl); Debian's LibTorch calls the system libblas.so.3.
  if (build_setting("BLAS_INFO") == "mkl") return {"MKL (inside LibTorch)", "", false};
  BlasInfo info{"unknown (statically linked or built-in)", "", false};
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    std::string file = path.substr(path.rfind('/') + 1);
    if (file.find("openblas") != std::string::npos || path.find("/openblas") != std::string::npos) {
      return {"OpenBLAS", path, false};
    }
    if (file.find("mkl") != std::string::npos) info = {"MKL", path, false};
    if (file.rfind("libblas.so", 0) == 0 && path.find("/blas/") != std::string::npos)
      info = {"reference BLAS (slow)", path, true};
    if (file.rfind("libblis", 0) == 0) info = {"BLIS", path, false};
  }
  return info;
}

namespace {
// openblas_get_num_threads of the OpenBLAS mapped into this process, or 0.
int openblas_threads() {
  using Fn = int (*)();
  auto fn = reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn ? fn() : 0;
}
bool openmp_backend() {
  return at::get_parallel_info().find("ATen parallel backend: OpenMP") != std::string::npos;
}
}  // namespace

ThreadSetup thread_setup() {
  ThreadSetup t;
  t.intra_op = at::get_num_threads();
  t.backend = openmp_backend() ? "OpenMP" : "native";
  if (const char* w = std::getenv("OMP_WAIT_POLICY")) t.wait_policy = w;
  t.blas_threads = detect_blas().name == "OpenBLAS" ? openblas_threads() : 0;
  t.set_by_moh = std::getenv("MOH_THREADS_SET") != nullptr;
  return t;
}

bool needs_sleeping_openmp() {
  if (std::getenv("MOH_THREADS_SET") || std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return false;
  return openmp_backend() && detect_blas().name == "OpenBLAS" && openblas_threads() > 1;
}

int configure_cpu_threads() {
  const bool user_set = std::getenv("OMP_NUM_THREADS") || std::getenv("TORCH_NUM_THREADS");
  if (!user_set) at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return at::get_num_threads();
}

namespace {
void set_openblas_threads(int threads) {
  using Fn = void (*)(int);
  if (auto fn = reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}
}  // namespace

ScopedCpuThreads::ScopedCpuThreads(int threads) : intra_op_(at::get_num_threads()), blas_(openblas_threads()) {
  if (threads == intra_op_) return;
  at::set_num_threads(threads);
  if (blas_ > 0 && blas_ != threads) set_openblas_threads(threads);
}

ScopedCpuThreads::~ScopedCpuThreads() {
  if (at::get_num_threads() != intra_op_) at::set_num_threads(intra_op_);
  if (blas_ > 0 && openblas_threads() != blas_) set_openblas_threads(blas_);
}

void warn_if_reference_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    BlasInfo b = detect_blas();
    if (b.reference)
      std::cerr << "warning: LibTorch is using the reference BLAS (" << b.path
                << "): matrix products run ~40x slower (apt-get install libopenblas0-pthread, or run "
                   "scripts/setup.sh)\n";
  });
}

}  // namespace moh
