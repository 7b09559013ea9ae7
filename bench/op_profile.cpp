#include "bench/op_profile.h"

#include <ATen/record_function.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

// Kineto (the recorder behind torch.profiler) is in the LibTorch 2.x wheels; Debian's 1.13 is built without it.
#if TORCH_VERSION_MAJOR >= 2 && __has_include(<torch/csrc/autograd/profiler_kineto.h>)
#include <torch/csrc/autograd/profiler_kineto.h>
#define MOH_HAS_KINETO 1
#endif

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
  const auto in = fn.inputs();
  auto sizes = [&](size_t i) -> at::IntArrayRef { return in[i].toTensor().sizes(); };
  auto is_tensor = [&](size_t i) { return i < in.size() && in[i].isTensor(); };
  // Attention cores, fused (LibTorch 2.x's kernels, the toolkit's own loops: vision/nn/attention_cpu.h): q (B, H, N,
  // d), k (B, H, M, d): the model's products, QKᵀ and AV = 4·B·H·N·M·d forward and twice that backward (dQ, dK, dV,
  // dP), as the plain path's products count; the backward's recomputed QKᵀ is not model work.
  const bool own_attention = !std::strncmp(name, "moh::attention_cpu_", 19);
  const bool sdpa = !std::strncmp(name, "aten::_scaled_dot_product_", 26) && std::strstr(name, "math") == nullptr &&
                    (std::strstr(name, "flash") || std::strstr(name, "efficient") || std::strstr(name, "cudnn"));
  const bool backward = std::strstr(name, "backward") != nullptr;
  const size_t key = sdpa && backward ? 2 : 1;  // LibTorch's backward kernels take (grad_out, query, key, ...)
  if ((own_attention || sdpa) && is_tensor(key)) {
    const at::IntArrayRef q = sizes(0), k = sizes(key);
    const double fwd = 4.0 * numel(q) * static_cast<double>(k[k.size() - 2]);
    return backward ? 2.0 * fwd : fwd;
  }
  if (std::strncmp(name, "aten::", 6) != 0) return 0;
  name += 6;
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

// ---- op classes ----------------------------------------------------------------------------------------------------

namespace {

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// The class a `moh::` user scope stands for ("" for anything else).
std::string scope_class(const std::string& name) {
  if (name == "moh::router") return "router";
  if (name == "moh::optimizer" || name == "moh::clip_grad") return "optimizer";
  if (name == "moh::ema") return "ema";
  if (name == "moh::attention") return "attention";
  return "";
}

bool attention_op(const std::string& n) {
  return contains(n, "scaled_dot_product") || contains(n, "flash_attention") || contains(n, "efficient_attention") ||
         contains(n, "cudnn_attention") || contains(n, "moh::attention_cpu_");
}

// The class an operator's own name says ("" when it says nothing: elementwise unless a caller says more).
std::string name_class(const std::string& full) {
  static const std::set<std::string> gemm{"mm",           "addmm",
                                          "bmm",          "baddbmm",
                                          "matmul",       "linear",
                                          "_scaled_mm",   "addmv",
                                          "mv",           "convolution",
                                          "_convolution", "cudnn_convolution",
                                          "conv2d",       "convolution_backward",
                                          "einsum"};
  static const std::set<std::string> copies{"copy_",      "_to_copy", "to",           "contiguous",       "clone",
                                            "cat",        "stack",    "index_select", "gather",           "scatter",
                                            "scatter_",   "index",    "index_put_",   "_index_put_impl_", "index_add_",
                                            "narrow_copy"};
  if (full.rfind("Memcpy", 0) == 0 || full.rfind("Memset", 0) == 0) return "copies";
  const std::string n = full.rfind("aten::", 0) == 0 ? full.substr(6) : full;
  if (gemm.count(n)) return "gemm";
  if (copies.count(n)) return "copies";
  return "";
}

// A kernel nobody claimed, by its own name (cuBLAS/cuBLASLt/CUTLASS products, flash kernels, multi-tensor applies).
std::string kernel_name_class(const std::string& n) {
  for (const char* g : {"gemm", "nvjet", "xmma", "cutlass", "cublas", "splitKreduce"})
    if (contains(n, g)) return "gemm";
  for (const char* a : {"flash", "fmha", "attention"})
    if (contains(n, a)) return "attention";
  if (contains(n, "multi_tensor_apply") || contains(n, "adam")) return "optimizer";
  const std::string c = name_class(n);
  return c.empty() ? "elementwise" : c;
}

// Scopes of every event: the innermost `moh::` scope up the parent chain; a backward function takes the scope of the
// forward operator of its sequence number (`by_seq`, when given).
std::vector<std::string> scopes_of(const std::vector<ProfileEvent>& ev, const std::map<int64_t, std::string>* by_seq) {
  std::vector<std::string> scope(ev.size());
  std::vector<char> done(ev.size(), 0);
  std::function<const std::string&(int64_t)> get = [&](int64_t i) -> const std::string& {
    if (done[i]) return scope[i];
    done[i] = 1;
    scope[i] = scope_class(ev[i].name);
    if (scope[i].empty() && by_seq && ev[i].backward && ev[i].seq >= 0)
      if (auto it = by_seq->find(ev[i].seq); it != by_seq->end()) scope[i] = it->second;
    if (scope[i].empty() && ev[i].parent >= 0) scope[i] = get(ev[i].parent);
    return scope[i];
  };
  for (size_t i = 0; i < ev.size(); ++i) get(static_cast<int64_t>(i));
  return scope;
}

// The class of operator i: its scope; else attention anywhere up the chain; else the first product or copy from i up.
std::string op_class(const std::vector<ProfileEvent>& ev, const std::vector<std::string>& scope, int64_t i) {
  if (!scope[i].empty()) return scope[i];
  for (int64_t j = i; j >= 0; j = ev[j].parent)
    if (attention_op(ev[j].name)) return "attention";
  for (int64_t j = i; j >= 0; j = ev[j].parent)
    if (const std::string c = name_class(ev[j].name); !c.empty()) return c;
  return "elementwise";
}

// Length of the union of the kernels' intervals (kernels of several streams may overlap).
double union_ms(std::vector<std::pair<int64_t, int64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  double ns = 0;
  int64_t lo = 0, hi = -1;
  for (const auto& [s, e] : spans) {
    if (s > hi) {
      ns += static_cast<double>(std::max<int64_t>(hi - lo, 0));
      lo = s, hi = e;
    } else {
      hi = std::max(hi, e);
    }
  }
  ns += static_cast<double>(std::max<int64_t>(hi - lo, 0));
  return ns / 1e6;
}

std::vector<OpTime> sorted_rows(const std::map<std::string, OpTime>& rows) {
  std::vector<OpTime> out;
  for (const auto& [name, r] : rows) out.push_back(r), out.back().name = name;
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return out;
}

}  // namespace

