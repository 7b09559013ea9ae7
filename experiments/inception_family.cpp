#include "experiments/inception_family.h"

#include "core/error.h"
#include "core/train/checkpoint.h"
#include "eval/inception.h"

namespace moh::experiments {

namespace {

constexpr const char* kInputs = "x (B,3,299,299), already normalised to [-1,1]";

TensorMap forward(const ForwardRequest& r) {
  check_forward_inputs(r, {"x"}, {"pool", "spatial", "logits"}, kInputs);
  eval::FIDInceptionV3 net;
  load_module_tensors(*net, r.weights, r.weights_origin, r.model.weights_allow_missing);
  net->eval();
  const at::Tensor x = forward_input(r, "x", at::kFloat, 4, kInputs);
  if (x.size(1) != 3 || x.size(2) != 299 || x.size(3) != 299)
    throw UserError("--input " + r.inputs_origin, "x has shape " + c10::str(x.sizes()), kInputs);
  const eval::InceptionFeatures f = net->forward(x);
  return {{"pool", f.pool}, {"spatial", f.spatial}, {"logits", f.logits}};
}

}  // namespace

ModelFamily fid_inception_family() {
  ModelFamily f;
  f.id = kFidInceptionName;
  f.title = "FID-Inception (fixed: the feature network of FID, sFID, IS, precision and recall)";
  f.names = [] { return std::vector<std::string>{kFidInceptionName}; };
  f.summarize = [](const std::string& name) {
    return parameter_summary(name, kFidInceptionName, *eval::FIDInceptionV3());
  };
  f.forward = forward;
  f.forward_inputs = kInputs;
  return f;
}

}  // namespace moh::experiments
