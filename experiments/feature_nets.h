#pragma once
// The feature networks of `moh fid` / `moh ref-stats` built from their spec (eval/features.h):
//   inception:WEIGHTS(.pth|.safetensors)   the FID Inception
//   classifier:CHECKPOINT_OR_RUN_DIR       a classifier trained with this toolkit (its checkpoint read here)
//   dinov2:WEIGHTS(.safetensors|.pth)      a DINOv2 ViT (FD-DINOv2: ViT-L/14 from timm or facebookresearch/dinov2).
#include <memory>
#include <string>

#include "core/platform/run_context.h"
#include "eval/features.h"

namespace moh::experiments {

/// Builds the feature net a spec names; bad specs and missing files are UserErrors.
std::unique_ptr<eval::FeatureNet> make_feature_net(const std::string& spec, const RunContext& ctx,
                                                   eval::InceptionResize resize = eval::InceptionResize::tf1);

}  // namespace moh::experiments
