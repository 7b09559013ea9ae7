#pragma once
// What every benchmark shares: flag parsing (a bad flag is a UserError, exit 2, naming it; --help prints the help) and
// the record of the machine a figure was measured on.
#include <ATen/ATen.h>

#include <cxxopts.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

namespace moh::bench {

/// Parses argv into `out`; returns false when --help was asked for (the help is printed, nothing else to do).
bool parse_bench_flags(cxxopts::Options& options, int argc, char** argv, cxxopts::ParseResult& out);

/// {"cpu": model name, "cores": hardware threads, "threads": intra-op threads, "libtorch": version, "commit", "blas":
/// name and kernel}: put into every benchmark's JSON so that a figure always says where it was measured.
nlohmann::json machine_record();

/// The device of a benchmark's --device flag (cpu, cuda, cuda:N): a UserError where it is not there.
c10::Device bench_device(const std::string& name);

/// The dtype of a --dtype flag: fp32, bf16, or fp16 on a CUDA device (a UserError otherwise).
at::ScalarType bench_dtype(const std::string& name, const c10::Device& device);

/// Waits for the device's queued work (a GPU runs kernels after the call that launched them returns); no-op on a CPU.
void wait_for(const c10::Device& device);

/// Median of the values (the mean of the two middle ones for an even count).
double median(std::vector<double> v);

/// Times every function round-robin (each repetition runs every function once, after `warmup` untimed rounds), so
/// slow drifts of the machine affect them alike; returns each one's median time in milliseconds over `runs`.
std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& fns, int warmup, int runs);

}  // namespace moh::bench