ClassProfile classify_profile(const std::vector<ProfileEvent>& ev) {
  std::map<int64_t, std::string> by_seq;  // forward operators in a scope, by sequence number (the last one started)
  const std::vector<std::string> first = scopes_of(ev, nullptr);
  for (size_t i = 0; i < ev.size(); ++i)
    if (!ev[i].kernel && !ev[i].backward && ev[i].seq >= 0 && !first[i].empty()) by_seq[ev[i].seq] = first[i];
  const std::vector<std::string> scope = scopes_of(ev, &by_seq);

  ClassProfile p;
  std::map<std::string, OpTime> rows;
  std::vector<double> child_ns(ev.size(), 0.0);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& e : ev)
    if (e.kernel)
      spans.emplace_back(e.start_ns, e.end_ns);
    else if (e.parent >= 0)
      child_ns[e.parent] += static_cast<double>(e.end_ns - e.start_ns);
  p.device = !spans.empty();
  for (size_t i = 0; i < ev.size(); ++i) {
    const ProfileEvent& e = ev[i];
    if (e.kernel != p.device) continue;  // a device profile counts kernels; a host profile operators' self time
    const double ms = p.device ? static_cast<double>(e.end_ns - e.start_ns) / 1e6
                               : (static_cast<double>(e.end_ns - e.start_ns) - child_ns[i]) / 1e6;
    const std::string cls =
        e.kernel && e.launched_by < 0 ? kernel_name_class(e.name) : op_class(ev, scope, e.kernel ? e.launched_by : i);
    p.ms[cls] += ms;
    OpTime& row = rows[e.kernel && e.launched_by >= 0 ? ev[e.launched_by].name : e.name];
    row.self_ms += ms, ++row.calls;
  }
  if (p.device) {
    int64_t lo = spans.front().first, hi = spans.front().second;
    for (const auto& [s, t] : spans) lo = std::min(lo, s), hi = std::max(hi, t);
    p.busy_ms = union_ms(spans);
    p.span_ms = static_cast<double>(hi - lo) / 1e6;
    p.ms["idle"] = p.span_ms - p.busy_ms;
  }
  p.ops = sorted_rows(rows);
  return p;
}

// ---- recording -----------------------------------------------------------------------------------------------------

