// Classification trainer: exact resume, refusal to overwrite a run, schedule shape, loader determinism.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/train/checkpoint.h"
#include "datasets/loader.h"
#include "experiments/classifier_experiment.h"
#include "experiments/registry.h"
#include "tests/test_util.h"
#include "vision/classifier_trainer.h"
#include "vision/nn/head_surgery.h"
#include "vision/nn/moh_attention.h"

namespace moh::vision {
namespace {

bool have_fashion_mnist() {
  return std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz");
}

experiments::ExperimentConfig tiny_config(const test::TempDir& d) {
  std::string f = d.write("tiny.yaml", R"(
model: {name: MoH-ViT-Nano}
data: {batch_size: 64, limit_train: 256, limit_val: 128, shift: 2, hflip: true}
optim: {lr: 2.0e-3}
schedule: {kind: cosine, unit: step, warmup_epochs: 1}
train: {epochs: 2, log_every_steps: 1, seed: 3, )" +
                                           test::train_device_keys() + R"(}
)");
  return experiments::load_experiment(f);
}

std::vector<std::string> metric_lines(const std::string& run) {
  std::istringstream in(read_file(run + "/metrics.jsonl"));
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    for (const char* k : {"img_per_s", "time", "elapsed_s"}) j.erase(k);  // timing, not a result
    out.push_back(j.dump());
  }
  return out;
}

// Stopping after epoch 1 and resuming gives the same weights and the same metric lines as an uninterrupted run.
TEST(ClassificationTrainer, ResumeIsExact) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  experiments::ExperimentConfig cfg = tiny_config(d);
  const LoopResult full = experiments::train_experiment(cfg, {d.file("full"), ""});
  experiments::ExperimentConfig first = cfg;
  first.train.max_steps = 4;  // 256 / 64 = 4 steps: stop at the end of epoch 1
  experiments::train_experiment(first, {d.file("split"), ""});
  EXPECT_THROW(experiments::train_experiment(cfg, {d.file("split"), ""}),
               UserError);  // never overwrites an existing run
  const LoopResult resumed = experiments::train_experiment(cfg, {d.file("split"), "auto"});
  EXPECT_EQ(resumed.steps, full.steps);
  EXPECT_EQ(scalar(resumed.final_eval, "top1"), scalar(full.final_eval, "top1"));
  EXPECT_EQ(scalar(resumed.final_eval, "val_loss"), scalar(full.final_eval, "val_loss"));
  TensorMap a = load_checkpoint(d.file("full")).model, b = load_checkpoint(d.file("split")).model;
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) EXPECT_TRUE(torch::equal(v, b.at(k))) << k;
  EXPECT_EQ(metric_lines(d.file("full")), metric_lines(d.file("split")));
  // Every evaluation logs the head load of the steps before it: one row per routed layer, shares summing to 1.
  int evaluations = 0;
  for (const auto& l : metric_lines(d.file("full"))) {
    const auto j = nlohmann::json::parse(l);
    if (!j.contains("top1")) continue;
    ++evaluations;
    ASSERT_TRUE(j.contains("head_load")) << l;
    ASSERT_GT(j["head_load"].size(), 0u);
    for (const auto& row : j["head_load"]) {
      double sum = 0;
      for (const auto& v : row) sum += v.get<double>();
      EXPECT_NEAR(sum, 1.0, 1e-3) << l;
    }
  }
  EXPECT_EQ(evaluations, 2);
}

// Training forwards count each routed head's picks (what the trainer logs); evaluation forwards count nothing.
TEST(HeadLoad, TrainingForwardsCountTheirPicks) {
  torch::manual_seed(0);
  nn::MoHAttention a(nn::MoHAttentionOptions{64, 8}.moh(2, 3));  // 2 shared, top-3 of 6 routed
  a->train();
  const at::Tensor x1 = torch::randn({2, 5, 64}), x2 = torch::randn({2, 5, 64});
  const at::Tensor r1 = a->forward(x1).routed, r2 = a->forward(x2).routed;
  const at::Tensor expected = at::bincount(r1.reshape({-1}), {}, 6) + at::bincount(r2.reshape({-1}), {}, 6);
  std::vector<at::Tensor> loads = nn::take_training_load(*a);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_TRUE(torch::equal(loads[0], expected));
  EXPECT_EQ(loads[0].sum().item<int64_t>(), 2 * 2 * 5 * 3);
  EXPECT_FALSE(a->training_load.defined());  // taken: reset
  a->eval();
  a->forward(x1);
  EXPECT_EQ(nn::take_training_load(*a)[0].sum().item<int64_t>(), 0);
}

