#include "experiments/train_tasks.h"

#include <sstream>

#include "datasets/augment.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/objective.h"
#include "experiments/registry.h"
#include "experiments/repa_encoders.h"
#include "vision/classifier_trainer.h"
#include "vision/nn/fused_ops.h"
#include "vision/nn/head_surgery.h"

namespace moh::experiments {

namespace {

// Parameter names excluded from weight decay besides 1-D tensors (TransNeXt optimizer.py no_weight_decay_keywords).
const std::vector<std::string> kNoDecayKeywords{"query_embedding", "relative_pos_bias_local", "cpb", "temperature"};

class ClassifierTask : public TrainTask {
 public:
  std::vector<at::Tensor> take_head_load(torch::nn::Module& model) override { return nn::take_training_load(model); }
  ClassifierTask(const ExperimentConfig& cfg, const RunContext& ctx)
      : cfg_(cfg),
        ctx_(ctx),
        options_(classifier_options_for(cfg)),
        train_(cfg, options_, true),
        val_(cfg, options_, false),
        mixup_(mixup_for(cfg, options_)) {}

  std::shared_ptr<torch::nn::Module> build_model() override { return vision::TransNeXt(options_).ptr(); }
  std::string describe() const override {
    std::ostringstream s;
    s << cfg_.model.name << ": " << options_.active_ratio() * 100 << " % active heads";
    return s.str();
  }
  bool decays(const std::string& name, const at::Tensor& p) const override {
    if (p.dim() <= 1) return false;
    for (const auto& k : kNoDecayKeywords)
      if (name.find(k) != std::string::npos) return false;
    return true;
  }
  bool per_rank_rng() const override { return true; }  // drop path draws differ per rank
  bool working_copies() const override { return nn::use_fused_ops(cfg_.model.fused, ctx_.device); }
  std::unique_ptr<BatchStream> train_batches(int64_t epoch, int rank, int world, int64_t start_batch) const override {
    return train_.epoch(epoch, cfg_.data.batch_size / world, /*train=*/true, start_batch, true, rank, world);
  }
  int64_t train_examples() const override { return train_.size(); }
  LossTensors backward(torch::nn::Module& model, at::Tensor x, at::Tensor y, const StepInfo& at,
                       const GradScaler& scaler) override {
    if (mixup_.enabled()) {  // one λ per batch, drawn from (seed, epoch, batch): the same after a resume
      datasets::AugRng rng(datasets::mix_seed(
          datasets::mix_seed(static_cast<uint64_t>(cfg_.train.seed) ^ 0x6d697875ull, static_cast<uint64_t>(at.epoch)),
          static_cast<uint64_t>(at.batch)));
      y = datasets::mixup_batch_(x, y, mixup_, rng);
    }
    vision::TransNeXt net(as_impl(model));
    return vision::classifier_backward(net, x.to(ctx_.device), y.to(ctx_.device), cfg_.train.accum_steps,
                                       cfg_.train.moh_loss_coeff, cfg_.train.label_smoothing, ctx_, scaler);
  }
  Scalars evaluate(const std::shared_ptr<torch::nn::Module>& model, dist::Group& group) override {
    vision::TransNeXt net(std::dynamic_pointer_cast<vision::TransNeXtImpl>(model));
    const EvalResult r = evaluate_sharded(net, val_, cfg_.data.eval_batch_size, ctx_, group);
    return {{"top1", r.top1}, {"top5", r.top5}, {"val_loss", r.loss}};
  }
  std::string eval_message(int64_t epoch, const Scalars& m, const Scalars& ema) const override {
    std::ostringstream s;
    char line[160];
    std::snprintf(line, sizeof line, "epoch %lld: top-1 %.2f %%, top-5 %.2f %%, val loss %.4f",
                  static_cast<long long>(epoch + 1), scalar(m, "top1"), scalar(m, "top5"), scalar(m, "val_loss"));
    s << line;
    if (!ema.empty()) {
      std::snprintf(line, sizeof line, "; EMA top-1 %.2f %%", scalar(ema, "top1"));
      s << line;
    }
    return s.str();
  }

