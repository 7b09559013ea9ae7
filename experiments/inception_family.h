#pragma once
// The FID-Inception network (pytorch-fid's pt_inception weights) as an entry of the model registry
// (experiments/registry.h): a fixed network, forward and summary only.
#include "experiments/model_family.h"

namespace moh::experiments {

/// The registered name of the FID-Inception network.
constexpr const char* kFidInceptionName = "fid-inception";

ModelFamily fid_inception_family();

}  // namespace moh::experiments
