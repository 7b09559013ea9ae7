#include "bench/common.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/error.h"
#include "core/platform/run_context.h"
#include "vision/nn/cpu_simd.h"

namespace moh::bench {

bool parse_bench_flags(cxxopts::Options& options, int argc, char** argv, cxxopts::ParseResult& out) {
  try {
    out = options.parse(argc, argv);
  } catch (const std::exception& e) {
    throw UserError(argv[0], e.what(), "see --help");
  }
  if (!out.count("help")) return true;
  std::cout << options.help() << std::endl;
  return false;
}

// The host's side of provenance(): the BLAS with its kernel ("OpenBLAS (Cooperlake)"), so CPU rows say what ran them.
nlohmann::json machine_record() {
  const nlohmann::json p = provenance(c10::Device(c10::kCPU));
  return {{"cpu", p["device_name"]},
          {"cores", std::max(1u, std::thread::hardware_concurrency())},
          {"threads", p["threads"]},
          {"libtorch", p["libtorch"]},
          {"commit", p["commit"]},
          {"blas", p["blas"]},
          {"cpu_kernels", nn::simd::isa_name(nn::simd::isa())}};
}

c10::Device bench_device(const std::string& name) {
  return RunContext::create(name, Precision::fp32, 0).device;
}

at::ScalarType bench_dtype(const std::string& name, const c10::Device& device) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16" && device.is_cuda()) return at::kHalf;
  throw UserError("--dtype " + name, name == "fp16" ? "fp16 is for CUDA devices" : "unknown dtype",
                  "fp32, bf16 or (CUDA) fp16");
}

void wait_for(const c10::Device& device) {
  if (device.is_cuda()) (void)at::zeros({1}, at::TensorOptions().device(device)).cpu();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& fns, int warmup, int runs) {
  std::vector<std::vector<double>> ms(fns.size());
  for (int r = 0; r < warmup + runs; ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      auto t0 = std::chrono::steady_clock::now();
      fns[i]();
      double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r >= warmup) ms[i].push_back(dt);
    }
  std::vector<double> out;
  for (auto& v : ms) out.push_back(median(v));
  return out;
}

}  // namespace moh::bench