TEST(HeadLoad, CountsPerLayerAndClass) {
  TransNeXtOptions o = classifier_options("MoH-ViT-Nano");  // routed stages 3 (top-4 of 6) and 4 (top-2 of 4)
  HeadLoadStats stats(o, 3);
  std::vector<at::Tensor> routed(static_cast<size_t>(o.total_layers()));
  const size_t first = static_cast<size_t>(o.depths[0] + o.depths[1]);  // first stage-3 block
  // 2 images × 2 tokens, top-4: image 0 (class 2) always picks heads 0-3, image 1 (class 0) heads 2-5.
  routed[first] = torch::tensor({{0, 1, 2, 3}, {0, 1, 2, 3}, {2, 3, 4, 5}, {2, 3, 4, 5}});
  stats.add(routed, torch::tensor({2, 0}));
  nlohmann::json j = stats.to_json();
  const auto& layer = j["layers"][0];
  EXPECT_EQ(layer["name"], "stage3.block0");
  EXPECT_EQ(layer["selections"].get<double>(), 16.0);
  EXPECT_EQ(layer["per_class"][2], (std::vector<double>{0.25, 0.25, 0.25, 0.25, 0, 0}));
  EXPECT_EQ(layer["per_class"][0], (std::vector<double>{0, 0, 0.25, 0.25, 0.25, 0.25}));
  EXPECT_EQ(layer["per_class"][1], (std::vector<double>(6, 0.0)));
  EXPECT_EQ(layer["overall"], (std::vector<double>{0.125, 0.125, 0.25, 0.25, 0.125, 0.125}));
  EXPECT_EQ(j["layers"].size(), static_cast<size_t>(o.routed_layers()));
}

// Two evaluations side by side: one row per input in each layer's panel, the table's entropy share and weakest head
// from the shares by hand, and evaluations of different models refused.
TEST(HeadLoad, ComparisonOfTwoEvaluations) {
  auto load = [](std::vector<double> a, std::vector<double> b) {
    return nlohmann::json{
        {"layers", {{{"name", "stage3.block0"}, {"overall", a}}, {{"name", "stage4.block0"}, {"overall", b}}}}};
  };
  const HeadLoadComparison c = compare_head_loads(
      {{"converted", load({0.25, 0.25, 0.25, 0.25}, {0.5, 0.5})}, {"tuned", load({0.5, 0.25, 0.25, 0.0}, {0.9, 0.1})}});
  ASSERT_EQ(c.panels.size(), 2u);
  EXPECT_EQ(c.panels[0].row_labels, (std::vector<std::string>{"converted", "tuned"}));
  EXPECT_TRUE(c.panels[1].shares.equal(torch::tensor({{0.5, 0.5}, {0.9, 0.1}}, torch::kDouble)));
  // stage3, tuned: H = −(0.5 ln 0.5 + 2 · 0.25 ln 0.25) = 1.0397, / ln 4 = 0.75; weakest head 0 × 4.
  EXPECT_NE(c.markdown.find("| stage3.block0 | 1.0000 | 1.00 | 0.7500 | 0.00 |"), std::string::npos) << c.markdown;
  // stage4, tuned: H = −(0.9 ln 0.9 + 0.1 ln 0.1) = 0.3251, / ln 2 = 0.4690; weakest 0.1 × 2 = 0.20.
  EXPECT_NE(c.markdown.find("| stage4.block0 | 1.0000 | 1.00 | 0.4690 | 0.20 |"), std::string::npos) << c.markdown;
  EXPECT_THROW(compare_head_loads({{"a", load({0.5, 0.5}, {1})}, {"b", load({0.5, 0.5, 0.0}, {1})}}), UserError);
  EXPECT_THROW(compare_head_loads({{"a", nlohmann::json{{"top1", 90}}}}), UserError);
}

}  // namespace
}  // namespace moh::vision
