#pragma once
// The data of an experiment (data: section of the config) as the model families read it.
#include <cstdint>

#include "datasets/fashion_mnist.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

/// Train or validation split of the experiment's dataset, decoded into memory (data.limit_train / limit_val
/// applied); image folders are decoded to `channels` (1 = grey, 3 = RGB).
datasets::ImageSet load_split(const ExperimentConfig& cfg, bool train, int64_t channels);

}  // namespace moh::experiments
