#pragma once
// The data of an experiment (data: section of the config) as the model families read it.
#include <cstdint>

#include "datasets/fashion_mnist.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

/// Train or validation split of the experiment's dataset, decoded into memory (data.limit_train / limit_val
/// applied); image folders are decoded to `channels` (1 = grey, 3 = RGB).
datasets::ImageSet load_split(const ExperimentConfig& cfg, bool train, int64_t channels);

/// What a model takes as pixels: its channels and side (0: any side the loader can place in its input, as a
/// classifier, whose variants all take at least 32 px).
struct PixelInput {
  int64_t channels = 1, side = 0;
};
/// Refuses, before any data is read, an embedded dataset whose fixed shape the model cannot take (the same errors
/// the loaded data would give later, after the model is built and `precision: auto` has timed it). Image folders
/// decode to the model's channels and their sides are known only once read: checked when loaded.
void check_data_shape(const ExperimentConfig& cfg, const PixelInput& model);

}  // namespace moh::experiments