 private:
  static std::shared_ptr<vision::TransNeXtImpl> as_impl(torch::nn::Module& m) {
    return std::dynamic_pointer_cast<vision::TransNeXtImpl>(m.shared_from_this());
  }
  ExperimentConfig cfg_;
  RunContext ctx_;
  vision::TransNeXtOptions options_;
  ClassifierSplit train_, val_;
  datasets::MixupOptions mixup_;
};

class DiTTask : public TrainTask {
 public:
  std::vector<at::Tensor> take_head_load(torch::nn::Module& model) override { return nn::take_training_load(model); }
  DiTTask(const ExperimentConfig& cfg, const RunContext& ctx)
      : cfg_(cfg), ctx_(ctx), options_(dit_options_for(cfg)), data_(cfg, options_), process_(cfg.diffusion) {
    if (cfg.repa.encoder.empty()) return;
    encoder_ = make_repa_encoder(cfg, options_, ctx);
    options_ = with_repa_projectors(options_, cfg.repa, {encoder_.dim});
    repa_.targets = encoder_.targets;
    repa_.weight = cfg.repa.weight;
  }

  std::shared_ptr<torch::nn::Module> build_model() override { return diffusion::DiT(options_).ptr(); }
  std::string describe() const override {
    std::ostringstream s;
    s << cfg_.model.name << ": " << options_.active_ratio() * 100 << " % active heads";
    if (options_.overlap_output) s << ", overlapping output windows";
    if (repa_.enabled())
      s << "; REPA: block " << cfg_.repa.depth << " aligned to " << encoder_.description << " (sha256 "
        << encoder_.weights_sha256.substr(0, 12) << "), weight " << cfg_.repa.weight;
    return s.str();
  }
  // One common generator on every rank: the step's draws are made for the global batch (diffusion_backward).
  bool per_rank_rng() const override { return false; }
  bool working_copies() const override { return nn::use_fused_ops(cfg_.model.fused, ctx_.device); }
  std::unique_ptr<BatchStream> train_batches(int64_t epoch, int rank, int world, int64_t start_batch) const override {
    return data_.epoch(epoch, rank, world, start_batch);
  }
  int64_t train_examples() const override { return data_.size(); }
  LossTensors backward(torch::nn::Module& model, at::Tensor data, at::Tensor y, const StepInfo& info,
                       const GradScaler& scaler) override {
    diffusion::DiT net(std::dynamic_pointer_cast<diffusion::DiTImpl>(model.shared_from_this()));
    const double beta = cfg_.train.moh_loss_coeff;
    diffusion::RepaTerm repa = repa_;
    repa.images = info.side;  // a latent batch's clean images (DiTTrainData loads them for REPA); else undefined
    return diffusion::objective_record(cfg_.diffusion.objective)
        .train_step(net, process_, data.to(ctx_.device), y.to(ctx_.device), beta, ctx_, scaler, ctx_.rank, ctx_.world,
                    repa);
  }

 private:
  ExperimentConfig cfg_;
  RunContext ctx_;
  diffusion::DiTOptions options_;
  DiTTrainData data_;
  diffusion::TrainingProcess process_;  // what the objective's training step draws from
  RepaEncoder encoder_;                 // train.repa
  diffusion::RepaTerm repa_;            // off unless train.repa.encoder
};

}  // namespace

LoopConfig loop_config(const ExperimentConfig& cfg) {
  LoopConfig l;
  l.name = cfg.name;
  l.yaml = to_yaml(cfg);
  l.batch_size = cfg.data.batch_size;
  l.optim = cfg.optim;
  l.schedule = cfg.schedule;
  l.train = cfg.train;
  l.log = cfg.log;
  l.weights = {cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing};
  const ModelFamily& family = experiment_family(cfg);
  l.fixed_on_resume = family.fixed_on_resume;
  l.guarded_on_resume = family.guarded_on_resume;
  const auto& data = data_keys_guarded_on_resume();
  l.guarded_on_resume.insert(l.guarded_on_resume.end(), data.begin(), data.end());
  return l;
}

std::unique_ptr<TrainTask> make_classifier_task(const ExperimentConfig& cfg, const RunContext& ctx) {
  return std::make_unique<ClassifierTask>(cfg, ctx);
}

std::unique_ptr<TrainTask> make_dit_task(const ExperimentConfig& cfg, const RunContext& ctx) {
  return std::make_unique<DiTTask>(cfg, ctx);
}

}  // namespace moh::experiments
