#include "core/platform/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <tuple>

namespace moh {

at::ScalarType autocast_dtype(Precision p) {
  return p == Precision::fp16 ? at::kHalf : at::kBFloat16;
}

namespace {

// LibTorch 2.4 replaced the per-device autocast setters by ones taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool is_enabled(bool cuda) {
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
}
void set_enabled(bool cuda, bool on) {
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, on);
}
at::ScalarType get_dtype(bool cuda) {
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
}
void set_dtype(bool cuda, at::ScalarType t) {
  at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, t);
}
#else
bool is_enabled(bool cuda) {
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(bool cuda, bool on) {
  cuda ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
at::ScalarType get_dtype(bool cuda) {
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(bool cuda, at::ScalarType t) {
  cuda ? at::autocast::set_autocast_gpu_dtype(t) : at::autocast::set_autocast_cpu_dtype(t);
}
#endif
}  // namespace

bool autocasts(Precision p) {
  return p == Precision::bf16 || p == Precision::fp16;
}

AutocastScope::AutocastScope(const RunContext& ctx) {
  if (!autocasts(ctx.precision)) return;
  active_ = true;
  cuda_ = ctx.device.is_cuda();
  prev_enabled_ = is_enabled(cuda_);
  prev_dtype_ = get_dtype(cuda_);
  set_dtype(cuda_, autocast_dtype(ctx.precision));
  set_enabled(cuda_, true);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(cuda_, prev_enabled_);
  set_dtype(cuda_, prev_dtype_);
}

Tf32Scope::Tf32Scope(bool allow) {
  engage(allow);
}

Tf32Scope::Tf32Scope(Precision p) {
  if (p == Precision::tf32) engage(true);
}

void Tf32Scope::engage(bool allow) {
  active_ = true;
  std::tie(prev_cublas_, prev_cudnn_) = current();
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
}

Tf32Scope::~Tf32Scope() {
  if (!active_) return;
  at::globalContext().setAllowTF32CuBLAS(prev_cublas_);
  at::globalContext().setAllowTF32CuDNN(prev_cudnn_);
}

std::pair<bool, bool> Tf32Scope::current() {
  return {at::globalContext().allowTF32CuBLAS(), at::globalContext().allowTF32CuDNN()};
}

AutocastState AutocastState::current() {
  AutocastState s;
  s.cpu = is_enabled(false), s.cuda = is_enabled(true);
  s.cpu_dtype = get_dtype(false), s.cuda_dtype = get_dtype(true);
  return s;
}

namespace {
void apply(const AutocastState& s) {
  set_dtype(false, s.cpu_dtype), set_dtype(true, s.cuda_dtype);
  set_enabled(false, s.cpu), set_enabled(true, s.cuda);
}
}  // namespace

AutocastRestore::AutocastRestore(const AutocastState& state) : prev_(AutocastState::current()) {
  apply(state);
  nested_ = state.cpu || state.cuda;
  if (nested_) at::autocast::increment_nesting();
}

AutocastRestore::~AutocastRestore() {
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(prev_);
}

GradScaler::GradScaler(Precision precision) : enabled_(precision == Precision::fp16) {}

bool GradScaler::unscale_and_update(const std::vector<at::Tensor>& params) {
  if (!enabled_) return true;
  std::vector<at::Tensor> ok;  // one flag per gradient, read back with a single sync
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad();
    g.mul_(1.0 / scale_);
    ok.push_back(g.isfinite().all());
  }
  const bool finite = ok.empty() || at::stack(ok).all().item<bool>();
  if (!finite) {
    scale_ *= 0.5;
    growth_tracker_ = 0;
    return false;
  }
  if (++growth_tracker_ == 2000) {
    scale_ *= 2.0;
    growth_tracker_ = 0;
  }
  return true;
}

at::Tensor GradScaler::state() const {
  return at::tensor({scale_, static_cast<double>(growth_tracker_)}, at::kDouble);
}

void GradScaler::load_state(const at::Tensor& state) {
  if (state.numel() != 2) return;
  scale_ = state[0].item<double>();
  growth_tracker_ = static_cast<int64_t>(state[1].item<double>());
}

}  // namespace moh
