#include "vision/classification_trainer.h"

#include "datasets/image_folder.h"
#include "datasets/stream_loader.h"

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
  if (cfg.model.attention_path == AttentionPath::sparse)
    throw UserError("config: model.attention_path", "sparse is implemented for DiT attention; TransNeXt's aggregated "
                                                    "attention computes every head and gates them (the official path)",
                    "use attention_path: dense for classifiers");
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
  tf.erase_prob = cfg.augment.erase_prob;
  return tf;
}

ClassifierSplit::ClassifierSplit(const ExperimentConfig& cfg, const TransNeXtOptions& model, bool train)
    : cfg_(cfg), model_(model), tf_(transform_for(cfg, model)), stream_(cfg.data.loader == LoaderKind::stream), train_(train) {
  if (!stream_) {
    set_ = load_split(cfg, train, model.in_chans);
    if (set_.images.size(1) > model.img_size || set_.images.size(2) > model.img_size)
      throw UserError("config: model.img_size", "images are " + std::to_string(set_.images.size(1)) +
                                                    " px, larger than the model input " + std::to_string(model.img_size),
                      "use data.loader: stream to crop and resize");
    return;
  }
  if (cfg.data.root.empty()) throw UserError("config: data.root", "image_folder needs a root", "<root>/{train,val}/<class>/*");
  const std::string split = train ? "train" : "val";
  index_ = datasets::scan_image_folder(cfg.data.root, split);
  if (!index_.empty_classes.empty())
    std::cerr << "warning: " << cfg.data.root << "/" << split << ": " << index_.empty_classes.size()
              << " class folder(s) without images (kept as labels)\n";
  if (static_cast<int64_t>(index_.classes.size()) > model.num_classes)
    throw UserError("config: model.num_classes", std::to_string(model.num_classes) + " outputs, " + cfg.data.root + "/" +
                                                     split + " has " + std::to_string(index_.classes.size()) + " classes", "");
  const AugmentConfig& a = cfg.augment;
  stream_tf_.size = model.img_size;
  stream_tf_.random_resized_crop = a.random_resized_crop;
  stream_tf_.scale_min = a.scale[0], stream_tf_.scale_max = a.scale[1];
  stream_tf_.ratio_min = a.ratio[0], stream_tf_.ratio_max = a.ratio[1];
  stream_tf_.hflip = a.hflip;
  stream_tf_.rand_augment = datasets::RandAugmentSpec::parse(a.rand_augment, "config: augment.rand_augment");
  stream_tf_.erase_prob = a.erase_prob;
  stream_tf_.crop_pct = a.eval_crop_pct;
  if (model.in_chans == 1) stream_tf_.mean = {datasets::kFashionMnistMean}, stream_tf_.std = {datasets::kFashionMnistStd};
}

int64_t ClassifierSplit::size() const {
  if (!stream_) return set_.size();
  const auto n = static_cast<int64_t>(index_.files.size());
  const int64_t limit = train_ ? cfg_.data.limit_train : cfg_.data.limit_val;
  return limit > 0 ? std::min(n, limit) : n;
}

std::unique_ptr<datasets::BatchStream> ClassifierSplit::epoch(int64_t epoch, int64_t batch_size, bool train,
                                                              int64_t start_batch, bool drop_last, int rank,
                                                              int world) const {
  const auto seed = static_cast<uint64_t>(cfg_.train.seed);
  if (!stream_)
    return std::make_unique<datasets::EpochLoader>(set_, tf_, batch_size, train, seed, epoch, start_batch, drop_last,
                                                   2, rank, world);
  datasets::StreamOptions o;
  o.batch_size = batch_size, o.train = train, o.seed = seed, o.epoch = epoch, o.start_batch = start_batch;
  o.drop_last = drop_last, o.workers = static_cast<int>(std::max<int64_t>(1, cfg_.data.num_workers));
  o.repeats = cfg_.augment.repeated, o.channels = model_.in_chans;
  o.limit = train ? cfg_.data.limit_train : cfg_.data.limit_val;
  o.rank = rank, o.world = world;
  return std::make_unique<datasets::StreamLoader>(index_, stream_tf_, o);
}

datasets::MixupOptions mixup_for(const ExperimentConfig& cfg, const TransNeXtOptions& model) {
  datasets::MixupOptions m;
  m.mixup_alpha = cfg.augment.mixup, m.cutmix_alpha = cfg.augment.cutmix;
  m.prob = cfg.augment.mixup_prob, m.switch_prob = cfg.augment.mixup_switch_prob;
  m.label_smoothing = cfg.train.label_smoothing, m.num_classes = model.num_classes;
  return m;
}

