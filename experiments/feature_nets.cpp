#include "experiments/feature_nets.h"

#include "core/io/sha256.h"
#include "experiments/classifier_experiment.h"

namespace moh::experiments {

std::unique_ptr<eval::FeatureNet> make_feature_net(const std::string& spec, const RunContext& ctx,
                                                   eval::InceptionResize resize) {
  const eval::FeatureSpec s = eval::parse_feature_spec(spec);
  if (s.kind == "inception") return eval::make_inception_net(s.path, ctx, resize);
  if (s.kind == "dinov2") return eval::make_dinov2_net(s.path, ctx);
  experiments::LoadedClassifier c = experiments::load_classifier_checkpoint(s.path);
  datasets::ImageTransform tf = experiments::transform_for(c.cfg, c.model->options);
  return std::make_unique<eval::ClassifierFeatureNet>(c.model, std::move(tf), "classifier:" + c.cfg.model.name,
                                                      sha256_file(c.weights_file), ctx);
}

}  // namespace moh::experiments
