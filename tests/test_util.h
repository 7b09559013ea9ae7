#pragma once
// Shared helpers for the GoogleTest suites.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace moh::test {

/// MOH_SOURCE_DIR/parts... as one path, built by appending: GCC 12 at -O3 warns falsely (-Warray-bounds,
/// -Wstringop-overflow) on some chains of std::string operator+, and CI builds with -Werror.
template <class... Parts>
std::string source_path(const Parts&... parts) {
  std::string path = MOH_SOURCE_DIR;
  path += '/';
  (path += ... += parts);
  return path;
}

/// A fresh temporary directory removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("moh_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories((path / name).parent_path());
    std::ofstream(path / name, std::ios::binary) << text;
    return file(name);
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

/// Total number of parameter elements of a module holder (what `sum(p.numel() for p in model.parameters())` gives).
template <class M>
int64_t count_params(M& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

/// The device of the device-following tests: MOH_TEST_DEVICE = cpu (default), cuda or cuda:N. Asking for a GPU that
/// is not there throws (the test fails) rather than quietly testing the CPU.
inline std::string device_name() {
  const char* v = std::getenv("MOH_TEST_DEVICE");
  const std::string d = v && *v ? v : "cpu";
  if (d != "cpu" && (d.rfind("cuda", 0) != 0 || !torch::cuda::is_available()))
    throw std::runtime_error("MOH_TEST_DEVICE=" + d + ": use cpu, or cuda / cuda:N on a machine with a GPU");
  return d;
}
inline torch::Device device() {
  const torch::Device d(device_name());
  return d.is_cuda() && !d.has_index() ? torch::Device(torch::kCUDA, 0) : d;  // where tensors say they are
}
/// The train: keys that put a test's training run on that device, bit-reproducible there (train.deterministic).
inline std::string train_device_keys() {
  return device_name() == "cpu" ? "device: cpu" : "device: " + device_name() + ", deterministic: true";
}
/// Tolerance of a result in `dtype` against its fp64 CPU reference (relative, ∞-norm); TF32 is off in these tests.
inline double tolerance(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kDouble:
      return 1e-12;
    case torch::kFloat:
      return 2e-5;
    case torch::kHalf:
      return 1e-2;
    default:
      return 5e-2;  // bf16: 8 bits of mantissa
  }
}

/// max |a − b| / max(|b|_∞, tiny): relative error in the ∞-norm.
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  double denom = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / denom;
}

/// The message of the UserError `f` throws ("" when it throws none).
inline std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace moh::test
