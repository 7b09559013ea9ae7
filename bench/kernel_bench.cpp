#include "bench/kernel_bench.h"

#include <ATen/ATen.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/common.h"
#include "core/error.h"
#include "core/parse.h"
#include "core/platform/run_context.h"
#include "vision/nn/attention_cpu.h"
#include "vision/nn/cpu_simd.h"
#include "vision/nn/gelu_cpu.h"

namespace moh::bench {

namespace {

namespace simd = nn::simd;

// One case of a (shape, dtype, op) group: `setup` (untimed) before each timed `run`.
struct Case {
  std::string impl;
  std::function<void()> setup, run;
  simd::Isa isa = simd::Isa::avx512;  // the cap while it runs (the toolkit's variants)
};

// Each case `runs` times after `warmup`, round-robin; median milliseconds of each.
std::vector<double> time_cases(std::vector<Case>& cases, int warmup, int runs) {
  std::vector<std::vector<double>> ms(cases.size());
  for (int r = 0; r < warmup + runs; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const simd::IsaCap cap(cases[i].isa);
      if (cases[i].setup) cases[i].setup();
      const auto t0 = std::chrono::steady_clock::now();
      cases[i].run();
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r >= warmup) ms[i].push_back(dt);
    }
  std::vector<double> out;
  for (const auto& v : ms) out.push_back(median(v));
  return out;
}

// The toolkit's variants this CPU runs, widest first.
std::vector<simd::Isa> own_variants() {
  std::vector<simd::Isa> out;
  for (int i = static_cast<int>(simd::isa()); i >= 0; --i) out.push_back(static_cast<simd::Isa>(i));
  return out;
}

// q, k, v as the models pass them: (B, h, N, d) views of one (B, N, 3, h, d) product.
struct Qkv {
  at::Tensor q, k, v;
  double scale = 1;
};
Qkv make_qkv(const KernelShape& s, at::ScalarType type) {
  const at::Tensor qkv = at::randn({s.batch, s.tokens, 3, s.heads, s.head_dim}).to(type);
  Qkv o;
  o.q = qkv.select(2, 0).transpose(1, 2), o.k = qkv.select(2, 1).transpose(1, 2),
  o.v = qkv.select(2, 2).transpose(1, 2);
  o.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  return o;
}

// LibTorch's own attention for the same operands: 2.x's flash attention for CPUs, forward and backward; 1.13 the
// plain composition (what it runs without the toolkit's kernel), its backward through autograd.
void add_libtorch_attention(const Qkv& x, const at::Tensor& dout, std::vector<Case>& fwd, std::vector<Case>& bwd) {
#if TORCH_VERSION_MAJOR >= 2
  auto out = std::make_shared<std::tuple<at::Tensor, at::Tensor>>(
      at::_scaled_dot_product_flash_attention_for_cpu(x.q, x.k, x.v, 0.0, false, {}, x.scale));
  fwd.push_back({"LibTorch flash", {}, [x] {
                   (void)at::_scaled_dot_product_flash_attention_for_cpu(x.q, x.k, x.v, 0.0, false, {}, x.scale);
                 }});
  bwd.push_back({"LibTorch flash", {}, [x, out, dout] {
                   (void)at::_scaled_dot_product_flash_attention_for_cpu_backward(
                       dout, x.q, x.k, x.v, std::get<0>(*out), std::get<1>(*out), 0.0, false, {}, x.scale);
                 }});
#else
  auto plain = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
    return at::matmul(at::softmax(at::matmul(q * scale, k.transpose(-2, -1)), -1), v);
  };
  fwd.push_back({"LibTorch plain", {}, [x, plain] {
                   torch::NoGradGuard no_grad;
                   (void)plain(x.q, x.k, x.v, x.scale);
                 }});
  auto graph = std::make_shared<std::vector<torch::Tensor>>();
  bwd.push_back({"LibTorch plain",
                 [x, plain, graph] {
                   *graph = {x.q.detach().requires_grad_(true), x.k.detach().requires_grad_(true),
                             x.v.detach().requires_grad_(true)};
                   graph->push_back(plain((*graph)[0], (*graph)[1], (*graph)[2], x.scale));
                 },
                 [graph, dout] {
                   (void)torch::autograd::grad({(*graph)[3]}, {(*graph)[0], (*graph)[1], (*graph)[2]}, {dout});
                 }});
#endif
}

