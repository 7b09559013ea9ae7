// Dense → MoH conversion (experiments/convert.h) for both families: head permutations keep the dense function,
// a converted model with every routed head on is the dense model (both routers, forward and backward), importance
// picks the heads that contribute most, and the refusals.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/train/checkpoint.h"
#include "diffusion/dit.h"
#include "experiments/classifier_experiment.h"
#include "experiments/convert.h"
#include "experiments/dit_experiment.h"
#include "experiments/registry.h"
#include "tests/test_util.h"
#include "vision/nn/head_surgery.h"
#include "vision/transnext.h"

namespace moh {
namespace {

using experiments::ConvertOptions;
using experiments::SharedChoice;

experiments::ExperimentConfig fashion(const std::string& file, std::vector<std::string> sets) {
  sets.insert(sets.begin(), {"data.limit_train=64", "data.batch_size=16", "train.precision=fp32"});
  return experiments::load_experiment(test::source_path("configs/fashion_mnist/", file), sets);
}

// Moves every parameter off its initial value (DiT's adaLN-Zero would hide the attention; TransNeXt's temperature
// and learnable bias start equal for every head, which would hide a wrong permutation).
void perturb(torch::nn::Module& m, uint64_t seed, double scale = 0.02) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : m.parameters()) p.add_(torch::randn_like(p) * scale);
}

// One model of either family behind one forward: DiT (x, t, y) or the classifier's logits.
struct AnyModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};
AnyModel build(const experiments::ExperimentConfig& cfg) {
  if (cfg.model.name.rfind("DiT", 0) == 0 || cfg.model.name.rfind("MoH-DiT", 0) == 0) {
    auto m = diffusion::DiT(experiments::dit_options_for(cfg));
    return {m.ptr(), [m](const torch::Tensor& x) mutable {
              const auto n = x.size(0);
              return m
                  ->forward(x, torch::arange(n, x.options()) * 97.0,
                            torch::arange(n, x.options().dtype(torch::kLong)) % 10)
                  .out;
            }};
  }
  auto m = vision::TransNeXt(experiments::classifier_options_for(cfg));
  return {m.ptr(), [m](const torch::Tensor& x) mutable { return m->forward(x).logits; }};
}
torch::Tensor input_for(const experiments::ExperimentConfig& cfg, torch::ScalarType dtype) {
  torch::manual_seed(5);
  const bool dit = cfg.model.name.find("DiT") != std::string::npos;
  return torch::randn({3, 1, dit ? 28 : 32, dit ? 28 : 32}, torch::TensorOptions().dtype(dtype));
}

TEST(Convert, PermutingHeadsKeepsTheDenseFunction) {
  for (const char* file : {"dit_pixel.yaml", "mha_vit_nano.yaml"})
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      SCOPED_TRACE(std::string(file) + (dtype == torch::kDouble ? " fp64" : " fp32"));
      const experiments::ExperimentConfig cfg = fashion(file, {});
      AnyModel a = build(cfg), b = build(cfg);
      perturb(*a.module, 1);
      a.module->to(dtype);
      b.module->to(dtype);
      a.module->eval();
      b.module->eval();
      TensorMap w = module_tensors(*a.module);
      const TensorMap before = w;
      torch::manual_seed(2);
      int64_t layers = 0;
      for (auto& [name, c] : nn::head_controls(*a.module)) {
        const auto perm = torch::randperm(c->head_count(), torch::kLong);
        nn::permute_heads(w, {name, c->head_count(), 0, 0, c->head_tensors()},
                          std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + perm.numel()));
        ++layers;
      }
      EXPECT_GT(layers, 4);
      double moved = 0;  // the permutation did change the weights
      for (const auto& [name, t] : w) moved = std::max(moved, (t - before.at(name)).abs().max().item<double>());
      EXPECT_GT(moved, 1e-3);
      load_module_tensors(*b.module, w, "permuted");
      const torch::Tensor x = input_for(cfg, dtype);
      torch::NoGradGuard no_grad;
      EXPECT_LE(test::rel_err(b.forward(x), a.forward(x)), dtype == torch::kDouble ? 1e-12 : 1e-6);
    }
}

// Dense weights of `dense_cfg`'s model (perturbed) in a file.
std::string dense_file(const experiments::ExperimentConfig& dense_cfg, const test::TempDir& dir, AnyModel& dense) {
  dense = build(dense_cfg);
  perturb(*dense.module, 3);
  const std::string path = dir.file("dense.safetensors");
  save_safetensors(path, module_tensors(*dense.module));
  return path;
}

