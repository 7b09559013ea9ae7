#include "core/run_context.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <thread>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>

#include "core/error.h"
#include "moh_version.h"


namespace moh {

static int env_int(const char* a, const char* b, int fallback) {
  for (const char* k : {a, b}) {
    if (const char* v = std::getenv(k)) {
      try {
        return std::stoi(v);
      } catch (...) {
        throw UserError(std::string("environment ") + k, std::string("not an integer: \"") + v + "\"", "");
      }
    }
  }
  return fallback;
}

RunContext RunContext::create(const std::string& device, Precision precision, uint64_t seed) {
  RunContext ctx;
  ctx.rank = env_int("RANK", "SLURM_PROCID", 0);
  ctx.world = env_int("WORLD_SIZE", "SLURM_NTASKS", 1);
  ctx.local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID", 0);
  if (ctx.world < 1 || ctx.rank < 0 || ctx.rank >= ctx.world)
    throw UserError("environment", "RANK/WORLD_SIZE inconsistent", "launch with torchrun or `moh launch`");
  bool cuda = cuda_available();
  if (device == "auto") {
    ctx.device = cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(ctx.local_rank)) : c10::Device(c10::kCPU);
  } else if (device == "cpu") {
    ctx.device = c10::Device(c10::kCPU);
  } else if (device.rfind("cuda", 0) == 0) {
    if (!cuda) throw UserError("device " + device, "CUDA is not available in this build/machine", "use device: cpu");
    ctx.device = device == "cuda" ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(ctx.local_rank))
                                  : c10::Device(device);
  } else {
    throw UserError("device " + device, "expected auto, cpu, cuda or cuda:N", "");
  }
  if (precision == Precision::fp16 && !ctx.device.is_cuda())
    throw UserError("precision fp16", "fp16 autocast needs a CUDA device", "use bf16 (CPU autocast) or fp32 on CPU");
  ctx.precision = precision;
  ctx.seed = seed;
  return ctx;
}

std::string toolkit_version() { return MOH_VERSION; }

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool cuda_available() { return torch::cuda::is_available(); }

BlasInfo detect_blas() {
  // Make sure LibTorch's BLAS is loaded (a tiny GEMM), then look at what is mapped.
  (void)at::mm(at::ones({2, 2}), at::ones({2, 2}));
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

int configure_cpu_threads() {
  const bool user_set = std::getenv("OMP_NUM_THREADS") || std::getenv("TORCH_NUM_THREADS");
  if (!user_set) at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return at::get_num_threads();
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