void attention_cases(const KernelShape& s, at::ScalarType type, std::vector<Case>& fwd, std::vector<Case>& bwd) {
  const Qkv x = make_qkv(s, type);
  const at::Tensor dout = at::randn({s.batch, s.heads, s.tokens, s.head_dim}).to(type);
  add_libtorch_attention(x, dout, fwd, bwd);
  const auto lse = std::make_shared<at::Tensor>(nn::attention_cpu_forward(x.q, x.k, x.v, x.scale).lse);
  for (const simd::Isa isa : own_variants()) {
    const std::string impl = std::string("moh ") + simd::isa_name(isa);
    fwd.push_back({impl, {}, [x] { (void)nn::attention_cpu_forward(x.q, x.k, x.v, x.scale); }, isa});
    bwd.push_back(
        {impl, {}, [x, dout, lse] { (void)nn::attention_cpu_backward(dout, x.q, x.k, x.v, *lse, x.scale); }, isa});
  }
}

void gelu_cases(const KernelShape& s, at::ScalarType type, std::vector<Case>& fwd, std::vector<Case>& bwd) {
  const at::Tensor z = (at::randn({s.batch * s.tokens, 4 * s.heads * s.head_dim}) * 2).to(type);
  const at::Tensor dy = at::randn(z.sizes()).to(type);
  fwd.push_back({"LibTorch", {}, [z] { (void)at::gelu(z, "tanh"); }});
  bwd.push_back({"LibTorch", {}, [z, dy] { (void)at::gelu_backward(dy, z, "tanh"); }});
  for (const simd::Isa isa : own_variants()) {
    const std::string impl = std::string("moh ") + simd::isa_name(isa);
    fwd.push_back({impl, {}, [z] { (void)nn::gelu_tanh_cpu_forward(z); }, isa});
    bwd.push_back({impl, {}, [z, dy] { (void)nn::gelu_tanh_cpu_backward(dy, z); }, isa});
  }
}

// Times one group of cases and appends its rows (the first case is LibTorch's: every ratio is against it).
void measure(const std::string& op, const KernelShape& s, const std::string& dtype, std::vector<Case>& cases,
             const KernelBenchOptions& o, bool log, std::vector<KernelBenchRow>& rows) {
  const std::vector<double> ms = time_cases(cases, o.warmup, o.runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    KernelBenchRow r{op, s.name, dtype, cases[i].impl, ms[i], ms[i] > 0 ? ms[0] / ms[i] : 0.0, 0.0, ""};
    if (log) {
      std::printf("%-19s %-28s %-5s %-16s %9.3f ms  LibTorch/this %.2f\n", r.op.c_str(), r.shape.c_str(),
                  r.dtype.c_str(), r.impl.c_str(), r.ms, r.ratio);
      std::fflush(stdout);
    }
    rows.push_back(r);
  }
}

// The roofline's ceilings on this machine and LibTorch: the rate of a 2048³ product (what `moh bench train` takes as
// the peak of MFU) in fp32 and, where the CPU has native bf16 products, bf16 (without, LibTorch's bf16 product is a
// scalar fallback: minutes for one product), and the bandwidth of a 256 MiB copy (bytes read + written per second).
void measure_peaks(const KernelBenchOptions& o, bool log, std::vector<KernelBenchRow>& rows) {
  constexpr int64_t kGemm = 2048, kCopyFloats = int64_t{64} << 20;
  for (const std::string& dtype : o.dtypes) {
    if (dtype == "bf16" && !cpu_has_native_bf16()) continue;
    const at::ScalarType type = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    const at::Tensor a = at::randn({kGemm, kGemm}).to(type), b = at::randn({kGemm, kGemm}).to(type);
    std::vector<Case> gemm{{"LibTorch mm", {}, [a, b] { (void)at::mm(a, b); }}};
    const double ms = time_cases(gemm, 1, std::max(3, o.runs / 3))[0];
    rows.push_back({"peak", "2048x2048x2048 product", dtype, "LibTorch mm", ms, 1.0,
                    2.0 * kGemm * kGemm * kGemm / (ms * 1e6), "GFLOP/s"});
  }
  const at::Tensor src = at::randn({kCopyFloats}), dst = at::empty({kCopyFloats});
  std::vector<Case> copy{{"LibTorch copy_", {}, [src, dst]() mutable { dst.copy_(src); }}};
  const double ms = time_cases(copy, 1, o.runs)[0];
  rows.push_back(
      {"peak", "256 MiB copy", "fp32", "LibTorch copy_", ms, 1.0, 2.0 * 4 * kCopyFloats / (ms * 1e6), "GB/s"});
  if (log)
    for (const KernelBenchRow& r : rows)
      if (r.op == "peak")
        std::printf("%-19s %-28s %-5s %-16s %9.3f ms  %.1f %s\n", r.op.c_str(), r.shape.c_str(), r.dtype.c_str(),
                    r.impl.c_str(), r.ms, r.rate, r.unit.c_str());
}

