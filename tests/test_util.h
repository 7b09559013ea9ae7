#pragma once
// Shared helpers for the GoogleTest suites.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace moh::test {

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

/// max |a − b| / max(|b|_∞, tiny): relative error in the ∞-norm.
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  double denom = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / denom;
}

}  // namespace moh::test
