#pragma once
// The toolkit's own CPU kernels against LibTorch's op for the same work, at the shapes the models run: the attention
// core softmax(q kᵀ · scale) v (vision/nn/attention_cpu.h) against LibTorch 2.x's flash attention for CPUs (1.13: the
// plain matmul-softmax-matmul and its autograd backward), and the tanh GELU (vision/nn/gelu_cpu.h) against
// at::gelu / at::gelu_backward; forward and backward apart, fp32 and bf16, each of the toolkit's instruction-set
// variants this CPU runs (AVX-512, AVX2, baseline). Operands as the models pass them: q, k, v strided views of one
// (B, N, 3, h, d) qkv product. Every case of a shape is timed round-robin (each repetition runs each once), median.
#include <cstdint>
#include <string>
#include <vector>

namespace moh::bench {

/// One attention shape: batch, tokens, heads, head width; the GELU runs on its MLP's hidden activations
/// (B·N, 4·h·d).
struct KernelShape {
  int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  std::string name;  ///< e.g. "MoH-DiT-Pixel/2 batch 32"
};

/// One measured row: the op ("attention forward", ...), the shape, dtype, implementation ("moh AVX2", "LibTorch")
/// and the median time; `ratio` = LibTorch's time / this row's (> 1: faster than LibTorch). The machine's own rows
/// (op "peak": a 2048³ product, a 256 MiB copy) give `rate` in `unit` (GFLOP/s, GB/s read + written) instead.
struct KernelBenchRow {
  std::string op, shape, dtype, impl;
  double ms = 0, ratio = 1, rate = 0;
  std::string unit;
};

struct KernelBenchOptions {
  std::vector<KernelShape> shapes;  ///< empty: the demo's DiT (32:196:4:16) and DiT-S/2 at 32×32 (8:256:6:64)
  std::vector<std::string> dtypes{"fp32", "bf16"};
  std::vector<std::string> ops{"attention", "gelu"};  ///< and "peak": the roofline's two ceilings
  int warmup = 2, runs = 9;
  int threads = 0;  ///< intra-op threads (0: LibTorch's default)
};

/// Runs every case; one line per row to stdout as it is measured when `log`.
std::vector<KernelBenchRow> run_kernel_bench(const KernelBenchOptions& options, bool log = true);

/// `moh bench kernels`: flags --shapes B:N:h:d,..., --dtypes, --ops, --runs, --warmup, --threads, --json.
int kernel_bench_main(int argc, char** argv);

}  // namespace moh::bench
