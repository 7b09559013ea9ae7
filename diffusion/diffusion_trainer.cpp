#include "diffusion/diffusion_trainer.h"

namespace moh::diffusion {

DiffusionDraws draw_training_noise(const std::vector<int64_t>& local_shape, int64_t num_steps, double drop_prob,
                                   int rank, int world, const c10::Device& device) {
  const int64_t B = local_shape.at(0), G = B * world;  // local and global batch
  auto mine = [&](const at::Tensor& global) {
    return (world == 1 ? global : global.slice(0, rank, G, world)).to(device);
  };
  std::vector<int64_t> shape = local_shape;
  shape[0] = G;
  DiffusionDraws d;
  d.t = mine(at::randint(0, num_steps, {G}, at::kLong));                    // (B)
  d.noise = mine(at::randn(shape, at::kFloat));                             // (B, C, H, W)
  if (drop_prob > 0) d.drop = mine(at::rand({G}, at::kFloat) < drop_prob);  // DiT's token_drop, drawn here
  return d;
}

LossTensors diffusion_backward(DiT& model, const GaussianDiffusion& diffusion, const at::Tensor& x0,
                               const at::Tensor& y, double beta, const RunContext& ctx, const GradScaler& scaler,
                               int rank, int world) {
  const double p = model->is_training() ? model->y_embedder->dropout_prob : 0.0;
  const DiffusionDraws d = draw_training_noise(x0.sizes().vec(), diffusion.num_steps(), p, rank, world, x0.device());
  const at::Tensor &t = d.t, &drop = d.drop, noise = d.noise.to(x0.scalar_type());
  const at::Tensor xt = diffusion.q_sample(x0, t, noise);
  DiTOutput out;
  {
    AutocastScope autocast(ctx);  // bf16/fp16 forward; the losses below are fp32
    out = model->forward(xt, t, y, drop);
  }
  const GaussianDiffusion::Losses l = diffusion.training_losses(out.out.to(at::kFloat), x0, xt, t, noise);
  at::Tensor loss = l.loss.mean();
  const at::Tensor aux = out.aux_loss.defined() ? out.aux_loss.to(at::kFloat) : at::zeros({}, loss.options());
  LossTensors r{
      {"loss", loss.detach()}, {"mse", l.mse.mean().detach()}, {"vb", l.vb.mean().detach()}, {"aux", aux.detach()}};
  if (out.aux_loss.defined()) loss = loss + beta * aux;
  scaler.scale(loss).backward();
  return r;
}

}  // namespace moh::diffusion
