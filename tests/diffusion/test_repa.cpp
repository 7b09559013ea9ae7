// REPA (diffusion/repa.h, experiments/repa_encoders.h, vision/dinov2.h): the projector's names and place in the DiT,
// the projection loss against a direct computation and its bounds, the REPA term of a training step (weighted,
// gradients into the projector only, none into the encoder), the DINOv2 ViT's names and size; and (under
// tests/pyref_test.sh repa, MOH_REPA_REF=DIR) REPA's loss.py written out in Python and timm's
// vit_base_patch14_dinov2 on random weights (tests/diffusion/ref_repa.py).
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/repa.h"
#include "eval/features.h"
#include "experiments/repa_encoders.h"
#include "tests/diffusion/tiny_dit.h"
#include "vision/dinov2.h"

namespace moh::diffusion {
namespace {

double repa_rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         b.to(at::kDouble).abs().max().item<double>();
}

DiT repa_dit(std::vector<int64_t> z_dims, int64_t depth = 2) {
  DiTOptions o = tiny_dit(1, true)->options;
  o.repa_depth = depth;
  o.repa_projector_dim = 16;
  o.repa_z_dims = std::move(z_dims);
  torch::manual_seed(1);
  return DiT(o);
}

// The loss written as loops: per encoder, sample and token, −⟨z, z̃⟩ / (max(‖z‖, ε)·max(‖z̃‖, ε)).
double direct_loss(const std::vector<at::Tensor>& zs, const std::vector<at::Tensor>& targets) {
  double total = 0;
  const int64_t N = zs[0].size(0);
  for (size_t e = 0; e < zs.size(); ++e)
    for (int64_t n = 0; n < N; ++n) {
      double per_sample = 0;
      const int64_t T = zs[e].size(1);
      for (int64_t t = 0; t < T; ++t) {
        const at::Tensor a = zs[e][n][t].to(at::kDouble), b = targets[e][n][t].to(at::kDouble);
        const double na = std::max(a.norm().item<double>(), 1e-12), nb = std::max(b.norm().item<double>(), 1e-12);
        per_sample -= (a * b).sum().item<double>() / (na * nb);
      }
      total += per_sample / static_cast<double>(T);
    }
  return total / static_cast<double>(zs.size() * N);
}

TEST(Repa, ProjectorsCarryREPAsNamesAndOnlyWhenAsked) {
  const DiT plain = tiny_dit(1, true);
  for (const auto& p : plain->named_parameters()) EXPECT_EQ(p.key().rfind("projectors", 0), std::string::npos);
  const DiT m = repa_dit({5, 7});
  const auto params = m->named_parameters();
  const int64_t D = m->options.hidden_size;
  EXPECT_EQ(params["projectors.0.0.weight"].sizes(), (std::vector<int64_t>{16, D}));
  EXPECT_EQ(params["projectors.0.2.weight"].sizes(), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(params["projectors.0.4.weight"].sizes(), (std::vector<int64_t>{5, 16}));
  EXPECT_EQ(params["projectors.1.4.bias"].sizes(), (std::vector<int64_t>{7}));
  EXPECT_EQ(params.size(), plain->named_parameters().size() + 12);
  EXPECT_THROW(repa_dit({5}, 3), UserError);  // block 3 of a 2-block model
}

TEST(Repa, ProjectionsAreOfTheChosenBlocksTokens) {
  for (int64_t depth : {1, 2}) {
    DiT m = repa_dit({5}, depth);
    m->train();
    const at::Tensor x = torch::randn({2, 1, 8, 8}), t = torch::tensor({3, 700}), y = torch::tensor({1, 2});
    const at::Tensor none = torch::zeros({2}, at::kBool);
    const DiTOutput out = m->forward(x, t, y, none);
    ASSERT_EQ(out.zs.size(), 1u);
    torch::NoGradGuard ng;
    at::Tensor h = m->x_embedder->forward(x) + m->pos_embed;
    const at::Tensor c = m->t_embedder->forward(t) + m->y_embedder->forward(y, none);
    for (int64_t i = 0; i < depth; ++i) h = m->blocks[static_cast<size_t>(i)]->as<DiTBlockImpl>()->forward(h, c).out;
    const at::Tensor want = m->projectors[0]->as<torch::nn::Sequential>()->forward(h);  // (N, T, 5)
    EXPECT_LE(repa_rel_err(out.zs[0], want), 1e-6) << "block " << depth;
    m->eval();
    EXPECT_TRUE(m->forward(x, t, y).zs.empty());  // sampling runs no projector
  }
}

TEST(Repa, LossIsTheMeanNegativeCosine) {
  torch::manual_seed(2);
  std::vector<at::Tensor> zs{torch::randn({3, 4, 6}), torch::randn({3, 4, 2})};
  const std::vector<at::Tensor> tg{torch::randn({3, 4, 6}), torch::randn({3, 4, 2})};
  zs[0][1][2].zero_();
  EXPECT_NEAR(repa_loss(zs, tg).item<double>(), direct_loss(zs, tg), 1e-6);
  const at::Tensor a = torch::randn({2, 5, 3});
  EXPECT_NEAR(repa_loss({a}, {a * 3.0}).item<double>(), -1.0, 1e-6);  // aligned: −1, whatever the scale
  EXPECT_NEAR(repa_loss({a}, {-a}).item<double>(), 1.0, 1e-6);
}

TEST(Repa, TrainingStepAddsTheWeightedTermAndTrainsOnlyTheProjector) {
  for (double weight : {0.0, 0.5}) {
    DiT m = repa_dit({4});
    m->train();
    at::Tensor enc = torch::randn({16, 4}).set_requires_grad(true);  // a stand-in encoder with a parameter
    RepaTerm repa;
    repa.weight = weight;
    repa.targets = [enc](const at::Tensor& img) {  // (B, 1, 8, 8) → (B, 4, 4): one target per 4×4 patch
      return at::matmul(img.reshape({img.size(0), 2, 4, 2, 4}).permute({0, 1, 3, 2, 4}).reshape({-1, 4, 16}), enc);
    };
    FlowConfig fc;
    const FlowProcess flow(fc);
    RunContext ctx;
    const GradScaler scaler(Precision::fp32);
    torch::manual_seed(5);
    const LossTensors r =
        flow_backward(m, flow, torch::randn({2, 1, 8, 8}), torch::tensor({0, 1}), 0.01, ctx, scaler, 0, 1, repa);
    ASSERT_EQ(r.back().first, "repa");
    EXPECT_TRUE(std::isfinite(r.back().second.item<double>()));
    EXPECT_FALSE(enc.grad().defined());  // the encoder is frozen: no graph through it
    const at::Tensor g = m->named_parameters()["projectors.0.4.weight"].grad();
    ASSERT_TRUE(g.defined());
    if (weight == 0.0) {
      EXPECT_EQ(g.abs().sum().item<double>(), 0.0);
    } else {
      EXPECT_GT(g.abs().sum().item<double>(), 0.0);
    }
  }
}

TEST(Repa, ChecksRefuseMissingLatentsBlocksAndEncoders) {
  experiments::ExperimentConfig cfg;
  cfg.repa.encoder = "/nonexistent/dinov2.safetensors";
  cfg.repa.depth = 2;
  const DiTOptions dit = dit_options("MoH-DiT-Pixel/4-75");  // 6 blocks
  const auto message = [&](const experiments::ExperimentConfig& c) -> std::string {
    try {
      experiments::check_repa(c, dit);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(cfg).find("no such file"), std::string::npos) << message(cfg);
  experiments::ExperimentConfig latent = cfg;
  latent.data.dataset = DatasetKind::latents;
  latent.data.root = "/nonexistent/latents";
  EXPECT_NE(message(latent).find("no meta.json"), std::string::npos) << message(latent);
  // without files (moh config): the depth only
  EXPECT_NO_THROW(experiments::check_repa(latent, dit, /*files=*/false));
  experiments::ExperimentConfig deep = cfg;
  deep.repa.depth = 7;
  EXPECT_NE(message(deep).find("is not a block of"), std::string::npos) << message(deep);
  EXPECT_THROW(experiments::check_repa(deep, dit, /*files=*/false), UserError);
  experiments::ExperimentConfig off = latent;
  off.repa.encoder.clear();
  EXPECT_EQ(message(off), "");  // no encoder, no REPA: nothing to check
}

TEST(DinoV2, NamesAndSizeAreTimmsViTB14) {
  const vision::DinoV2 m{vision::DinoV2Options{}};
  const auto params = m->named_parameters();
  int64_t n = 0;
  for (const auto& p : params) n += p.value().numel();
  EXPECT_EQ(n, 86579712);  // timm 1.0.31 vit_base_patch14_dinov2 (tests/diffusion/ref_repa.py prints it)
  for (const char* k : {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.11.attn.qkv.bias",
                        "blocks.11.ls1.gamma", "blocks.11.mlp.fc2.weight", "blocks.0.norm2.bias", "norm.weight"})
    EXPECT_TRUE(params.contains(k)) << k;
  EXPECT_EQ(params["pos_embed"].sizes(), (std::vector<int64_t>{1, 1 + 37 * 37, 768}));
  TensorMap w;
  for (const auto& p : params) w[p.key()] = p.value();
  const vision::DinoV2Options o = vision::dinov2_options_for_weights(w, "test");
  EXPECT_EQ(o.depth, 12);
  EXPECT_EQ(o.num_heads, 12);
  EXPECT_EQ(o.pos_grid, 37);
  w.erase("blocks.0.attn.qkv.weight");
  EXPECT_THROW(vision::dinov2_options_for_weights(w, "test"), UserError);
}

// REPA's loss.py and timm's DINOv2 (tests/diffusion/ref_repa.py) when tests/pyref_test.sh repa points MOH_REPA_REF at
// them.
class RepaReference : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("MOH_REPA_REF");
    if (!dir) GTEST_SKIP() << "MOH_REPA_REF unset (tests/pyref_test.sh repa sets it)";
    dir_ = dir;
    ref_ = load_safetensors(dir_ + "/repa.safetensors").tensors;
  }
  std::string dir_;
  TensorMap ref_;
};

TEST_F(RepaReference, LossIsREPAs) {
  const std::vector<at::Tensor> zs{ref_.at("zs_0"), ref_.at("zs_1")}, tg{ref_.at("tgt_0"), ref_.at("tgt_1")};
  const double both = repa_loss(zs, tg).item<double>(), one = repa_loss({zs[0]}, {tg[0]}).item<double>();
  const double r1 = std::abs(both - ref_.at("loss").item<double>()) / std::abs(ref_.at("loss").item<double>());
  const double r2 =
      std::abs(one - ref_.at("loss_single").item<double>()) / std::abs(ref_.at("loss_single").item<double>());
  std::cout << "max rel vs REPA loss.py (fp32 of fp64 inputs): " << std::max(r1, r2) << "\n";
  EXPECT_LE(std::max(r1, r2), 1e-5);
}

TEST_F(RepaReference, DinoV2EqualsTimmAndREPAsTargets) {
  double worst = 0;
  const auto expect_close = [&](const at::Tensor& got, const std::string& key, const std::string& what) {
    const double r = repa_rel_err(got, ref_.at(key));
    worst = std::max(worst, r);
    EXPECT_LE(r, 1e-5) << what;
  };
  vision::DinoV2 timm_file = vision::load_dinov2(dir_ + "/dinov2_timm.safetensors");
  vision::DinoV2 official_file = vision::load_dinov2(dir_ + "/dinov2_official.pth");
  EXPECT_EQ(official_file->options.positions, vision::DinoV2Positions::official);
  torch::NoGradGuard ng;
  for (int64_t side : {98, 224}) {
    const std::string s = std::to_string(side);
    expect_close(timm_file->forward_patch_tokens(ref_.at("images_" + s)), "feats_" + s, "timm file at " + s);
    const vision::DinoV2Tokens o = official_file->forward_tokens(ref_.at("images_" + s));
    expect_close(at::cat({o.cls.unsqueeze(1), o.patches}, 1), "official_" + s, "official file at " + s);
  }
  vision::DinoV2Options large;
  large.embed_dim = 1024, large.depth = 24, large.num_heads = 16;
  int64_t n = 0;
  for (const auto& p : vision::DinoV2(large)->parameters()) n += p.numel();
  EXPECT_EQ(n, ref_.at("timm_params_large").item<int64_t>());
  experiments::ExperimentConfig cfg;
  cfg.repa.encoder = dir_ + "/dinov2_timm.safetensors";
  cfg.repa.depth = 1;
  DiTOptions dit = dit_options("DiT-Pixel/4");  // 28 px, 7×7 tokens → 98 px encoder input
  const experiments::RepaEncoder e = experiments::make_repa_encoder(cfg, dit, RunContext{});
  expect_close(e.targets(ref_.at("repa_images")), "repa_targets", "REPA's preprocessing + DINOv2");
  EXPECT_EQ(e.dim, 768);
  std::cout << "max rel vs timm vit_base_patch14_dinov2 (and the official position resampling): " << worst << "\n";
}

TEST_F(RepaReference, FdDinoV2FeaturesAreEDM2s) {
  const std::unique_ptr<eval::FeatureNet> net = eval::make_dinov2_net(dir_ + "/dinov2_official.pth", RunContext{});
  const at::Tensor got = net->extract(ref_.at("fd_images")).pool;
  const double r = repa_rel_err(got, ref_.at("fd_cls"));
  std::cout << "max rel vs EDM2's DINOv2 detector (written out): " << r << "\n";
  EXPECT_LE(r, 1e-5);
  EXPECT_FALSE(net->has_spatial());
}

}  // namespace
}  // namespace moh::diffusion
