#include "core/train/step_guard.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <thread>

namespace moh {

at::Tensor finite_flag(const at::Tensor& loss, const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  at::Tensor ok = at::isfinite(loss.detach().to(at::kFloat)).all();
  if (!grads.empty()) {
    // A norm is finite exactly when every element is (an overflow of the sum to inf counts as non-finite too, as the
    // clip coefficient would be 0 there).
    const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
    const at::Tensor total = at::stack(norms).to(at::kFloat).sum();
    ok = at::logical_and(ok.to(total.device()), at::isfinite(total));
  }
  return ok.to(at::kFloat);
}

void DeferredFlag::put(const at::Tensor& value) {
  if (!value.is_cuda()) {
    host_ = value.detach().cpu();
    pending_ = true;
    return;
  }
  if (!host_.defined()) host_ = at::empty({}, at::TensorOptions().dtype(value.scalar_type()).pinned_memory(true));
  host_.copy_(value, /*non_blocking=*/true);
  auto* impl = c10::impl::getDeviceGuardImpl(value.device().type());
  const c10::Stream stream = impl->getStream(value.device());
  event_ = std::make_unique<c10::Event>(value.device().type());
  event_->record(stream);
  pending_ = true;
}

double DeferredFlag::take() {
  if (event_)
    while (!event_->query()) std::this_thread::yield();  // the copy was queued a step ago: normally done already
  pending_ = false;
  return host_.item<double>();
}

bool NonFiniteRun::record(bool finite, int64_t step) {
  if (finite) {
    in_a_row_ = 0;
    return false;
  }
  if (in_a_row_ == 0) first_ = step;
  last_ = step;
  ++in_a_row_;
  return max_ > 0 && in_a_row_ >= max_;
}

std::string NonFiniteRun::streak() const {
  const std::string where = first_ == last_ ? "batch " + std::to_string(first_ + 1)
                                            : "batches " + std::to_string(first_ + 1) + "–" + std::to_string(last_ + 1);
  return "non-finite loss or gradients in " + where + " of the run (" + std::to_string(in_a_row_) + " in a row)";
}

bool all_finite(const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flags;  // one per tensor, on its device; read back together
  for (const auto& t : tensors)
    if (t.defined() && t.is_floating_point() && t.numel() > 0) flags.push_back(at::isfinite(t).all().cpu());
  return flags.empty() || at::stack(flags).all().item<bool>();
}

}  // namespace moh
