#include "experiments/classifier_experiment.h"

#include <cmath>
#include <iostream>

#include "core/error.h"
#include "core/io/progress.h"
#include "core/platform/amp.h"
#include "core/train/checkpoint.h"
#include "core/train/retention.h"
#include "datasets/stream_loader.h"
#include "experiments/experiment_data.h"
#include "experiments/model_family.h"

namespace moh::experiments {

vision::TransNeXtOptions classifier_options_for(const ModelConfig& model) {
  vision::TransNeXtOptions o = vision::classifier_options(model.name);
  if (model.norm != NormKind::automatic || model.mlp != MlpKind::automatic || model.pos != PosKind::automatic ||
      model.qk_norm)
    throw UserError("config: model.norm / mlp / pos / qk_norm", "LightningDiT's block options are for DiT models",
                    "remove them for " + model.name);
  if (model.overlap_output)
    throw UserError("config: model.overlap_output", "overlapping output windows are for DiT models",
                    "remove it for " + model.name);
  o.attention_path = model.attention_path;
  o.router = model.router;
  o.fused = model.fused;
  if (model.num_classes > 0) o.num_classes = model.num_classes;
  if (model.img_size > 0) o.img_size = model.img_size;
  if (model.drop_path >= 0) o.drop_path_rate = model.drop_path;
  if (!model.attention.empty()) {
    if (model.attention.size() != 4)
      throw UserError("config: model.attention",
                      "expected 4 entries (one per stage), got " + std::to_string(model.attention.size()),
                      "e.g. [moh, moh, moh, moh]");
    const vision::TransNeXtOptions base = o;
    for (int i = 0; i < 4; ++i) {
      o.attention[i] = model.attention[i];
      if (o.attention[i] == AttentionMode::moh && base.attention[i] != AttentionMode::moh)
        throw UserError("config: model.attention",
                        "stage " + std::to_string(i + 1) + " of " + model.name + " has no MoH head split",
                        "use a MoH-ViT variant for moh stages");
      if (o.attention[i] == AttentionMode::moa && o.topk[i] == 0) o.topk[i] = std::max<int64_t>(1, o.num_heads[i] / 2);
    }
  }
  // model.shared_heads / topk last: a dense variant (or one made dense by model.attention) with this head split
  const auto split = moh_split(model, {o.num_heads.begin(), o.num_heads.end()}, /*one_for_all=*/false, "stage");
  for (size_t i = 0; i < split.size(); ++i) {
    o.attention[i] = AttentionMode::moh;
    o.shared_heads[i] = split[i].shared;
    o.topk[i] = split[i].topk;
  }
  return o;
}

vision::TransNeXtOptions classifier_options_for(const ExperimentConfig& cfg) {
  vision::TransNeXtOptions o = classifier_options_for(cfg.model);
  o.grad_checkpoint = cfg.train.grad_checkpoint == GradCheckpoint::blocks;
  if (cfg.train.paired) o.init_seed = cfg.train.seed;
  o.validate();
  return o;
}

void validate_classifier_experiment(const ExperimentConfig& cfg) {
  const vision::TransNeXtOptions o = classifier_options_for(cfg);
  if (!cfg.repa.encoder.empty())
    throw UserError("config: train.repa.encoder",
                    "REPA aligns a diffusion model's tokens; " + cfg.model.name + " is a classifier",
                    "remove train.repa");
  // The first stage's activation of one rank's batch alone (a lower bound of what training holds) must fit the machine.
  const int64_t side = (o.img_size + o.patch_size - 1) / o.patch_size;
  const double bytes = static_cast<double>(cfg.data.batch_size / std::max<int64_t>(1, cfg.train.processes)) *
                       static_cast<double>(o.embed_dims[0]) * static_cast<double>(side * side) * 4.0;
  const DeviceMemory memory = device_memory(cfg.train.device);  // the GPU's, or this machine's
  if (bytes > static_cast<double>(memory.bytes))
    throw UserError("config: model.img_size",
                    std::to_string(o.img_size) + " px at batch " + std::to_string(cfg.data.batch_size) +
                        " needs at least " + std::to_string(static_cast<int64_t>(bytes / (1 << 30))) +
                        " GiB for the first stage alone, more than the " + std::to_string(memory.bytes >> 30) +
                        " GiB of " + memory.name,
                    "lower model.img_size or data.batch_size");
  datasets::RandAugmentSpec::parse(cfg.augment.rand_augment, "config: augment.rand_augment");
  check_data_shape(cfg, {o.in_chans, /*side=*/0});
}

datasets::ImageTransform transform_for(const ExperimentConfig& cfg, const vision::TransNeXtOptions& model) {
  datasets::ImageTransform tf;
  tf.size = model.img_size;
  tf.shift = cfg.data.shift;
  tf.hflip = cfg.data.hflip;
  tf.erase_prob = cfg.augment.erase_prob;
  return tf;
}

ClassifierSplit::ClassifierSplit(const ExperimentConfig& cfg, const vision::TransNeXtOptions& model, bool train)
    : cfg_(cfg),
      model_(model),
      tf_(transform_for(cfg, model)),
      stream_(cfg.data.loader == LoaderKind::stream),
      train_(train) {
  if (cfg.data.dataset == DatasetKind::image_folder && !cfg.data.root.empty())
    datasets::check_same_classes(cfg.data.root);
  if (!stream_) {
    set_ = experiments::load_split(cfg, train, model.in_chans);
    const int64_t labels_max = set_.labels.max().item<int64_t>();
    if (labels_max >= model.num_classes)
      throw UserError("config: model.num_classes",
                      std::to_string(model.num_classes) + " outputs, the " + (train ? "training" : "validation") +
                          " data has labels up to " + std::to_string(labels_max),
                      "raise model.num_classes");
    if (set_.images.size(1) > model.img_size || set_.images.size(2) > model.img_size)
      throw UserError("config: model.img_size",
                      "images are " + std::to_string(set_.images.size(1)) + " px, larger than the model input " +
                          std::to_string(model.img_size),
                      "use data.loader: stream to crop and resize");
    return;
  }
  if (cfg.data.root.empty())
    throw UserError("config: data.root", "image_folder needs a root", "<root>/{train,val}/<class>/*");
  const std::string split = train ? "train" : "val";
  index_ = datasets::scan_image_folder(cfg.data.root, split);
  datasets::limit_image_folder(index_, train ? cfg.data.limit_train : cfg.data.limit_val,
                               static_cast<uint64_t>(cfg.train.seed));
  if (!index_.empty_classes.empty())
    std::cerr << "warning: " << cfg.data.root << "/" << split << ": " << index_.empty_classes.size()
              << " class folder(s) without images (kept as labels)\n";
  if (static_cast<int64_t>(index_.classes.size()) > model.num_classes)
    throw UserError("config: model.num_classes",
                    std::to_string(model.num_classes) + " outputs, " + cfg.data.root + "/" + split + " has " +
                        std::to_string(index_.classes.size()) + " classes",
                    "");
  const AugmentConfig& a = cfg.augment;
  stream_tf_.size = model.img_size;
  stream_tf_.random_resized_crop = a.random_resized_crop;
  stream_tf_.scale_min = a.scale[0];
  stream_tf_.scale_max = a.scale[1];
  stream_tf_.ratio_min = a.ratio[0];
  stream_tf_.ratio_max = a.ratio[1];
  stream_tf_.hflip = a.hflip;
  stream_tf_.rand_augment = datasets::RandAugmentSpec::parse(a.rand_augment, "config: augment.rand_augment");
  stream_tf_.erase_prob = a.erase_prob;
  stream_tf_.crop_pct = a.eval_crop_pct;
  if (model.in_chans == 1) {
    stream_tf_.mean = {datasets::kFashionMnistMean};
    stream_tf_.std = {datasets::kFashionMnistStd};
  }
}

int64_t ClassifierSplit::size() const {
  if (!stream_) return set_.size();
  return static_cast<int64_t>(index_.files.size());  // already limited
}

std::unique_ptr<datasets::BatchStream> ClassifierSplit::epoch(int64_t epoch, int64_t batch_size, bool train,
                                                              int64_t start_batch, bool drop_last, int rank,
                                                              int world) const {
  const auto seed = static_cast<uint64_t>(cfg_.train.seed);
  if (!stream_)
    return std::make_unique<datasets::EpochLoader>(set_, tf_, batch_size, train, seed, epoch, start_batch, drop_last, 2,
                                                   rank, world);
  datasets::StreamOptions o;
  o.batch_size = batch_size;
  o.train = train;
  o.seed = seed;
  o.epoch = epoch;
  o.start_batch = start_batch;
  o.drop_last = drop_last;
  o.workers = static_cast<int>(std::max<int64_t>(1, cfg_.data.num_workers));
  o.repeats = cfg_.augment.repeated;
  o.channels = model_.in_chans;
  o.rank = rank;
  o.world = world;
  o.max_bad_fraction = cfg_.data.max_bad_fraction;
  o.root = cfg_.data.root;
  return std::make_unique<datasets::StreamLoader>(index_, stream_tf_, o);
}

datasets::MixupOptions mixup_for(const ExperimentConfig& cfg, const vision::TransNeXtOptions& model) {
  datasets::MixupOptions m;
  m.mixup_alpha = cfg.augment.mixup;
  m.cutmix_alpha = cfg.augment.cutmix;
  m.prob = cfg.augment.mixup_prob;
  m.switch_prob = cfg.augment.mixup_switch_prob;
  m.label_smoothing = cfg.train.label_smoothing;
  m.num_classes = model.num_classes;
  return m;
}

EvalResult evaluate_classifier(vision::TransNeXt& model, datasets::BatchStream& batches, const RunContext& ctx,
                               vision::HeadLoadStats* head_load) {
  torch::NoGradGuard ng;
  const bool was_training = model->is_training();
  model->eval();
  EvalResult r;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  Progress progress("eval", batches.num_batches(), "batch", ctx.is_main() ? -1 : 2);
  at::Tensor x, y;
  while (batches.next(x, y)) {
    x = x.to(ctx.device);
    y = y.to(ctx.device);
    vision::ClassifierOutput out;
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
    progress.advance();
  }
  progress.finish();
  model->train(was_training);
  if (r.count > 0) {
    r.top1 = 100.0 * top1 / r.count;
    r.top5 = 100.0 * top5 / r.count;
    r.loss = loss_sum / r.count;
  }
  return r;
}

EvalResult evaluate_sharded(vision::TransNeXt& model, const ClassifierSplit& split, int64_t batch_size,
                            const RunContext& ctx, dist::Group& group, vision::HeadLoadStats* head_load) {
  EvalResult r = evaluate_classifier(model, *split.epoch(0, batch_size, false, 0, false, group.rank(), group.world()),
                                     ctx, head_load);
  if (group.world() == 1) return r;
  if (head_load) head_load->reduce(group);
  const auto n = static_cast<double>(r.count);
  const std::vector<double> s =
      group.sum({std::round(r.top1 * n / 100.0), std::round(r.top5 * n / 100.0), r.loss * n, n});
  EvalResult all;
  all.count = static_cast<int64_t>(s[3]);
  if (all.count > 0) {
    all.top1 = 100.0 * s[0] / s[3];
    all.top5 = 100.0 * s[1] / s[3];
    all.loss = s[2] / s[3];
  }
  return all;
}

LoadedClassifier load_classifier_checkpoint(const std::string& path, bool ema) {
  const FamilyCheckpoint opened =
      open_family_checkpoint(path, names_of(vision::classifier_variants()), "classifier",
                             "pass a classifier run (moh train with a MoH-ViT / TransNeXt config)");
  return load_family_model(opened, vision::TransNeXt(classifier_options_for(opened.cfg)), ema, /*require_ema=*/true);
}

}  // namespace moh::experiments
