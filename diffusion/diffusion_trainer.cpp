#include "diffusion/diffusion_trainer.h"

namespace moh::diffusion {

DiffusionDraws draw_training_noise(const std::vector<int64_t>& local_shape, const TimeDraw& draw_t, double drop_prob,
                                   int rank, int world, const c10::Device& device) {
  const int64_t B = local_shape.at(0), G = B * world;  // local and global batch
  auto mine = [&](const at::Tensor& global) {
    return (world == 1 ? global : global.slice(0, rank, G, world)).to(device);
  };
  std::vector<int64_t> shape = local_shape;
  shape[0] = G;
  DiffusionDraws d;
  d.t = mine(draw_t(G));                                                    // (B)
  d.noise = mine(at::randn(shape, at::kFloat));                             // (B, C, H, W)
  if (drop_prob > 0) d.drop = mine(at::rand({G}, at::kFloat) < drop_prob);  // DiT's token_drop, drawn here
  return d;
}

DiffusionDraws draw_training_noise(const std::vector<int64_t>& local_shape, int64_t num_steps, double drop_prob,
                                   int rank, int world, const c10::Device& device) {
  const TimeDraw draw = [num_steps](int64_t G) { return at::randint(0, num_steps, {G}, at::kLong); };
  return draw_training_noise(local_shape, draw, drop_prob, rank, world, device);
}

TimeDraw flow_time_draw(const FlowProcess& flow) {
  return [flow](int64_t G) {
    return flow.training_times(flow.normal_draws() ? at::randn({G}, at::kFloat) : at::rand({G}, at::kFloat));
  };
}

namespace {

// The model's output under autocast (bf16/fp16 forward; the losses are computed in fp32 by the caller).
DiTOutput forward_autocast(DiT& model, const at::Tensor& xt, const at::Tensor& t, const at::Tensor& y,
                           const DiffusionDraws& d, const RunContext& ctx) {
  AutocastScope autocast(ctx);
  return model->forward(xt, t, y, d.drop);
}

// REPA's targets of the clean training images (the data itself in pixel space; the images beside a latent batch): the
// frozen encoder, without gradients, in the training precision.
std::vector<at::Tensor> repa_targets(const RepaTerm& repa, const at::Tensor& data, const RunContext& ctx) {
  if (!repa.enabled()) return {};
  torch::NoGradGuard no_grad;
  AutocastScope autocast(ctx);
  return {repa.targets(repa.images.defined() ? repa.images.to(data.device()) : data)};  // (B, T, D)
}

// loss + β·aux (+ λ·REPA), scaled backward; `r` gets the aux (and repa) terms beside the loss terms already in it.
LossTensors finish_backward(at::Tensor loss, const DiTOutput& out, double beta, const GradScaler& scaler, LossTensors r,
                            const RepaTerm& repa = {}, const std::vector<at::Tensor>& targets = {}) {
  const at::Tensor aux = out.aux_loss.defined() ? out.aux_loss.to(at::kFloat) : at::zeros({}, loss.options());
  r.emplace_back("aux", aux.detach());
  if (out.aux_loss.defined()) loss = loss + beta * aux;
  if (repa.enabled()) {
    if (out.zs.size() != targets.size()) throw std::logic_error("REPA: the model has no projector per encoder");
    const at::Tensor proj = repa_loss(out.zs, targets);
    r.emplace_back("repa", proj.detach());
    loss = loss + repa.weight * proj;
  }
  scaler.scale(loss).backward();
  return r;
}

}  // namespace

LossTensors diffusion_backward(DiT& model, const GaussianDiffusion& diffusion, const at::Tensor& data,
                               const at::Tensor& y, double beta, const RunContext& ctx, const GradScaler& scaler,
                               int rank, int world, const RepaTerm& repa) {
  const double p = model->is_training() ? model->y_embedder->dropout_prob : 0.0;
  const DiffusionDraws d =
      draw_training_noise(data.sizes().vec(), diffusion.num_steps(), p, rank, world, data.device());
  const std::vector<at::Tensor> targets = repa_targets(repa, data, ctx);
  const at::Tensor noise = d.noise.to(data.scalar_type());
  const at::Tensor xt = diffusion.q_sample(data, d.t, noise);
  const DiTOutput out = forward_autocast(model, xt, d.t, y, d, ctx);
  const GaussianDiffusion::Losses l = diffusion.training_losses(out.out.to(at::kFloat), data, xt, d.t, noise);
  const at::Tensor loss = l.loss.mean();
  return finish_backward(loss, out, beta, scaler,
                         {{"loss", loss.detach()}, {"mse", l.mse.mean().detach()}, {"vb", l.vb.mean().detach()}}, repa,
                         targets);
}

LossTensors flow_backward(DiT& model, const FlowProcess& flow, const at::Tensor& data, const at::Tensor& y, double beta,
                          const RunContext& ctx, const GradScaler& scaler, int rank, int world, const RepaTerm& repa) {
  const double p = model->is_training() ? model->y_embedder->dropout_prob : 0.0;
  const DiffusionDraws d = draw_training_noise(data.sizes().vec(), flow_time_draw(flow), p, rank, world, data.device());
  const std::vector<at::Tensor> targets = repa_targets(repa, data, ctx);
  const at::Tensor noise = d.noise.to(data.scalar_type()), t = d.t.to(data.scalar_type());
  const at::Tensor xt = flow.interpolate(data, noise, t).first;
  const DiTOutput out = forward_autocast(model, xt, t, y, d, ctx);
  const at::Tensor pred = out.out.to(at::kFloat).narrow(1, 0, data.size(1));  // (B, C, H, W)
  const FlowProcess::Losses l = flow.training_losses(pred, data.to(at::kFloat), noise.to(at::kFloat), t.to(at::kFloat));
  const at::Tensor loss = l.loss.mean();
  return finish_backward(
      loss, out, beta, scaler,
      {{"loss", loss.detach()}, {"mse", l.mse.mean().detach()}, {"cosine", l.cosine.mean().detach()}}, repa, targets);
}

}  // namespace moh::diffusion
