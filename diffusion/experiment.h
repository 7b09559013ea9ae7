#pragma once
// The experiment level above both model families: which family a model name belongs to (one lookup over every
// variant table, one "did you mean"), and the semantic validation of a whole experiment. diffusion/ is the model
// library that sees every family (it depends on vision/); apps, bench and tests use this, never a name test of
// their own.
#include <string>
#include <vector>

#include "core/experiment_config.h"
#include "core/train_loop.h"

namespace moh {

/// The families of networks this toolkit builds.
enum class ModelFamily { classifier, dit, sd_vae, fid_inception };

/// Registered names of the two single-network families.
constexpr const char* kSdVaeName = "sd-vae";
constexpr const char* kFidInceptionName = "fid-inception";

/// "classifier", "DiT", "SD-VAE", "FID-Inception".
std::string family_name(ModelFamily f);

/// Every name `model_family` accepts, family by family (classifiers, DiTs, sd-vae, fid-inception).
std::vector<std::string> all_model_names();

/// The family of a model name; an unknown name is a UserError ("model 'X': unknown model (did you mean 'Y'?)").
/// `what` names the input in the error (e.g. "--model X"; default "model 'X'").
ModelFamily model_family(const std::string& name, const std::string& what = "");

/// What an experiment file is used for: training (and `moh config`, `moh eval`), sampling (`moh sample`: the training
/// rules plus those of classifier-free guidance), or encoding its images with `moh extract-latents` (a DiT config
/// whose data are still images).
enum class ExperimentUse { train, sample, extract_latents };

/// Every rule of an experiment that ExperimentConfig::validate() cannot know: the family's model overrides and its
/// own rules (classifiers: no sparse attention path, per-stage attention, RandAugment spec; DiTs: no attention
/// overrides or accumulation, VAE vs dataset, the sampling respacing). A trainable family is required (sd-vae and
/// fid-inception are not experiments). Reads no data; UserErrors only.
void validate_experiment(const ExperimentConfig& cfg, ExperimentUse use = ExperimentUse::train);

/// The training task of an experiment's family (classifier or DiT), for run_training.
TaskFactory task_factory(const ExperimentConfig& cfg);

/// The one way into training: validate_experiment, then run_training with the family's task.
LoopResult train_experiment(const ExperimentConfig& cfg, const TrainArgs& args);

/// The markdown table of what `attention_path: auto` runs in each MoH layer of the paper variants (MoH-DiT at 256 px
/// and XL at 512 px, the Fashion-MNIST pixel model, MoH-ViT at 224 px) on a CPU with LibTorch 2.x, with LibTorch
/// 1.13, and on a GPU — the same text in every build (`moh info --attention-paths`; README and docs/BENCHMARKS.md
/// carry it, and a test compares them).
std::string attention_path_table();

}  // namespace moh
