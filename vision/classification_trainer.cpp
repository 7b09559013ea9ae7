#include "vision/classification_trainer.h"

#include "datasets/image_folder.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_io.h"
#include "core/amp.h"
#include "core/checkpoint.h"
#include "core/ema.h"
#include "core/error.h"
#include "core/progress.h"

namespace moh::vision {

namespace fs = std::filesystem;

namespace {
// Parameter names excluded from weight decay besides 1-D tensors (TransNeXt optimizer.py no_weight_decay_keywords).
const std::vector<std::string> kNoDecayKeywords{"query_embedding", "relative_pos_bias_local", "cpb", "temperature"};
constexpr double kPi = 3.14159265358979323846;

bool no_decay(const std::string& name, const at::Tensor& p) {
  if (p.dim() <= 1) return true;
  for (const auto& k : kNoDecayKeywords)
    if (name.find(k) != std::string::npos) return true;
  return false;
}
}  // namespace

TransNeXtOptions classifier_options_for(const ExperimentConfig& cfg) {
  TransNeXtOptions o = classifier_options(cfg.model.name);
  if (cfg.model.num_classes > 0) o.num_classes = cfg.model.num_classes;
  if (cfg.model.img_size > 0) o.img_size = cfg.model.img_size;
  if (cfg.model.drop_path >= 0) o.drop_path_rate = cfg.model.drop_path;
  if (!cfg.model.attention.empty()) {
    if (cfg.model.attention.size() != 4)
      throw UserError("config: model.attention", "expected 4 entries (one per stage), got " +
                                                     std::to_string(cfg.model.attention.size()), "e.g. [moh, moh, moh, moh]");
    const TransNeXtOptions base = o;
    for (int i = 0; i < 4; ++i) {
      o.attention[i] = cfg.model.attention[i];
      if (o.attention[i] == AttentionMode::moh && base.attention[i] != AttentionMode::moh)
        throw UserError("config: model.attention", "stage " + std::to_string(i + 1) + " of " + cfg.model.name +
                                                       " has no MoH head split", "use a MoH-ViT variant for moh stages");
      if (o.attention[i] == AttentionMode::moa && o.topk[i] == 0) o.topk[i] = std::max<int64_t>(1, o.num_heads[i] / 2);
    }
  }
  o.validate();
  return o;
}

double learning_rate_at(const ExperimentConfig& cfg, double t) {
  const double base = cfg.optim.lr;
  if (cfg.schedule.kind == LrSchedule::constant) return base;
  const double warm = cfg.schedule.warmup_epochs;
  if (t < warm) return cfg.schedule.warmup_lr + t * (base - cfg.schedule.warmup_lr) / warm;
  const double T = static_cast<double>(cfg.train.epochs);
  return cfg.schedule.min_lr + 0.5 * (base - cfg.schedule.min_lr) * (1.0 + std::cos(kPi * std::min(t, T) / T));
}

datasets::ImageSet load_split(const ExperimentConfig& cfg, bool train, int64_t channels) {
  datasets::ImageSet set;
  if (cfg.data.dataset == DatasetKind::fashion_mnist) {
    set = datasets::load_fashion_mnist(train ? "train" : "test",
                                       cfg.data.root.empty() ? datasets::kFashionMnistDir : cfg.data.root);
  } else {
    if (cfg.data.root.empty()) throw UserError("config: data.root", "image_folder needs a root", "<root>/{train,val}/<class>/*");
    const int64_t limit = train ? cfg.data.limit_train : cfg.data.limit_val;
    return datasets::load_image_folder(cfg.data.root, train ? "train" : "val", channels, 0,
                                       cfg.data.max_bad_fraction, nullptr, limit);
  }
  const int64_t limit = train ? cfg.data.limit_train : cfg.data.limit_val;
  if (limit > 0 && limit < set.size()) {
    set.images = set.images.narrow(0, 0, limit).contiguous();
    set.labels = set.labels.narrow(0, 0, limit).contiguous();
  }
  return set;
}

datasets::ClassifierTransform transform_for(const ExperimentConfig& cfg, const TransNeXtOptions& model) {
  datasets::ClassifierTransform tf;
  tf.size = model.img_size;
  tf.shift = cfg.data.shift;
  tf.hflip = cfg.data.hflip;
  return tf;
}

EvalResult evaluate_classifier(TransNeXt& model, const datasets::ImageSet& set, const datasets::ClassifierTransform& tf,
                               int64_t batch_size, const RunContext& ctx, HeadLoadStats* head_load) {
  torch::NoGradGuard ng;
  const bool was_training = model->is_training();
  model->eval();
  EvalResult r;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  datasets::EpochLoader loader(set, tf, batch_size, /*train=*/false, 0, 0, 0, /*drop_last=*/false);
  at::Tensor x, y;
  while (loader.next(x, y)) {
    x = x.to(ctx.device), y = y.to(ctx.device);
    ClassifierOutput out = model->forward(x);
    if (head_load) head_load->add(out.routed, y);
    const at::Tensor& logits = out.logits;
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    at::Tensor pred = std::get<1>(logits.topk(k, 1));  // (B, k)
    at::Tensor hit = pred.eq(y.unsqueeze(1));
    top1 += hit.narrow(1, 0, 1).sum().item<int64_t>();
    top5 += hit.any(1).sum().item<int64_t>();
    r.count += y.size(0);
  }
  model->train(was_training);
  if (r.count > 0) r.top1 = 100.0 * top1 / r.count, r.top5 = 100.0 * top5 / r.count, r.loss = loss_sum / r.count;
  return r;
}

TrainResult train_classifier(const ExperimentConfig& cfg, const TrainArgs& args) {
  const auto t_start = std::chrono::steady_clock::now();
  RunContext ctx = RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed));
  if (ctx.world > 1)
    throw UserError("train", "data-parallel training is not available in this build yet", "run one process");
  const TransNeXtOptions mo = classifier_options_for(cfg);
  const std::string run_dir = args.run_dir.empty() ? "runs/" + cfg.name : args.run_dir;

  // Resume decision before anything touches the run directory.
  std::optional<Checkpoint> resume = resolve_resume(run_dir, args.resume);

  datasets::ImageSet train_set = load_split(cfg, true, mo.in_chans), val_set = load_split(cfg, false, mo.in_chans);
  const datasets::ClassifierTransform tf = transform_for(cfg, mo);
  if (train_set.images.size(1) > mo.img_size || train_set.images.size(2) > mo.img_size)
    throw UserError("config: model.img_size", "images are " + std::to_string(train_set.images.size(1)) +
                                                  " px, larger than the model input " + std::to_string(mo.img_size), "");

  torch::manual_seed(cfg.train.seed);
  TransNeXt model(mo);
  model->to(ctx.device);
  std::vector<at::Tensor> decay, plain;
  for (const auto& p : model->named_parameters()) (no_decay(p.key(), p.value()) ? plain : decay).push_back(p.value());
  auto base_opts = torch::optim::AdamWOptions(cfg.optim.lr)
                       .betas({cfg.optim.betas[0], cfg.optim.betas[1]})
                       .eps(cfg.optim.eps)
                       .weight_decay(cfg.optim.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(base_opts));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base_opts).weight_decay(0.0)));
  torch::optim::AdamW optimizer(std::move(groups), base_opts);

  TrainerState state;
  GradScaler scaler(cfg.train.precision);
  const double ema_decay = cfg.train.ema_decay;
  TransNeXt ema{nullptr};  // timm ModelEmaV2-style weight average, evaluated beside the model when enabled
  if (ema_decay > 0) {
    ema = TransNeXt(mo);
    ema->to(ctx.device);
    ema->eval();
    for (auto& p : ema->parameters()) p.set_requires_grad(false);
  }
  if (!resume && !cfg.model.weights.empty()) load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
  if (resume) {
    load_module_tensors(*model, resume->model, resume->dir);
    load_optimizer_tensors(optimizer, *model, resume->optimizer, resume->dir);
    if (resume->rng.count("cpu")) set_cpu_rng_state(resume->rng.at("cpu"));
    if (resume->rng.count("amp_scaler")) scaler.load_state(resume->rng.at("amp_scaler"));
    if (ema && !resume->ema.empty()) load_module_tensors(*ema, resume->ema, resume->dir + "/ema.safetensors");
    state = resume->state;
    std::cerr << "resuming " << resume->dir << " at epoch " << state.epoch << ", step " << state.step << "\n";
  }
  if (ema && !(resume && !resume->ema.empty())) ema_update(*ema, *model, 0.0);  // starts as a copy
  // Every input has been checked: from here on only runtime failures remain.
  const std::string config_yaml = to_yaml(cfg);
  MetricsWriter metrics = start_run_dir(run_dir, config_yaml, resume ? std::optional<int64_t>(state.step) : std::nullopt);
  std::cerr << "model " << cfg.model.name << ": " << mo.active_ratio() * 100 << " % active heads, run dir " << run_dir
            << "\n";

  auto rng_state = [&] { return TensorMap{{"cpu", cpu_rng_state()}, {"amp_scaler", scaler.state()}}; };
  const int64_t accum = cfg.train.accum_steps, micro = cfg.data.batch_size / accum;
  const double beta = cfg.train.moh_loss_coeff;
  TrainResult result;
  result.run_dir = run_dir;
  result.best_top1 = state.best_metric;
  bool stop = false;
  for (int64_t epoch = state.epoch; epoch < cfg.train.epochs && !stop; ++epoch) {
    datasets::EpochLoader loader(train_set, tf, cfg.data.batch_size, /*train=*/true,
                                 static_cast<uint64_t>(cfg.train.seed), epoch);
    const int64_t steps_per_epoch = loader.num_batches();
    if (steps_per_epoch == 0) throw UserError("config: data.batch_size", "larger than the training set", "");
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg.train.epochs), steps_per_epoch,
                      "step");
    model->train();
    double loss_acc = 0, aux_acc = 0;
    int64_t logged = 0, images = 0;
    auto t_log = std::chrono::steady_clock::now();
    at::Tensor x, y;
    for (int64_t b = 0; loader.next(x, y); ++b) {
      const double t = cfg.schedule.unit == ScheduleUnit::epoch ? static_cast<double>(epoch)
                                                                 : epoch + static_cast<double>(b) / steps_per_epoch;
      const double lr = learning_rate_at(cfg, t);
      for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      x = x.to(ctx.device), y = y.to(ctx.device);
      double step_loss = 0, step_aux = 0;
      for (int64_t a = 0; a < accum; ++a) {
        ClassifierOutput out;
        {
          AutocastScope autocast(ctx);  // bf16/fp16 forward; the loss is computed in fp32
          out = model->forward(x.narrow(0, a * micro, micro));
        }
        at::Tensor loss = at::cross_entropy_loss(out.logits.to(at::kFloat), y.narrow(0, a * micro, micro), {},
                                                 at::Reduction::Mean, -100, cfg.train.label_smoothing);
        step_loss += loss.item<double>() / accum;
        if (out.aux_loss.defined()) {
          step_aux += out.aux_loss.item<double>() / accum;
          loss = loss + beta * out.aux_loss.to(at::kFloat);  // L = L_task + β · mean_layers(l_aux)
        }
        scaler.scale(loss / static_cast<double>(accum)).backward();
      }
      if (scaler.unscale_and_update(model->parameters())) {  // fp16: skip steps with inf/NaN gradients
        if (cfg.optim.clip_grad > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.optim.clip_grad);
        optimizer.step();
      }
      optimizer.zero_grad();
      if (ema) ema_update(*ema, *model, ema_decay_at(ema_decay, cfg.train.ema_warmup, state.step));
      ++state.step;
      loss_acc += step_loss, aux_acc += step_aux, ++logged, images += x.size(0);
      char status[96];
      std::snprintf(status, sizeof status, "loss=%.4f lr=%.2e", step_loss, lr);
      progress.advance(1, status);
      if (state.step % cfg.train.log_every_steps == 0) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_log).count();
        metrics.write({{"step", state.step}, {"epoch", epoch}, {"loss", loss_acc / logged}, {"aux", aux_acc / logged},
                       {"lr", lr}, {"img_per_s", images / std::max(secs, 1e-9)}});
        loss_acc = aux_acc = 0, logged = images = 0;
        t_log = std::chrono::steady_clock::now();
      }
      if (cfg.train.max_steps > 0 && state.step >= cfg.train.max_steps) {
        stop = true;
        break;
      }
    }
    progress.finish();
    const bool last = stop || epoch + 1 == cfg.train.epochs;
    state.epoch = epoch + 1;
    if (last || (epoch + 1) % cfg.train.eval_every_epochs == 0) {
      EvalResult ev = evaluate_classifier(model, val_set, tf, cfg.data.eval_batch_size, ctx);
      result.final_eval = ev;
      nlohmann::json line{{"step", state.step}, {"epoch", epoch}, {"top1", ev.top1}, {"top5", ev.top5}, {"val_loss", ev.loss}};
      std::cerr << "epoch " << epoch + 1 << ": top-1 " << ev.top1 << " %, top-5 " << ev.top5 << " %, val loss " << ev.loss;
      if (ema) {
        const EvalResult ev_ema = evaluate_classifier(ema, val_set, tf, cfg.data.eval_batch_size, ctx);
        result.final_eval_ema = ev_ema;
        line["top1_ema"] = ev_ema.top1, line["top5_ema"] = ev_ema.top5, line["val_loss_ema"] = ev_ema.loss;
        std::cerr << "; EMA top-1 " << ev_ema.top1 << " %";
      }
      metrics.write(line);
      std::cerr << "\n";
      const bool best = ev.top1 > state.best_metric;
      if (best) state.best_metric = ev.top1;
      if (best || last || (epoch + 1) % cfg.train.ckpt_every_epochs == 0) {
        std::string dir = save_checkpoint(run_dir, state, module_tensors(*model), optimizer_tensors(optimizer, *model),
                                          config_yaml, rng_state(), ema ? module_tensors(*ema) : TensorMap{});
        if (best) write_file_atomic(run_dir + "/checkpoints/best", fs::path(dir).filename().string() + "\n");
      }
    } else if ((epoch + 1) % cfg.train.ckpt_every_epochs == 0) {
      save_checkpoint(run_dir, state, module_tensors(*model), optimizer_tensors(optimizer, *model), config_yaml,
                      rng_state(), ema ? module_tensors(*ema) : TensorMap{});
    }
  }
  result.steps = state.step;
  result.best_top1 = state.best_metric;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return result;
}

}  // namespace moh::vision
