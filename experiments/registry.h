#pragma once
// The one registry of model families (timm's register_model / create_model): the TransNeXt / MoH-ViT classifiers,
// DiT / MoH-DiT, and the fixed SD-VAE and FID-Inception networks, each described once by its own folder
// (experiments/model_family.h says what a family supplies). Commands, benchmarks and tests find a family here by a
// variant name or an experiment and call its hooks; nothing else tests a family.
#include <string>
#include <vector>

#include "core/train/train_loop.h"
#include "experiments/experiment_config.h"
#include "experiments/model_family.h"

namespace moh::experiments {

/// Every family, in the order `moh info --list` shows them.
const std::vector<ModelFamily>& model_families();

/// Every registered name, family by family.
std::vector<std::string> all_model_names();

/// The family of a model name; an unknown name is a UserError ("model 'X': unknown model variant or network (did you
/// mean 'Y'?)"). `what` names the input in the error (e.g. "--model X"; default "model 'X'").
const ModelFamily& find_model_family(const std::string& name, const std::string& what = "");

/// The trainable family of an experiment's model (a UserError for an unknown name or a fixed network).
const ModelFamily& experiment_family(const ExperimentConfig& cfg);

/// Every rule of an experiment that ExperimentConfig::validate() cannot know: the family's model overrides and its
/// own rules (classifiers: per-stage attention, RandAugment spec; DiTs: no attention overrides or accumulation, VAE
/// vs dataset, the sampling respacing and guidance). Reads no data; UserErrors only.
void validate_experiment(const ExperimentConfig& cfg, ExperimentUse use = ExperimentUse::train);

/// The training task of an experiment's family, for run_training.
TaskFactory task_factory(const ExperimentConfig& cfg);

/// The one way into training: validate_experiment, then run_training with the family's task.
LoopResult train_experiment(const ExperimentConfig& cfg, const TrainArgs& args);

/// The precision the experiment's run would train in here and why, as `moh train` logs it ("bf16 (auto: a bf16 step
/// takes 0.72x the fp32 one on this CPU and build, ...)"): `auto` decided by the run's own probe and cache
/// (core/platform/cpu_precision.h), for one of the train.processes ranks `moh train` would start.
std::string run_precision(const ExperimentConfig& cfg);

/// The markdown table of what `attention_path: auto` runs in each MoH layer of the paper variants (MoH-ViT at 224 px,
/// MoH-DiT at 256 px and XL at 512 px, the Fashion-MNIST pixel model) on a CPU with LibTorch 2.x, with LibTorch 1.13,
/// and on a GPU — the same text in every build (`moh info --attention-paths`; README and docs/BENCHMARKS.md carry it,
/// and a test compares them).
std::string attention_path_table();

}  // namespace moh::experiments
