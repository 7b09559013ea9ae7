// MoH-DiT routing analytics: the statistics equal a direct count on a small fixed input, and the observer sees what
// the network routed (a sampling chain through a tiny MoH-DiT fills them).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "diffusion/head_load.h"
#include "tests/diffusion/tiny_dit.h"

namespace moh::diffusion {
namespace {

DiTOptions two_layers() {
  DiTOptions o = dit_options("MoH-DiT-Pixel/4-75");
  o.depth = 2;
  o.num_classes = 3;
  o.heads = {{8, 2}};
  o.shared = {{4, 2}};
  o.topk = {{2, 2}};  // top-2 of a pool of 4
  return o;
}

at::Tensor sel(std::vector<int64_t> v, int64_t rows) {
  return torch::tensor(v, torch::kLong).view({rows, 2});
}

TEST(DiTHeadLoadStats, EqualADirectCountOnAFixedInput) {
  DiTHeadLoadStats s(two_layers(), /*buckets=*/4, /*timesteps=*/100);
  // Two images of two tokens each: image 0 at t = 90 (bucket 3), class 1; image 1 at t = 10 (bucket 0), null (3).
  s.add({sel({0, 1, 0, 2, 3, 1, 3, 2}, 4), at::Tensor()}, torch::tensor({90, 10}), torch::tensor({1, 3}));
  // The next step of the same images (t smaller for both): token 0 keeps {0,1} (other order), token 1 {0,2} → {0,3},
  // token 2 keeps {1,3}, token 3 {2,3} → {0,1}: 2 of 4 tokens changed.
  s.add({sel({1, 0, 3, 0, 1, 3, 0, 1}, 4), at::Tensor()}, torch::tensor({80, 5}), torch::tensor({1, 3}));
  // A new batch (t goes up): counted, but not compared with the last step of the previous one.
  s.add({sel({0, 1, 0, 1}, 2), at::Tensor()}, torch::tensor({99}), torch::tensor({0}));
  const nlohmann::json j = s.to_json();
  ASSERT_EQ(j["layers"].size(), 2u);  // both blocks are routed; block 1 was handed no selections (undefined)
  EXPECT_EQ(j["layers"][1]["selections"].get<double>(), 0.0);
  const auto& l = j["layers"][0];
  EXPECT_EQ(l["block"], 0);
  EXPECT_EQ(l["selections"].get<double>(), 20.0);  // (4 + 4 + 2 tokens) × K = 2
  // bucket 3 (t 75..99): image 0 twice (heads 0,1,0,2 then 1,0,3,0) + the new batch's 0,1,0,1 → counts 6,4,1,1
  const std::vector<double> b3{6 / 12.0, 4 / 12.0, 1 / 12.0, 1 / 12.0};
  for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(l["by_timestep"][3][e].get<double>(), b3[e], 1e-12);
  // bucket 0 (t 0..24): image 1 twice (3,1,3,2 then 1,3,0,1) → counts 1,3,1,3
  const std::vector<double> b0{1 / 8.0, 3 / 8.0, 1 / 8.0, 3 / 8.0};
  for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(l["by_timestep"][0][e].get<double>(), b0[e], 1e-12);
  EXPECT_EQ(l["by_timestep"][1][0].get<double>(), 0.0);
  // by class: class 1 = image 0 (4,2,1,1)/8; null row = image 1 (1,3,1,3)/8; class 0 = the new batch (2,2,0,0)/4
  EXPECT_NEAR(l["by_class"][1][0].get<double>(), 4 / 8.0, 1e-12);
  EXPECT_NEAR(l["by_class"][3][3].get<double>(), 3 / 8.0, 1e-12);
  EXPECT_NEAR(l["by_class"][0][1].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(l["topk_change_share"].get<double>(), 0.5, 1e-12);
  EXPECT_EQ(l["compared_tokens"].get<double>(), 4.0);
  // overall counts 7,7,2,4 of 20 → entropy by hand
  double h = 0;
  for (double c : {7.0, 7.0, 2.0, 4.0}) h -= c / 20 * std::log(c / 20);
  EXPECT_NEAR(l["entropy"].get<double>(), h, 1e-12);
  EXPECT_NEAR(l["entropy_share"].get<double>(), h / std::log(4.0), 1e-12);
  EXPECT_EQ(j["class_rows"].back(), "null");
  EXPECT_EQ(j["timestep_buckets"][3][0], 75);
  EXPECT_EQ(s.evaluations(), 3);
}

TEST(DiTHeadLoadStats, TheObserverSeesWhatTheNetworkRoutedWithDroppedLabelsAsNull) {
  DiT m = tiny_dit(1, true);
  std::vector<at::Tensor> seen_routed;
  at::Tensor seen_y;
  m->routing_observer = [&](const std::vector<at::Tensor>& r, const at::Tensor&, const at::Tensor& y) {
    seen_routed = r, seen_y = y;
  };
  torch::NoGradGuard ng;
  const at::Tensor x = torch::randn({2, 1, 8, 8});
  m->forward(x, torch::tensor({500, 20}), torch::tensor({3, 4}), torch::tensor({0, 1}));
  ASSERT_EQ(seen_routed.size(), 2u);
  EXPECT_EQ(seen_routed[0].sizes(), (at::IntArrayRef{2 * 4, 2}));  // (N·T, K): 2 images of 2×2 patches, top-2
  EXPECT_EQ(seen_y[0].item<int64_t>(), 3);
  EXPECT_EQ(seen_y[1].item<int64_t>(), m->options.num_classes);  // dropped: the null class
  // Every selection is an index into the routed pool of 4 heads.
  EXPECT_GE(seen_routed[1].min().item<int64_t>(), 0);
  EXPECT_LT(seen_routed[1].max().item<int64_t>(), 4);
}

}  // namespace
}  // namespace moh::diffusion
