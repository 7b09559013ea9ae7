#include "experiments/evaluation_run.h"

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/sha256.h"
#include "core/train/checkpoint.h"
#include "datasets/fashion_mnist.h"
#include "eval/report.h"
#include "experiments/feature_nets.h"
#include "experiments/registry.h"

namespace moh::experiments {

namespace {

// The experiment an evaluation reads: CONFIG.yaml, or the checkpoint's own with the overrides applied.
ExperimentConfig eval_config(const ClassifierEvalRequest& r, const std::optional<LoadedClassifier>& loaded) {
  if (!r.config.empty()) return load_experiment(r.config, r.sets);
  if (loaded) return with_overrides(loaded->cfg, r.sets, "checkpoint " + loaded->dir + "/config.resolved.yaml");
  throw UserError(r.program, "missing --checkpoint PATH",
                  "a checkpoint or run directory, or CONFIG.yaml --weights FILE (e.g. an official .pth)");
}

// The classifier evaluated: the checkpoint's, or the config's model with its weights file (official or converted).
LoadedClassifier evaluated_model(const ExperimentConfig& cfg, const std::optional<LoadedClassifier>& loaded) {
  if (loaded) return *loaded;
  LoadedClassifier m;
  m.cfg = cfg, m.weights_file = cfg.model.weights;
  m.model = vision::TransNeXt(classifier_options_for(cfg));
  load_initial_weights(*m.model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
  m.weights = cfg.model.weights_key.empty() ? "file" : cfg.model.weights_key;
  return m;
}

// The MoH head load per layer and class beside the report (paper Figure 3); the heat map's path, "" without one.
std::string write_head_load(const std::string& out, const vision::HeadLoadStats& head_load,
                            const ExperimentConfig& cfg) {
  write_file_atomic(out + "/head_load.json", head_load.to_json().dump(1) + "\n");
  std::vector<std::string> names;
  if (cfg.data.dataset == DatasetKind::fashion_mnist) names = datasets::fashion_mnist_classes();
  return head_load.write_png(out + "/head_load.png", names) ? out + "/head_load.png" : "";
}

}  // namespace

ClassifierEvalResult evaluate_classifier_checkpoint(const ClassifierEvalRequest& r) {
  if (!r.out.empty()) check_output_dir(r.out, "--out " + r.out);
  std::optional<LoadedClassifier> loaded;
  if (!r.checkpoint.empty()) loaded = load_classifier_checkpoint(r.checkpoint, r.ema);
  const ExperimentConfig cfg = eval_config(r, loaded);
  validate_experiment(cfg, ExperimentUse::train);
  if (!loaded && cfg.model.weights.empty())
    throw UserError(r.program, "missing --checkpoint PATH",
                    "a checkpoint or run directory, or --weights FILE (e.g. an official .pth)");
  const RunContext ctx = RunContext::create(r.device.empty() ? cfg.train.device : r.device, Precision::fp32, 0);
  LoadedClassifier m = evaluated_model(cfg, loaded);
  const vision::TransNeXtOptions mo = m.model->options;
  m.model->to(ctx.device);
  vision::HeadLoadStats head_load(mo, mo.num_classes);
  const ClassifierSplit val(cfg, mo, /*train=*/false);
  // `moh launch -- eval ...`: each rank evaluates its share of the same model and split
  const auto group = dist::Group::join(ctx, {{"config (sha256 of the resolved YAML)", sha256_hex(to_yaml(cfg))},
                                             {"weights", m.source() + " " + m.weights}});
  ClassifierEvalResult out;
  out.result = evaluate_sharded(m.model, val, cfg.data.eval_batch_size, ctx, *group, &head_load);
  out.source = m.source(), out.weights = m.weights, out.step = m.step, out.main = group->is_main();
  if (!out.main) return out;  // rank 0 reports
  const EvalResult& e = out.result;
  const std::vector<std::string>& keys = classifier_eval_metrics();
  out.report = {{"metrics", {{keys[0], e.top1}, {keys[1], e.top5}, {keys[2], e.loss}}},
                {"checkpoint", m.source()},
                {"weights", m.weights},
                {"model", m.cfg.model.name},
                {"count", e.count},
                {"weights_sha256", sha256_file(m.weights_file)},
                {"provenance", provenance(ctx.device)}};
  if (m.step >= 0) out.report["step"] = m.step;
  if (r.out.empty()) return out;
  eval::write_report(r.out, out.report, "Classifier evaluation: " + m.cfg.model.name);
  if (mo.routed_layers() > 0) out.head_load_png = write_head_load(r.out, head_load, cfg);
  return out;
}

nlohmann::json evaluate_sample_set(const eval::GenerativeEvalOptions& o, const std::string& device,
                                   const std::string& out) {
  return evaluate_sample_set(o, device, out, datasets::open_image_source(o.samples));
}

nlohmann::json evaluate_sample_set(const eval::GenerativeEvalOptions& o, const std::string& device,
                                   const std::string& out, std::unique_ptr<datasets::ImageSource> samples) {
  const RunContext ctx = RunContext::create(device, Precision::fp32, 0);
  const std::unique_ptr<eval::FeatureNet> net = make_feature_net(o.features, ctx, o.resize);
  nlohmann::json report = eval::evaluate_generative(o, *net, std::move(samples));
  if (!out.empty()) eval::write_report(out, report, "Generative evaluation: " + o.samples);
  return report;
}

const std::vector<std::string>& classifier_eval_metrics() {
  static const std::vector<std::string> keys{"top1", "top5", "loss"};
  return keys;
}

eval::SweepMeasure checkpoint_measurer(const CheckpointMeasure& m) {
  return [m](const std::string& checkpoint, eval::SweepWeights w, const std::string& dir) {
    if (m.eval) {
      ClassifierEvalRequest e = *m.eval;
      e.checkpoint = checkpoint, e.out = dir + "/eval", e.ema = w == eval::SweepWeights::fixed_ema;
      return evaluate_classifier_checkpoint(e).report;
    }
    SamplingRequest s = m.sample.value_or(SamplingRequest{});
    s.checkpoint = checkpoint, s.out = dir + "/samples", s.raw = w == eval::SweepWeights::raw;
    run_sampling(s);
    eval::GenerativeEvalOptions f = m.fid.value();
    f.samples = dir + "/samples/samples.npz";
    nlohmann::json report = evaluate_sample_set(f, m.fid_device, dir + "/fid");
    report["sampling"] = nlohmann::json::parse(read_file(dir + "/samples/sampling.json", "sampling record"));
    report["step"] = report["sampling"].value("step", nlohmann::json());
    if (!m.keep_samples) std::filesystem::remove(dir + "/samples/samples.npz");
    return report;
  };
}

}  // namespace moh::experiments
