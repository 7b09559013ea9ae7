#include "core/train/working_copies.h"

#include <torch/autograd.h>
#include <torch/version.h>

#include <atomic>

#include "core/platform/amp.h"

namespace moh {

namespace {

std::atomic<const WorkingCopies*> g_active{nullptr};

// The copy, as a function of the master: backward casts the gradient to the master's type (autocast's cast does).
struct ReadCopy : torch::autograd::Function<ReadCopy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& master, const at::Tensor& copy) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(master.scalar_type());
    return copy.alias();
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0].defined() ? grads[0].to(dtype) : at::Tensor(), at::Tensor()};
  }
};

bool autocast_in(const at::Tensor& w, at::ScalarType dtype) {
  const AutocastState a = AutocastState::current();
  if (w.is_cuda()) return a.cuda && a.cuda_dtype == dtype;
  if (w.is_cpu()) return a.cpu && a.cpu_dtype == dtype;
  return false;
}

}  // namespace

WorkingCopies::WorkingCopies(const std::vector<at::Tensor>& params, at::ScalarType dtype) : dtype_(dtype) {
  for (const at::Tensor& p : params) {
    if (!p.is_floating_point() || p.scalar_type() == dtype || !p.requires_grad()) continue;
    at::Tensor copy = at::empty_like(p, p.options().dtype(dtype));
    entries_[p.unsafeGetTensorImpl()] = Entry{p, copy, -1};
    masters_.push_back(p), copies_.push_back(copy);
  }
  refresh();
}

void WorkingCopies::refresh() {
  at::NoGradGuard no_grad;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  if (!copies_.empty()) at::_foreach_copy_(copies_, masters_);
#else
  for (size_t i = 0; i < copies_.size(); ++i) copies_[i].copy_(masters_[i]);
#endif
  for (auto& [impl, e] : entries_) e.version = static_cast<int64_t>(e.master._version());
}

at::Tensor WorkingCopies::get(const at::Tensor& p) const {
  const auto it = entries_.find(p.unsafeGetTensorImpl());
  if (it == entries_.end() || static_cast<int64_t>(p._version()) != it->second.version) return {};
  if (!at::GradMode::is_enabled() || !p.requires_grad()) return it->second.copy;
  return ReadCopy::apply(p, it->second.copy);
}

WorkingCopyScope::WorkingCopyScope(const WorkingCopies* copies) : prev_(g_active.exchange(copies)) {}

WorkingCopyScope::~WorkingCopyScope() {
  g_active.store(prev_);
}

at::Tensor working_weight(const at::Tensor& w) {
  const WorkingCopies* c = g_active.load();
  if (!c || !w.defined() || !autocast_in(w, c->dtype())) return w;
  at::Tensor copy = c->get(w);
  return copy.defined() ? copy : w;
}

}  // namespace moh
