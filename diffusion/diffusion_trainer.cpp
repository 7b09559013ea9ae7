#include "diffusion/diffusion_trainer.h"

#include <sstream>

#include "vision/nn/head_surgery.h"

namespace moh::diffusion {

namespace {

class DiTTask : public TrainTask {
 public:
  std::vector<at::Tensor> take_head_load(torch::nn::Module& model) override { return nn::take_training_load(model); }
  DiTTask(const ExperimentConfig& cfg, const RunContext& ctx)
      : cfg_(cfg),
        ctx_(ctx),
        options_(dit_options_for(cfg)),
        data_(cfg, options_),
        diffusion_(GaussianDiffusion::base(cfg.diffusion.steps)) {}

  std::shared_ptr<torch::nn::Module> build_model() override { return DiT(options_).ptr(); }
  std::string describe() const override {
    std::ostringstream s;
    s << cfg_.model.name << ": " << options_.active_ratio() * 100 << " % active heads";
    return s.str();
  }
  // One common generator on every rank: the step's draws are made for the global batch (diffusion_backward).
  bool per_rank_rng() const override { return false; }
  std::unique_ptr<BatchStream> train_batches(int64_t epoch, int rank, int world, int64_t start_batch) const override {
    return data_.epoch(epoch, rank, world, start_batch);
  }
  int64_t train_examples() const override { return data_.size(); }
  LossTensors backward(torch::nn::Module& model, at::Tensor x0, at::Tensor y, const StepInfo&,
                       const GradScaler& scaler) override {
    DiT net(std::dynamic_pointer_cast<DiTImpl>(model.shared_from_this()));
    return diffusion_backward(net, diffusion_, x0.to(ctx_.device), y.to(ctx_.device), cfg_.train.moh_loss_coeff, ctx_,
                              scaler, ctx_.rank, ctx_.world);
  }

 private:
  ExperimentConfig cfg_;
  RunContext ctx_;
  DiTOptions options_;
  DiTTrainData data_;
  GaussianDiffusion diffusion_;
};

}  // namespace

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

std::unique_ptr<TrainTask> make_dit_task(const ExperimentConfig& cfg, const RunContext& ctx) {
  return std::make_unique<DiTTask>(cfg, ctx);
}

}  // namespace moh::diffusion