std::vector<KernelShape> default_shapes() {
  return {{32, 196, 4, 16, "MoH-DiT-Pixel/2 batch 32"}, {8, 256, 6, 64, "DiT-S/2 batch 8 (32x32x4)"}};
}

// "B:N:h:d" → a shape named after its numbers.
KernelShape parse_shape(const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ':');) {
    const std::optional<int64_t> x = parse_int(item);
    if (!x || *x < 1) v.clear();
    if (!x || *x < 1) break;
    v.push_back(*x);
  }
  if (v.size() != 4 || v[3] > nn::kMaxHeadDim)
    throw UserError("--shapes", "expected batch:tokens:heads:head_dim, got \"" + text + "\"",
                    "e.g. 32:196:4:16 (positive, head_dim <= " + std::to_string(nn::kMaxHeadDim) + ")");
  return {v[0], v[1], v[2], v[3],
          "B" + std::to_string(v[0]) + " N" + std::to_string(v[1]) + " h" + std::to_string(v[2]) + " d" +
              std::to_string(v[3])};
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

std::vector<KernelBenchRow> run_kernel_bench(const KernelBenchOptions& o, bool log) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  std::vector<KernelBenchRow> rows;
  if (std::find(o.ops.begin(), o.ops.end(), "peak") != o.ops.end()) measure_peaks(o, log, rows);
  for (const KernelShape& s : o.shapes.empty() ? default_shapes() : o.shapes)
    for (const std::string& dtype : o.dtypes)
      for (const std::string& op : o.ops) {
        if (op == "peak") continue;
        torch::manual_seed(0);
        const at::ScalarType type = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
        std::vector<Case> fwd, bwd;
        if (op == "attention")
          attention_cases(s, type, fwd, bwd);
        else
          gelu_cases(s, type, fwd, bwd);
        measure(op + " forward", s, dtype, fwd, o, log, rows);
        measure(op + " backward", s, dtype, bwd, o, log, rows);
      }
  return rows;
}

int kernel_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0],
                        "The toolkit's CPU kernels (each instruction-set variant this CPU runs) against LibTorch's op "
                        "for the same work: median ms, interleaved");
  opts.add_options()("json", "print rows as a JSON list")(
      "shapes", "attention shapes batch:tokens:heads:head_dim (default: 32:196:4:16 and 8:256:6:64)",
      cxxopts::value<std::string>()->default_value(""))("dtypes", "fp32,bf16",
                                                        cxxopts::value<std::string>()->default_value("fp32,bf16"))(
      "ops", "attention,gelu,peak (peak: a 2048^3 product and a 256 MiB copy, the roofline's ceilings)",
      cxxopts::value<std::string>()->default_value("attention,gelu"))("runs", "timed runs (median)",
                                                                      cxxopts::value<int>()->default_value("9"))(
      "warmup", "untimed runs first", cxxopts::value<int>()->default_value("2"))(
      "threads", "intra-op threads (0 = LibTorch default)", cxxopts::value<int>()->default_value("0"));
  cxxopts::ParseResult args;
  if (!parse_bench_flags(opts, argc, argv, args)) return 0;
  KernelBenchOptions o;
  for (const std::string& s : split(args["shapes"].as<std::string>())) o.shapes.push_back(parse_shape(s));
  o.dtypes = split(args["dtypes"].as<std::string>());
  for (const std::string& d : o.dtypes)
    if (d != "fp32" && d != "bf16") throw UserError("--dtypes", "unknown dtype \"" + d + "\"", "fp32 or bf16");
  o.ops = split(args["ops"].as<std::string>());
  for (const std::string& op : o.ops)
    if (op != "attention" && op != "gelu" && op != "peak")
      throw UserError("--ops", "unknown op \"" + op + "\"", "attention, gelu or peak");
  o.runs = args["runs"].as<int>(), o.warmup = args["warmup"].as<int>(), o.threads = args["threads"].as<int>();
  if (o.runs < 1 || o.warmup < 0 || o.threads < 0)
    throw UserError(argv[0], "--runs must be >= 1, --warmup and --threads >= 0", "");
  const bool json = args.count("json") > 0;
  const std::vector<KernelBenchRow> rows = run_kernel_bench(o, !json);
  if (!json) return 0;
  nlohmann::json out = nlohmann::json::array();
  const nlohmann::json machine = machine_record();
  for (const KernelBenchRow& r : rows)
    out.push_back({{"op", r.op},
                   {"shape", r.shape},
                   {"dtype", r.dtype},
                   {"impl", r.impl},
                   {"ms", r.ms},
                   {"libtorch_over_this", r.ratio},
                   {"rate", r.rate},
                   {"unit", r.unit},
                   {"runs", o.runs},
                   {"machine", machine}});
  std::cout << out.dump(1) << "\n";
  return 0;
}

}  // namespace moh::bench