namespace {

// RecordFunction recorder: one event per operator or scope, parents from a per-thread stack of open events.
std::mutex g_ev_mu;
std::vector<ProfileEvent> g_events;
thread_local std::vector<int64_t> t_open;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct EventContext : at::ObserverContext {
  explicit EventContext(int64_t i) : index(i) {}
  int64_t index;
};

std::unique_ptr<at::ObserverContext> event_start(const at::RecordFunction& fn) {
  ProfileEvent e;
  e.name = fn.name();
  e.thread = std::hash<std::thread::id>()(std::this_thread::get_id());
  e.seq = fn.seqNr();
  e.backward = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  e.parent = t_open.empty() ? -1 : t_open.back();
  e.start_ns = now_ns();
  int64_t index;
  {
    std::lock_guard<std::mutex> lock(g_ev_mu);
    index = static_cast<int64_t>(g_events.size());
    g_events.push_back(std::move(e));
  }
  t_open.push_back(index);
  return std::make_unique<EventContext>(index);
}

void event_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  const int64_t index = static_cast<EventContext*>(ctx)->index;
  const int64_t t = now_ns();
  {
    std::lock_guard<std::mutex> lock(g_ev_mu);
    g_events[index].end_ns = t;
  }
  if (!t_open.empty() && t_open.back() == index) t_open.pop_back();
}

#if defined(MOH_HAS_KINETO)
namespace tp = torch::autograd::profiler;
namespace tpi = torch::profiler::impl;

std::set<tpi::ActivityType> activities(bool cuda) {
  std::set<tpi::ActivityType> a{tpi::ActivityType::CPU};
  if (cuda) a.insert(tpi::ActivityType::CUDA);
  return a;
}

// Parents of host events from their intervals on each thread (Kineto reports intervals, not a call stack).
void nest_by_interval(std::vector<ProfileEvent>& ev) {
  std::vector<int64_t> order;
  for (size_t i = 0; i < ev.size(); ++i)
    if (!ev[i].kernel) order.push_back(static_cast<int64_t>(i));
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::make_tuple(ev[a].thread, ev[a].start_ns, -ev[a].end_ns) <
           std::make_tuple(ev[b].thread, ev[b].start_ns, -ev[b].end_ns);
  });
  std::vector<int64_t> open;
  for (int64_t i : order) {
    while (!open.empty() && (ev[open.back()].thread != ev[i].thread || ev[open.back()].end_ns < ev[i].end_ns))
      open.pop_back();
    ev[i].parent = open.empty() ? -1 : open.back();
    open.push_back(i);
  }
}

std::vector<ProfileEvent> kineto_events(const tp::ProfilerResult& result) {
  std::vector<ProfileEvent> ev;
  std::map<uint64_t, int64_t> by_correlation;  // host operator of each correlation id
  std::vector<std::pair<size_t, uint64_t>> kernels;
  for (const tp::KinetoEvent& k : result.events()) {
    ProfileEvent e;
    e.name = k.name();
    e.start_ns = static_cast<int64_t>(k.startNs());
    e.end_ns = static_cast<int64_t>(k.endNs());
    e.kernel = k.deviceType() != c10::DeviceType::CPU;
    if (e.kernel && e.name.rfind("moh::", 0) == 0) continue;  // a scope's span on the GPU timeline, not a kernel
    if (!e.kernel && e.name.rfind("cuda", 0) == 0) continue;  // runtime API calls (cudaLaunchKernel, ...)
    e.thread = k.startThreadId();
    e.seq = k.sequenceNr();
    e.backward = k.scope() == static_cast<uint8_t>(at::RecordScope::BACKWARD_FUNCTION);
    if (e.kernel)
      kernels.emplace_back(ev.size(), k.linkedCorrelationId());
    else if (k.correlationId() != 0)
      by_correlation[k.correlationId()] = static_cast<int64_t>(ev.size());
    ev.push_back(std::move(e));
  }
  for (const auto& [i, corr] : kernels)
    if (auto it = by_correlation.find(corr); it != by_correlation.end()) ev[i].launched_by = it->second;
  nest_by_interval(ev);
  return ev;
}
#endif

}  // namespace

StepProfiler::StepProfiler(bool cuda) : cuda_(cuda) {
#if defined(MOH_HAS_KINETO)
  kineto_ = cuda;  // host-only profiles take the same recorder in every build
#endif
}

StepProfiler::~StepProfiler() {
  if (running_) (void)stop();
}

void StepProfiler::start() {
  running_ = true;
#if defined(MOH_HAS_KINETO)
  if (kineto_) {
    const tpi::ProfilerConfig config(tpi::ProfilerState::KINETO);
    tp::prepareProfiler(config, activities(cuda_));
    tp::enableProfiler(config, activities(cuda_));
    return;
  }
#endif
  {
    std::lock_guard<std::mutex> lock(g_ev_mu);
    g_events.clear();
  }
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(event_start, event_end));
}

std::vector<ProfileEvent> StepProfiler::stop() {
  running_ = false;
#if defined(MOH_HAS_KINETO)
  if (kineto_) return kineto_events(*tp::disableProfiler());
#endif
  at::removeCallback(handle_);
  std::lock_guard<std::mutex> lock(g_ev_mu);
  return std::exchange(g_events, {});
}

}  // namespace moh::bench
