#include "experiments/convert.h"

#include <torch/optim/adam.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/platform/amp.h"
#include "core/train/checkpoint.h"
#include "experiments/registry.h"
#include "vision/nn/head_surgery.h"

namespace moh::experiments {

// The runs of commands are written in the families' words.
using namespace ::moh::diffusion;

namespace {

bool is_router_tensor(const std::string& name) {
  for (const char* suffix : {".wg.weight", ".wg_0.weight", ".wg_1.weight"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

std::string shape_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// The target's tensors from the dense ones by name; routers the dense model cannot have start at zero.
void match_tensors(const TensorMap& model, const TensorMap& dense, const std::string& origin, const std::string& target,
                   ConvertResult& r) {
  const std::string hint = "convert a dense model of " + target +
                           "'s widths and depths; to keep another model's widths give its own name with "
                           "model.shared_heads / model.topk (docs/CONTINUE.md)";
  for (const auto& [name, t] : dense)
    if (is_router_tensor(name))
      throw UserError(origin, "holds the router tensor '" + name + "': the weights are already MoH",
                      "convert the dense model they came from");
  for (const auto& [name, t] : dense)
    if (!model.count(name)) throw UserError(origin, "tensor '" + name + "' has no place in " + target, hint);
  for (const auto& [name, t] : model) {
    auto it = dense.find(name);
    if (it == dense.end()) {
      if (!is_router_tensor(name)) throw UserError(origin, "lacks tensor '" + name + "' of " + target, hint);
      r.weights[name] = at::zeros_like(t);
      r.created.push_back(name);
      continue;
    }
    if (!it->second.sizes().equals(t.sizes()))
      throw UserError(origin,
                      "tensor '" + name + "' is " + shape_text(it->second) + " there and " + shape_text(t) + " in " +
                          target + " (widths or depths differ)",
                      hint);
    r.weights[name] = it->second.to(t.scalar_type()).contiguous();
    r.reused.push_back(name);
  }
}

// Batches of the target's training data, cycling over epochs.
class CalibrationBatches {
 public:
  CalibrationBatches(const TrainTask& task, const c10::Device& device) : task_(task), device_(device) {}
  std::pair<at::Tensor, at::Tensor> next() {
    at::Tensor x, y;
    for (int tries = 0; tries < 2; ++tries) {
      if (!stream_) stream_ = task_.train_batches(epoch_++, 0, 1, 0);
      if (stream_->next(x, y)) return {x.to(device_), y.to(device_)};
      stream_.reset();
    }
    throw std::runtime_error("calibration: the training split yields no batch");
  }

 private:
  const TrainTask& task_;
  c10::Device device_;
  std::unique_ptr<BatchStream> stream_;
  int64_t epoch_ = 0;
};

// Layers with a choice to make: MoH with some, but not all, heads shared.
std::vector<std::pair<std::string, nn::HeadControl*>> choosable(torch::nn::Module& model) {
  std::vector<std::pair<std::string, nn::HeadControl*>> out;
  for (auto& [name, c] : nn::head_controls(model))
    if (c->shared_count() > 0 && c->shared_count() < c->head_count()) out.emplace_back(name, c);
  return out;
}

// Mean contribution norm of every head, over `batches` training batches (eval mode, the dense function).
std::vector<at::Tensor> head_importance(torch::nn::Module& model, TrainTask& task, const ConvertOptions& o,
                                        const c10::Device& device) {
  auto layers = choosable(model);
  for (auto& [name, c] : layers) {
    c->head_hooks = nn::HeadHooks{};
    c->head_hooks.record = true;
  }
  CalibrationBatches batches(task, device);
  const GradScaler scaler(Precision::fp32);
  for (int64_t b = 0; b < o.calib_batches; ++b) {
    auto [x, y] = batches.next();
    task.backward(model, x, y, StepInfo{0, b, 0, {}}, scaler);
    model.zero_grad();
  }
  std::vector<at::Tensor> scores;
  for (auto& [name, c] : layers) {
    scores.push_back(c->head_hooks.mean_norms(c->head_count()));
    c->head_hooks = nn::HeadHooks{};
  }
  return scores;
}

// One score per head learned with the weights frozen: forward keeps the h_s top-scored heads of each layer (binary),
// backward goes straight through sigmoid(score).
std::vector<at::Tensor> learned_scores(torch::nn::Module& model, TrainTask& task, const ConvertOptions& o,
                                       const c10::Device& device) {
  auto layers = choosable(model);
  std::vector<at::Tensor> scores;
  for (auto& [name, c] : layers)
    scores.push_back(at::zeros({c->head_count()}, at::TensorOptions().device(device)).requires_grad_(true));
  for (auto& p : model.parameters()) p.requires_grad_(false);
  torch::optim::Adam adam(scores, torch::optim::AdamOptions(o.mask_lr));
  CalibrationBatches batches(task, device);
  const GradScaler scaler(Precision::fp32);
  for (int64_t step = 0; step < o.mask_steps; ++step) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const at::Tensor soft = at::sigmoid(scores[i]);
      const at::Tensor keep = std::get<1>(scores[i].detach().topk(layers[i].second->shared_count()));
      const at::Tensor hard = at::zeros_like(soft).index_fill_(0, keep, 1.0);
      layers[i].second->head_hooks.scale = hard + soft - soft.detach();  // value: hard; gradient: through soft
    }
    auto [x, y] = batches.next();
    adam.zero_grad();
    task.backward(model, x, y, StepInfo{0, step, step, {}}, scaler);
    adam.step();
  }
  for (auto& [name, c] : layers) c->head_hooks = nn::HeadHooks{};
  for (auto& p : model.parameters()) p.requires_grad_(true);
  std::vector<at::Tensor> out;
  for (const auto& s : scores) out.push_back(s.detach().to(at::kCPU, at::kDouble));
  return out;
}

// The h_s highest scores (ties: the lower index).
std::vector<int64_t> top_heads(const at::Tensor& scores, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(scores.numel()));
  std::iota(idx.begin(), idx.end(), 0);
  const auto s = scores.accessor<double, 1>();
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// Chooses and permutes the shared heads of every choosable layer (weights already loaded into `model`).
void choose_shared(torch::nn::Module& model, TrainTask& task, const ConvertOptions& o, const c10::Device& device,
                   ConvertResult& r) {
  std::map<std::string, int64_t> topk;
  for (auto& [name, c] : nn::head_controls(model)) {  // every routed head on: the dense function (routers at zero)
    topk[name] = c->routed_topk();
    if (c->routed_topk() > 0) c->set_routed_topk(c->head_count() - c->shared_count());
  }
  std::vector<at::Tensor> scores;
  if (o.shared == SharedChoice::importance) scores = head_importance(model, task, o, device);
  if (o.shared == SharedChoice::learned) scores = learned_scores(model, task, o, device);
  const auto layers = choosable(model);
  for (size_t i = 0; i < layers.size(); ++i) {
    nn::HeadControl& c = *layers[i].second;
    LayerConversion lc{layers[i].first, c.head_count(), c.shared_count(), topk[layers[i].first], {}, {}};
    if (scores.empty()) {
      lc.shared_heads.resize(static_cast<size_t>(lc.shared));
      std::iota(lc.shared_heads.begin(), lc.shared_heads.end(), 0);
    } else {
      lc.shared_heads = top_heads(scores[i], lc.shared);
      std::sort(lc.shared_heads.begin(), lc.shared_heads.end());
      lc.scores.assign(scores[i].data_ptr<double>(), scores[i].data_ptr<double>() + scores[i].numel());
      nn::permute_heads(r.weights, nn::HeadLayout{lc.name, lc.heads, lc.shared, 0, c.head_tensors()},
                        nn::shared_first_permutation(lc.heads, lc.shared_heads));
    }
    r.layers.push_back(std::move(lc));
  }
}

}  // namespace

SharedChoice shared_choice_from(const std::string& name) {
  if (name == "first") return SharedChoice::first;
  if (name == "importance") return SharedChoice::importance;
  if (name == "learned") return SharedChoice::learned;
  throw UserError("--shared-heads " + name, "unknown choice", "first, importance or learned");
}

const char* to_string(SharedChoice c) {
  switch (c) {
    case SharedChoice::first:
      return "first";
    case SharedChoice::importance:
      return "importance";
    case SharedChoice::learned:
      return "learned";
  }
  return "first";
}

ConvertResult convert_to_moh(const ExperimentConfig& target_in, const ConvertOptions& o, const RunContext& ctx) {
  ExperimentConfig target = target_in;
  target.model.weights.clear();  // the converted weights replace any initialisation
  validate_experiment(target, ExperimentUse::train);
  const ModelFamily& family = experiment_family(target);
  if (o.calib_batches < 1 || o.mask_steps < 1 || !(o.mask_lr > 0))
    throw UserError("calibration", "--calib-batches and --mask-steps must be ≥ 1, --mask-lr > 0", "");
  const TensorMap dense = load_weights_tensors(o.source, o.key);
  torch::manual_seed(target.train.seed);
  std::unique_ptr<TrainTask> task = family.task(target, ctx);
  std::shared_ptr<torch::nn::Module> model = task->build_model();
  ConvertResult r;
  r.target = task->describe();
  bool moh = false;
  for (auto& [name, c] : nn::head_controls(*model)) moh = moh || c->shared_count() > 0 || c->routed_topk() > 0;
  if (!moh)
    throw UserError("model " + target.model.name, "has no MoH layer to convert into",
                    "pick a MoH variant or set model.shared_heads / model.topk");
  match_tensors(module_tensors(*model), dense, "--in " + o.source, target.model.name, r);
  load_module_tensors(*model, r.weights, o.source);
  model->to(ctx.device);
  model->eval();
  choose_shared(*model, *task, o, ctx.device, r);
  return r;
}

void write_conversion(const std::string& out, const ExperimentConfig& target_in, const ConvertOptions& o,
                      const ConvertResult& r) {
  ExperimentConfig target = target_in;
  target.model.weights.clear();
  target.model.weights_key.clear();
  save_checkpoint(out, TrainerState{}, r.weights, {}, to_yaml(target), {{"cpu", cpu_rng_state()}}, r.weights);
  write_file_atomic(out + "/config.resolved.yaml", to_yaml(target));
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : r.layers)
    layers.push_back({{"name", l.name},
                      {"heads", l.heads},
                      {"shared", l.shared},
                      {"shared_heads", l.shared_heads},
                      {"scores", l.scores}});
  const nlohmann::json j{{"source", o.source},
                         {"key", o.key},
                         {"target", r.target},
                         {"shared_choice", to_string(o.shared)},
                         {"calib_batches", o.calib_batches},
                         {"mask_steps", o.mask_steps},
                         {"mask_lr", o.mask_lr},
                         {"reused", r.reused.size()},
                         {"created", r.created},
                         {"layers", layers}};
  write_file_atomic(out + "/conversion.json", j.dump(1) + "\n");
}

}  // namespace moh::experiments