// The dense gradients carried through the conversion's head permutations (names of the MoH model).
TensorMap permuted_grads(torch::nn::Module& dense, torch::nn::Module& moh, const experiments::ConvertResult& r) {
  TensorMap g;
  for (const auto& item : dense.named_parameters())
    if (item.value().grad().defined()) g[item.key()] = item.value().grad().clone();
  std::map<std::string, nn::HeadControl*> controls;
  for (auto& [name, c] : nn::head_controls(moh)) controls[name] = c;
  for (const auto& l : r.layers)
    nn::permute_heads(g, {l.name, l.heads, l.shared, l.topk, controls.at(l.name)->head_tensors()},
                      nn::shared_first_permutation(l.heads, l.shared_heads));
  return g;
}

struct Case {
  const char* dense;
  std::vector<std::string> every_head;  // the MoH split with K = the whole routed pool
};

TEST(Convert, EveryRoutedHeadOnEqualsTheDenseModelForwardAndBackward) {
  const std::vector<Case> cases{{"dit_pixel.yaml", {"model.shared_heads=[4]", "model.topk=[4]"}},
                                {"mha_vit_nano.yaml", {"model.shared_heads=[2,2,2,4]", "model.topk=[0,2,6,4]"}}};
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  for (const Case& c : cases)
    for (const char* router : {"learned", "query_norm"})
      for (SharedChoice choice : {SharedChoice::first, SharedChoice::importance, SharedChoice::learned}) {
        SCOPED_TRACE(std::string(c.dense) + " router " + router + " shared " + experiments::to_string(choice));
        const test::TempDir dir;
        AnyModel dense;
        ConvertOptions o;
        o.source = dense_file(fashion(c.dense, {}), dir, dense);
        o.shared = choice;
        o.calib_batches = 2;
        o.mask_steps = 3;
        std::vector<std::string> sets = c.every_head;
        sets.push_back(std::string("model.router=") + router);
        const experiments::ExperimentConfig target = fashion(c.dense, sets);
        const experiments::ConvertResult r = experiments::convert_to_moh(target, o, ctx);
        EXPECT_EQ(r.created.empty(), std::string(router) == "query_norm");  // learned routers are new (zeros)
        for (const auto& name : r.created) EXPECT_EQ(r.weights.at(name).abs().max().item<double>(), 0.0) << name;
        AnyModel moh = build(target);
        load_module_tensors(*moh.module, r.weights, "converted");
        dense.module->eval();
        moh.module->eval();
        const torch::Tensor x = input_for(target, torch::kFloat);
        const torch::Tensor yd = dense.forward(x), ym = moh.forward(x);
        EXPECT_LE(test::rel_err(ym, yd), 1e-6);
        // Backward in fp64, where rounding cannot hide a difference: gradients of every dense tensor, carried
        // through the head permutation, relative to the tensor's own, or to the largest one for tensors whose true
        // gradient is 0 (a per-head constant logit bias under softmax: rounding noise in both models).
        dense.module->to(torch::kDouble);
        moh.module->to(torch::kDouble);
        dense.forward(x.to(torch::kDouble)).square().mean().backward();
        moh.forward(x.to(torch::kDouble)).square().mean().backward();
        const TensorMap g = permuted_grads(*dense.module, *moh.module, r);
        double largest = 0;
        for (const auto& [name, t] : g) largest = std::max(largest, t.abs().max().item<double>());
        for (const auto& item : moh.module->named_parameters()) {
          if (!g.count(item.key()) || !item.value().grad().defined()) continue;  // router layers
          const torch::Tensor& ref = g.at(item.key());
          const double scale = std::max(ref.abs().max().item<double>(), 1e-6 * largest);
          EXPECT_LE((item.value().grad() - ref).abs().max().item<double>() / scale, 1e-9) << item.key();
        }
      }
}

