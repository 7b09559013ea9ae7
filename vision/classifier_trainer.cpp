#include "vision/classifier_trainer.h"

namespace moh::vision {

LossTensors classifier_backward(TransNeXt& model, const at::Tensor& x, const at::Tensor& y, int64_t accum, double beta,
                                double label_smoothing, const RunContext& ctx, const GradScaler& scaler) {
  at::Tensor task_sum = at::zeros({}, x.options().dtype(at::kDouble)), aux_sum = at::zeros_like(task_sum);
  const int64_t micro = x.size(0) / accum;
  for (int64_t a = 0; a < accum; ++a) {
    ClassifierOutput out;
    {
      AutocastScope autocast(ctx);  // bf16/fp16 forward; the loss is computed in fp32
      out = model->forward(x.narrow(0, a * micro, micro));
    }
    const at::Tensor target = y.narrow(0, a * micro, micro);  // class indices, or soft targets after Mixup
    at::Tensor loss = at::cross_entropy_loss(out.logits.to(at::kFloat), target, {}, at::Reduction::Mean, -100,
                                             target.is_floating_point() ? 0.0 : label_smoothing);
    task_sum += loss.detach();
    if (out.aux_loss.defined()) {
      aux_sum += out.aux_loss.detach();
      loss = loss + beta * out.aux_loss.to(at::kFloat);  // L = L_task + β · mean_layers(l_aux)
    }
    scaler.scale(loss / static_cast<double>(accum)).backward();
  }
  return {{"loss", task_sum / static_cast<double>(accum)}, {"aux", aux_sum / static_cast<double>(accum)}};
}

}  // namespace moh::vision
