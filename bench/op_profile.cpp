#include "bench/op_profile.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace moh::bench {

namespace {

// ---- FLOPs ---------------------------------------------------------------------------------------------------------

std::atomic<uint64_t> g_flops{0};

double numel(at::IntArrayRef s) {
  double n = 1;
  for (int64_t v : s) n *= static_cast<double>(v);
  return n;
}

// FLOPs of one call, from its inputs; 0 for operators that are not counted.
double call_flops(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (std::strncmp(name, "aten::", 6) != 0) return 0;
  name += 6;
  const auto in = fn.inputs();
  auto sizes = [&](size_t i) -> at::IntArrayRef { return in[i].toTensor().sizes(); };
  auto is_tensor = [&](size_t i) { return i < in.size() && in[i].isTensor(); };
  if (!std::strcmp(name, "mm") && is_tensor(1)) {  // (m, k) @ (k, n)
    return 2.0 * numel(sizes(0)) * static_cast<double>(sizes(1)[1]);
  }
  if (!std::strcmp(name, "addmm") && is_tensor(2)) {  // bias + (m, k) @ (k, n)
    return 2.0 * numel(sizes(1)) * static_cast<double>(sizes(2)[1]);
  }
  if ((!std::strcmp(name, "bmm") && is_tensor(1)) || (!std::strcmp(name, "baddbmm") && is_tensor(2))) {
    const size_t a = name[0] == 'b' && name[1] == 'a' ? 1 : 0;  // (b, m, k) @ (b, k, n)
    return 2.0 * numel(sizes(a)) * static_cast<double>(sizes(a + 1)[2]);
  }
  if (!std::strcmp(name, "convolution") && is_tensor(1) && in.size() >= 9) {
    // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    const at::IntArrayRef x = sizes(0), w = sizes(1);
    const bool transposed = in[6].toBool();
    const double kernel = numel(w.slice(2));
    if (transposed) return 2.0 * numel(x) * static_cast<double>(w[1]) * kernel;  // every input pixel scatters
    const auto stride = in[3].toIntVector(), pad = in[4].toIntVector(), dil = in[5].toIntVector();
    double out_pixels = 1;
    for (size_t d = 0; d + 2 < x.size(); ++d) {
      const int64_t k = w[d + 2];
      out_pixels *= static_cast<double>((x[d + 2] + 2 * pad[d] - dil[d] * (k - 1) - 1) / stride[d] + 1);
    }
    return 2.0 * static_cast<double>(x[0]) * static_cast<double>(w[0]) * out_pixels * static_cast<double>(w[1]) *
           kernel;
  }
  // Fused attention kernels (LibTorch 2.x): q (B, H, N, d), k (B, H, M, d): QKᵀ and AV = 4·B·H·N·M·d; the backward
  // recomputes QKᵀ and runs four more products (2.5x).
  const bool sdpa = !std::strncmp(name, "_scaled_dot_product_", 20) && std::strstr(name, "math") == nullptr &&
                    (std::strstr(name, "flash") || std::strstr(name, "efficient") || std::strstr(name, "cudnn"));
  if (sdpa && is_tensor(1)) {
    const at::IntArrayRef q = sizes(0), k = sizes(1);
    const double fwd = 4.0 * numel(q) * static_cast<double>(k[k.size() - 2]);
    return std::strstr(name, "backward") ? 2.5 * fwd : fwd;
  }
  return 0;
}

std::unique_ptr<at::ObserverContext> flop_start(const at::RecordFunction& fn) {
  const double f = call_flops(fn);
  if (f > 0) g_flops.fetch_add(static_cast<uint64_t>(f), std::memory_order_relaxed);
  return nullptr;
}

// ---- self time -----------------------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
struct Frame {
  Clock::time_point start;
  double child_ms = 0;
};
thread_local std::vector<Frame> t_stack;
std::mutex g_mu;
std::unordered_map<std::string, OpTime> g_ops;

std::unique_ptr<at::ObserverContext> prof_start(const at::RecordFunction&) {
  t_stack.push_back({Clock::now(), 0.0});
  return nullptr;
}

void prof_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_stack.empty()) return;  // started before the profiler
  const Frame f = t_stack.back();
  t_stack.pop_back();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - f.start).count();
  if (!t_stack.empty()) t_stack.back().child_ms += ms;
  std::lock_guard<std::mutex> lock(g_mu);
  OpTime& row = g_ops[fn.name()];
  row.self_ms += ms - f.child_ms;
  ++row.calls;
}

}  // namespace

FlopCounter::FlopCounter() {
  g_flops = 0;
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(flop_start).needsInputs(true));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(handle_);
}

double FlopCounter::flops() const {
  return static_cast<double>(g_flops.load());
}

OpProfiler::OpProfiler() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_ops.clear();
  }
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(prof_start, prof_end));
}

OpProfiler::~OpProfiler() {
  at::removeCallback(handle_);
}

std::vector<OpTime> OpProfiler::table() const {
  std::vector<OpTime> rows;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& [name, row] : g_ops) {
      rows.push_back(row);
      rows.back().name = name;
    }
  }
  std::sort(rows.begin(), rows.end(), [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return rows;
}

}  // namespace moh::bench
