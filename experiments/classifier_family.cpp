#include "experiments/classifier_family.h"

#include <torch/optim/adamw.h>

#include "core/platform/amp.h"
#include "core/train/checkpoint.h"
#include "core/train/working_copies.h"
#include "experiments/classifier_experiment.h"
#include "experiments/train_tasks.h"
#include "vision/classifier_trainer.h"
#include "vision/transnext.h"

namespace moh::experiments {

namespace {

ModelSummary summarize(const std::string& name) {
  const vision::TransNeXtOptions o = vision::classifier_options(name);
  ModelSummary s = parameter_summary(name, "classifier", *vision::TransNeXt(o));
  s.layers = o.total_layers();
  for (int64_t i = 0; i < 4; ++i) s.moh_layers += o.attention[i] == AttentionMode::mha ? 0 : o.depths[i];
  s.routed_layers = o.routed_layers();
  s.active_ratio = o.active_ratio();
  return s;
}

constexpr const char* kForwardInputs = "x (B,C,H,W) float";

// The input's channels and size, and the classes of the weights' head, decide the model.
TensorMap forward(const ForwardRequest& r) {
  check_forward_inputs(r, {"x"}, {"logits", "features"}, kForwardInputs);
  const at::Tensor x = forward_input(r, "x", at::kFloat, 4, kForwardInputs);
  vision::TransNeXtOptions o = classifier_options_for(r.model);
  o.img_size = x.size(2);
  o.in_chans = x.size(1);
  if (auto it = r.weights.find("head.weight"); it != r.weights.end() && it->second.dim() == 2)
    o.num_classes = it->second.size(0);
  o.validate();
  vision::TransNeXt model(o);
  load_module_tensors(*model, r.weights, r.weights_origin, r.model.weights_allow_missing);
  model->eval();
  const vision::ClassifierOutput out = model->forward(x);
  return {{"logits", out.logits}, {"features", out.features}};
}

BenchStep bench_step(const BenchRequest& r) {
  vision::TransNeXtOptions o =
      r.experiment ? classifier_options_for(*r.experiment) : vision::classifier_options(r.name);
  if (!r.experiment) {
    if (r.img_size > 0) o.img_size = r.img_size;
    o.attention_path = r.path;
    o.grad_checkpoint = r.grad_checkpoint;
    o.fused = r.fused;
  }
  o.validate();
  vision::TransNeXt model(o);
  model->to(r.ctx.device);
  model->train();
  nn::set_plain_routers(*model, r.plain_router);
  auto opt = std::make_shared<BenchOptimizer>(*model, r, 1e-3, 0.05, 1.0, [&] {
    vision::TransNeXt copy(o);
    copy->to(r.ctx.device);
    return copy.ptr();
  });
  const auto dev = at::TensorOptions().device(r.ctx.device);
  const at::Tensor x = at::randn({r.batch, o.in_chans, o.img_size, o.img_size}, dev);
  const at::Tensor y = at::randint(0, o.num_classes, {r.batch}, dev.dtype(at::kLong));
  const RunContext ctx = r.ctx;
  BenchStep b;
  b.step = [=]() mutable {
    {
      const WorkingCopyScope copies(opt->copies());
      classifier_backward(model, x, y, 1, 0.01, 0.1, ctx, opt->scaler());
    }
    opt->step(*model);
  };
  b.forward = [=]() mutable { model->forward(x); };
  b.attention_path = config::to_string(o.attention_path);
  b.input = {o.in_chans, o.img_size, o.img_size};
  return b;
}

// Classifier layers run dense under `auto` (TransNeXtOptions::attention_path): no sparse training layer measured
// faster than its dense one.
std::string attention_path_rows() {
  std::string rows;
  for (const auto& [name, o] : vision::classifier_variants())
    if (name.rfind("MoH-ViT", 0) == 0 && name.find("Nano") == std::string::npos)
      rows += "| " + name + " | 224 px | every MoH layer | " +
              std::to_string(static_cast<int>(o.active_ratio() * 100 + 0.5)) + " % overall | dense | dense | dense |\n";
  return rows;
}

}  // namespace

ModelFamily classifier_family() {
  ModelFamily f;
  f.id = "classifier";
  f.measure = ModelFamily::Measure::eval;
  f.fixed_on_resume = {"model.name", "model.attention", "model.num_classes", "model.img_size"};
  f.title = "TransNeXt / MoH-ViT (classification)";
  f.names = [] { return names_of(vision::classifier_variants()); };
  f.summarize = summarize;
  f.forward = forward;
  f.forward_inputs = kForwardInputs;
  f.validate = [](const ExperimentConfig& cfg, ExperimentUse) { validate_classifier_experiment(cfg); };
  f.task = experiments::make_classifier_task;
  f.active_ratio = [](const ExperimentConfig& cfg) { return classifier_options_for(cfg).active_ratio(); };
  f.bench_step = bench_step;
  f.attention_path_rows = attention_path_rows;
  return f;
}

}  // namespace moh::experiments