EvalResult evaluate_classifier(TransNeXt& model, datasets::BatchStream& batches, const RunContext& ctx,
                               HeadLoadStats* head_load) {
  torch::NoGradGuard ng;
  const bool was_training = model->is_training();
  model->eval();
  EvalResult r;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  at::Tensor x, y;
  while (batches.next(x, y)) {
    x = x.to(ctx.device), y = y.to(ctx.device);
    ClassifierOutput out;
    {
      AutocastScope autocast(ctx);  // bf16/fp16 runs evaluate under autocast too (the official eval uses fp16)
      out = model->forward(x);
    }
    if (head_load) head_load->add(out.routed, y);
    const at::Tensor logits = out.logits.to(at::kFloat);
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

EvalResult evaluate_sharded(TransNeXt& model, const ClassifierSplit& split, int64_t batch_size, const RunContext& ctx,
                            dist::Group& group, HeadLoadStats* head_load) {
  EvalResult r = evaluate_classifier(model, *split.epoch(0, batch_size, false, 0, false, group.rank(), group.world()), ctx,
                                     head_load);
  if (group.world() == 1) return r;
  if (head_load) head_load->reduce(group);
  const auto n = static_cast<double>(r.count);
  const std::vector<double> s = group.sum({std::round(r.top1 * n / 100.0), std::round(r.top5 * n / 100.0), r.loss * n, n});
  EvalResult all;
  all.count = static_cast<int64_t>(s[3]);
  if (all.count > 0) all.top1 = 100.0 * s[0] / s[3], all.top5 = 100.0 * s[1] / s[3], all.loss = s[2] / s[3];
  return all;
}

EvalResult evaluate_classifier(TransNeXt& model, const datasets::ImageSet& set, const datasets::ClassifierTransform& tf,
                               int64_t batch_size, const RunContext& ctx, HeadLoadStats* head_load) {
  datasets::EpochLoader loader(set, tf, batch_size, /*train=*/false, 0, 0, 0, /*drop_last=*/false);
  return evaluate_classifier(model, loader, ctx, head_load);
}

StepLosses classifier_backward(TransNeXt& model, const at::Tensor& x, const at::Tensor& y, int64_t accum, double beta,
                               double label_smoothing, const RunContext& ctx, const GradScaler& scaler) {
  StepLosses r;
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
    r.loss += loss.item<double>() / accum;
    if (out.aux_loss.defined()) {
      r.aux += out.aux_loss.item<double>() / accum;
      loss = loss + beta * out.aux_loss.to(at::kFloat);  // L = L_task + β · mean_layers(l_aux)
    }
    scaler.scale(loss / static_cast<double>(accum)).backward();
  }
  return r;
}

TrainResult train_classifier(const ExperimentConfig& cfg, const TrainArgs& args) {
  const auto t_start = std::chrono::steady_clock::now();
  RunContext ctx = RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed));
  const TransNeXtOptions mo = classifier_options_for(cfg);
  const std::string run_dir = args.run_dir.empty() ? "runs/" + cfg.name : args.run_dir;
  const int64_t world = ctx.world, local_batch = cfg.data.batch_size / world;
  if (cfg.data.batch_size % world != 0 || local_batch % cfg.train.accum_steps != 0)
    throw UserError("config: data.batch_size", std::to_string(cfg.data.batch_size) + " does not split into " +
                                                   std::to_string(world) + " ranks × " +
                                                   std::to_string(cfg.train.accum_steps) + " accumulation steps",
                    "use a multiple of world size × train.accum_steps");

  // Resume decision before anything touches the run directory (every rank decides alike, then rank 0 writes).
  std::optional<Checkpoint> resume = resolve_resume(run_dir, args.resume);
  const std::shared_ptr<dist::Group> group = dist::Group::join(ctx);
  group->barrier();

  const ClassifierSplit train_split(cfg, mo, true), val_split(cfg, mo, false);
  const datasets::MixupOptions mixup = mixup_for(cfg, mo);

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
  GradScaler scaler(ctx.precision);
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
    if (resume->rng.count("amp_scaler")) scaler.load_state(resume->rng.at("amp_scaler"));
    if (ema && !resume->ema.empty()) load_module_tensors(*ema, resume->ema, resume->dir + "/ema.safetensors");
    state = resume->state;
    std::cerr << "resuming " << resume->dir << " at epoch " << state.epoch << ", step " << state.step << "\n";
  }
  group->broadcast_module(*model);  // every rank starts from rank 0's weights
  if (ema && !(resume && !resume->ema.empty())) ema_update(*ema, *model, 0.0);  // starts as a copy
  dist::restore_rank_rng(*group, resume ? &resume->rng : nullptr, static_cast<uint64_t>(cfg.train.seed), state.step,
                         /*per_rank=*/true);  // drop path draws differ per rank
  // Every input has been checked: from here on only runtime failures remain.
  const std::string config_yaml = to_yaml(cfg);
  MetricsWriter metrics;
  if (group->is_main()) {
    metrics = start_run_dir(run_dir, config_yaml, resume ? std::optional<int64_t>(state.step) : std::nullopt);
    if (const std::string w = slow_bf16_warning(ctx); !w.empty()) std::cerr << "warning: " << w << "\n";
    std::cerr << "model " << cfg.model.name << ": " << mo.active_ratio() * 100 << " % active heads, "
              << precision_summary(cfg.train.precision, ctx) << ", run dir " << run_dir
              << (world > 1 ? ", " + std::to_string(world) + " data-parallel ranks" : std::string()) << "\n";
  }

  auto rng_state = [&] { return TensorMap{{"cpu", cpu_rng_state()}, {"cpu_ranks", dist::gather_rank_rng(*group)}, {"amp_scaler", scaler.state()}}; };
  // Every rank takes part (the RNG gather is a collective); rank 0 writes, atomically.
  auto checkpoint = [&]() -> std::string {
    TensorMap rng = rng_state();
    if (!group->is_main()) return "";
    return save_checkpoint(run_dir, state, module_tensors(*model), optimizer_tensors(optimizer, *model), config_yaml,
                           rng, ema ? module_tensors(*ema) : TensorMap{});
  };
  const int64_t accum = cfg.train.accum_steps;
  const double beta = cfg.train.moh_loss_coeff;
  TrainResult result;
  result.run_dir = run_dir;
  result.best_top1 = state.best_metric;
  bool stop = false;
  for (int64_t epoch = state.epoch; epoch < cfg.train.epochs && !stop; ++epoch) {
    const auto loader = train_split.epoch(epoch, local_batch, /*train=*/true, 0, true, ctx.rank, ctx.world);
    const int64_t steps_per_epoch = loader->num_batches();
    if (steps_per_epoch == 0) throw UserError("config: data.batch_size", "larger than the training set", "");
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg.train.epochs), steps_per_epoch,
                      "step", group->is_main() ? -1 : 2);
    model->train();
    double loss_acc = 0, aux_acc = 0;
    int64_t logged = 0, images = 0;
    auto t_log = std::chrono::steady_clock::now();
    at::Tensor x, y;
    for (int64_t b = 0; loader->next(x, y); ++b) {
      const double t = cfg.schedule.unit == ScheduleUnit::epoch ? static_cast<double>(epoch)
                                                                 : epoch + static_cast<double>(b) / steps_per_epoch;
      const double lr = learning_rate_at(cfg, t);
      for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      if (mixup.enabled()) {  // one λ per batch, drawn from (seed, epoch, batch): the same after a resume
        datasets::AugRng rng(datasets::mix_seed(datasets::mix_seed(static_cast<uint64_t>(cfg.train.seed) ^ 0x6d697875ull,
                                                                   static_cast<uint64_t>(epoch)), static_cast<uint64_t>(b)));
        y = datasets::mixup_batch_(x, y, mixup, rng);
      }
      x = x.to(ctx.device), y = y.to(ctx.device);
      const StepLosses sl = classifier_backward(model, x, y, accum, beta, cfg.train.label_smoothing, ctx, scaler);
      group->average_gradients(model->parameters());  // no-op on one process
      finish_optimizer_step(optimizer, model->parameters(), scaler, cfg.optim.clip_grad);
      if (ema) ema_update(*ema, *model, ema_decay_at(ema_decay, cfg.train.ema_warmup, state.step));
      ++state.step;
      loss_acc += sl.loss, aux_acc += sl.aux, ++logged, images += x.size(0) * world;
      char status[96];
      std::snprintf(status, sizeof status, "loss=%.4f lr=%.2e", sl.loss, lr);
      progress.advance(1, status);
      if (state.step % cfg.train.log_every_steps == 0) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_log).count();
        const std::vector<double> sums = group->sum({loss_acc, aux_acc});  // rank means → global means
        loss_acc = sums[0] / world, aux_acc = sums[1] / world;
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
      EvalResult ev = evaluate_sharded(model, val_split, cfg.data.eval_batch_size, ctx, *group);
      result.final_eval = ev;
      nlohmann::json line{{"step", state.step}, {"epoch", epoch}, {"top1", ev.top1}, {"top5", ev.top5}, {"val_loss", ev.loss}};
      std::ostringstream msg;
      msg << "epoch " << epoch + 1 << ": top-1 " << ev.top1 << " %, top-5 " << ev.top5 << " %, val loss " << ev.loss;
      if (ema) {
        const EvalResult ev_ema = evaluate_sharded(ema, val_split, cfg.data.eval_batch_size, ctx, *group);
        result.final_eval_ema = ev_ema;
        line["top1_ema"] = ev_ema.top1, line["top5_ema"] = ev_ema.top5, line["val_loss_ema"] = ev_ema.loss;
        msg << "; EMA top-1 " << ev_ema.top1 << " %";
      }
      metrics.write(line);
      if (group->is_main()) std::cerr << msg.str() << "\n";
      const bool best = ev.top1 > state.best_metric;
      if (best) state.best_metric = ev.top1;
      if (best || last || (epoch + 1) % cfg.train.ckpt_every_epochs == 0) {
        const std::string dir = checkpoint();
        if (best && group->is_main()) write_file_atomic(run_dir + "/checkpoints/best", fs::path(dir).filename().string() + "\n");
      }
    } else if ((epoch + 1) % cfg.train.ckpt_every_epochs == 0) {
      checkpoint();
    }
    group->barrier();  // no rank runs ahead of the checkpoint it may resume from
  }
  result.steps = state.step;
  result.best_top1 = state.best_metric;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return result;
}

}  // namespace moh::vision