TEST(Convert, ImportanceSharesTheHeadsThatContributeMost) {
  const test::TempDir dir;
  const experiments::ExperimentConfig dense_cfg = fashion("dit_pixel.yaml", {});
  AnyModel dense = build(dense_cfg);
  perturb(*dense.module, 4);
  {
    torch::NoGradGuard no_grad;  // heads 5 and 2 of every layer: outputs through W_O 30× larger
    for (auto& [name, c] : nn::head_controls(*dense.module)) {
      auto& proj = dynamic_cast<nn::MoHAttentionImpl&>(*c).proj->weight;
      const int64_t d = proj.size(1) / c->head_count();
      for (int64_t h : {5, 2}) proj.narrow(1, h * d, d).mul_(30.0);
    }
  }
  save_safetensors(dir.file("dense.safetensors"), module_tensors(*dense.module));
  ConvertOptions o;
  o.source = dir.file("dense.safetensors");
  o.shared = SharedChoice::importance;
  o.calib_batches = 2;
  const experiments::ExperimentConfig target = fashion("dit_pixel.yaml", {"model.shared_heads=[2]", "model.topk=[3]"});
  const auto r = experiments::convert_to_moh(target, o, RunContext::create("cpu", Precision::fp32, 0));
  ASSERT_EQ(r.layers.size(), 6u);
  for (const auto& l : r.layers) {
    EXPECT_EQ(l.shared_heads, (std::vector<int64_t>{2, 5})) << l.name;
    EXPECT_EQ(l.topk, 3);
    ASSERT_EQ(l.scores.size(), 8u);
  }
  // With `first`, the same layers keep heads 0 and 1.
  o.shared = SharedChoice::first;
  for (const auto& l : experiments::convert_to_moh(target, o, RunContext::create("cpu", Precision::fp32, 0)).layers)
    EXPECT_EQ(l.shared_heads, (std::vector<int64_t>{0, 1}));
}

TEST(Convert, RefusesWeightsOfAnotherShapeOrAlreadyMoH) {
  const test::TempDir dir;
  AnyModel dense;
  const experiments::ExperimentConfig dense_cfg = fashion("dit_pixel.yaml", {});
  ConvertOptions o;
  o.source = dense_file(dense_cfg, dir, dense);
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  auto message = [&](const experiments::ExperimentConfig& target, const std::string& source) {
    ConvertOptions oo = o;
    oo.source = source;
    try {
      experiments::convert_to_moh(target, oo, ctx);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const experiments::ExperimentConfig moh = fashion("moh_dit_pixel.yaml", {});
  EXPECT_NE(message(fashion("moh_vit_nano.yaml", {}), o.source).find("has no place in"), std::string::npos);
  TensorMap w = load_safetensors(o.source).tensors;
  w["blocks.0.attn.qkv.weight"] = w["blocks.0.attn.qkv.weight"].narrow(0, 0, 96);
  save_safetensors(dir.file("narrow.safetensors"), w);
  EXPECT_NE(message(moh, dir.file("narrow.safetensors")).find("widths or depths differ"), std::string::npos);
  AnyModel m = build(moh);
  save_safetensors(dir.file("moh.safetensors"), module_tensors(*m.module));
  EXPECT_NE(message(moh, dir.file("moh.safetensors")).find("already MoH"), std::string::npos);
  EXPECT_NE(message(dense_cfg, o.source).find("no MoH layer"), std::string::npos);
}

TEST(Convert, HeadSplitOverridesAreChecked) {
  auto refused = [](const std::string& file, std::vector<std::string> sets) {
    try {
      experiments::validate_experiment(fashion(file, std::move(sets)));
    } catch (const UserError& e) {
      return std::string(e.what()).find("model.shared_heads") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused("dit_pixel.yaml", {"model.shared_heads=[4]"}));                        // no topk
  EXPECT_TRUE(refused("dit_pixel.yaml", {"model.shared_heads=[9]", "model.topk=[0]"}));      // 8 heads
  EXPECT_TRUE(refused("dit_pixel.yaml", {"model.shared_heads=[4]", "model.topk=[5]"}));      // pool of 4
  EXPECT_TRUE(refused("dit_pixel.yaml", {"model.shared_heads=[4]", "model.topk=[0]"}));      // K = 0 needs all shared
  EXPECT_TRUE(refused("dit_pixel.yaml", {"model.shared_heads=[4,4]", "model.topk=[2,2]"}));  // 6 layers
  EXPECT_TRUE(refused("mha_vit_nano.yaml", {"model.shared_heads=[2]", "model.topk=[0]"}));   // 4 stages
  EXPECT_FALSE(refused("dit_pixel.yaml", {"model.shared_heads=[4,4,4,4,8,8]", "model.topk=[2,2,2,2,0,0]"}));
  const auto o = experiments::dit_options_for(fashion("dit_pixel.yaml", {"model.shared_heads=[4]", "model.topk=[2]"}));
  EXPECT_NEAR(o.active_ratio(), 0.75, 1e-12);
  EXPECT_EQ(o.routed_layers(), 6);
  const auto v = experiments::classifier_options_for(
      fashion("mha_vit_nano.yaml", {"model.shared_heads=[2,2,2,4]", "model.topk=[0,1,4,2]"}));
  EXPECT_NEAR(v.active_ratio(), vision::classifier_options("MoH-ViT-Nano-75").active_ratio(), 1e-12);
}

}  // namespace
}  // namespace moh
