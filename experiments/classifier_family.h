#pragma once
// The TransNeXt / MoH-ViT classifiers as one entry of the model registry (experiments/registry.h).
#include "experiments/model_family.h"

namespace moh::experiments {

/// Variants, experiment rules, training task, forward, summary, benchmark step and attention-path rows.
ModelFamily classifier_family();

}  // namespace moh::experiments
