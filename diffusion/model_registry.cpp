#include "diffusion/model_registry.h"

#include "core/error.h"
#include "datasets/image_decode.h"
#include "diffusion/dit_family.h"
#include "eval/inception_family.h"
#include "vision/classifier_family.h"

namespace moh {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families{vision::classifier_family(), diffusion::dit_family(),
                                                 diffusion::sd_vae_family(), eval::fid_inception_family()};
  return families;
}

std::vector<std::string> all_model_names() {
  std::vector<std::string> all;
  for (const ModelFamily& f : model_families())
    for (const std::string& n : f.names()) all.push_back(n);
  return all;
}

const ModelFamily& find_model_family(const std::string& name, const std::string& what) {
  for (const ModelFamily& f : model_families())
    for (const std::string& n : f.names())
      if (n == name) return f;
  const std::string near = nearest_name(name, all_model_names());
  throw UserError(what.empty() ? "model '" + name + "'" : what, "unknown model variant or network",
                  near.empty() ? "see `moh info --list`" : "did you mean '" + near + "'?");
}

const ModelFamily& experiment_family(const ExperimentConfig& cfg) {
  const std::string what = "config: model.name '" + cfg.model.name + "'";
  const ModelFamily& f = find_model_family(cfg.model.name, what);
  if (!f.trainable())
    throw UserError("config: model.name", cfg.model.name + " is a fixed network, not a trainable experiment",
                    "pick a classifier or DiT variant (moh info --list)");
  return f;
}

void validate_experiment(const ExperimentConfig& cfg, ExperimentUse use) {
  experiment_family(cfg).validate(cfg, use);
  // Here, not where the images are first read: in a job of several processes that is inside each one, after the
  // device choice has spoken (a second line) — and a build without OpenCV can still sample such a model.
  if (use != ExperimentUse::sample && cfg.data.dataset == DatasetKind::image_folder && !datasets::can_decode_images())
    throw UserError("data.dataset image_folder", "needs OpenCV, which this build was configured without",
                    "rebuild with -DMOH_WITH_OPENCV=ON");
}

TaskFactory task_factory(const ExperimentConfig& cfg) {
  const ModelFamily& f = experiment_family(cfg);
  return [&f, cfg](const RunContext& ctx) { return f.task(cfg, ctx); };
}

LoopResult train_experiment(const ExperimentConfig& cfg, const TrainArgs& args) {
  validate_experiment(cfg);
  return run_training(cfg, args, task_factory(cfg));
}

std::string attention_path_table() {
  std::string t =
      "| model | input | layers | active heads | CPU, LibTorch 2.x | CPU, LibTorch 1.13 | GPU |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const ModelFamily& f : model_families())
    if (f.attention_path_rows) t += f.attention_path_rows();
  return t;
}

}  // namespace moh
