// train.paired: variants of one seed start with equal weights wherever they share a parameter (each module drawn from
// a generator seeded by its name), in both model families; without it the draws follow module order and differ.
#include <string>

#include "diffusion/dit.h"
#include "tests/test_util.h"
#include "vision/nn/model_config.h"
#include "vision/transnext.h"

namespace moh {
namespace {

// Parameters of b also in a (same name and shape): how many, and how many of them hold different values.
std::pair<int, int> shared_and_different(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters();
  int shared = 0, different = 0;
  for (const auto& p : b.named_parameters()) {
    const at::Tensor* other = pa.find(p.key());
    if (!other || other->sizes() != p.value().sizes()) continue;
    ++shared;
    different += !torch::equal(*other, p.value());
  }
  return {shared, different};
}

diffusion::DiT dit(const std::string& name, int64_t init_seed) {
  diffusion::DiTOptions o = diffusion::dit_options(name);
  o.init_seed = init_seed;
  torch::manual_seed(11);  // as the training loop seeds before building; by name, the draws ignore it
  return diffusion::DiT(o);
}

vision::TransNeXt classifier(const std::string& name, int64_t init_seed) {
  vision::TransNeXtOptions o = vision::classifier_options(name);
  o.init_seed = init_seed;
  torch::manual_seed(11);
  return vision::TransNeXt(o);
}

TEST(Paired, DiTVariantsShareTheirCommonInitialWeights) {
  for (const char* moh : {"MoH-DiT-Pixel/2-75", "MoH-DiT-Pixel/2-90"}) {
    auto [shared, different] = shared_and_different(*dit("DiT-Pixel/2", 3), *dit(moh, 3));
    EXPECT_GT(shared, 40) << moh;
    EXPECT_EQ(different, 0) << moh;
    // In module order the routers shift every later draw: the same test then finds differences.
    std::tie(shared, different) = shared_and_different(*dit("DiT-Pixel/2", -1), *dit(moh, -1));
    EXPECT_GT(different, 10) << moh;
  }
  // Another seed, other weights (all but the zero-initialised biases and adaLN layers).
  EXPECT_GT(shared_and_different(*dit("DiT-Pixel/2", 3), *dit("DiT-Pixel/2", 4)).second, 20);
}

TEST(Paired, ClassifierVariantsShareTheirCommonInitialWeights) {
  for (const char* moh : {"MoH-ViT-Nano-75", "MoH-ViT-Nano-50", "MoA-ViT-Nano"}) {
    auto [shared, different] = shared_and_different(*classifier("ViT-Nano", 5), *classifier(moh, 5));
    EXPECT_GT(shared, 60) << moh;
    EXPECT_EQ(different, 0) << moh;
    std::tie(shared, different) = shared_and_different(*classifier("ViT-Nano", -1), *classifier(moh, -1));
    EXPECT_GT(different, 10) << moh;
  }
}

TEST(Paired, ModuleSeedsDependOnSeedAndName) {
  EXPECT_EQ(module_seed(1, "blocks.0.attn.qkv"), module_seed(1, "blocks.0.attn.qkv"));
  EXPECT_NE(module_seed(1, "blocks.0.attn.qkv"), module_seed(2, "blocks.0.attn.qkv"));
  EXPECT_NE(module_seed(1, "blocks.0.attn.qkv"), module_seed(1, "blocks.1.attn.qkv"));
  EXPECT_LT(module_seed(7, "x"), uint64_t{1} << 63);
}

}  // namespace
}  // namespace moh
