// Device-following tests: MOH_TEST_DEVICE (cpu by default; cuda on a GPU machine, scripts/gpu_check.sh) picks the
// device; each test computes there and compares with the same computation in fp64 on the CPU, within the tolerance of
// the dtype (test::tolerance). TF32 is off so that fp32 means fp32. On the CPU they check fp32 and bf16 autocast
// against fp64, which is what they check on a GPU too.
#include <ATen/Context.h>

#include "core/platform/amp.h"
#include "core/platform/run_context.h"
#include "core/train/ema.h"
#include "diffusion/dit.h"
#include "diffusion/gaussian_diffusion.h"
#include "diffusion/sampler.h"
#include "eval/inception.h"
#include "tests/test_util.h"
#include "vision/transnext.h"

namespace moh {
namespace {

using test::rel_err;

struct NoTf32 {
  NoTf32() { at::globalContext().setAllowTF32CuBLAS(false), at::globalContext().setAllowTF32CuDNN(false); }
};

double err(const at::Tensor& got, const at::Tensor& ref) {
  return rel_err(got.detach().to(at::kCPU, at::kDouble), ref.detach().to(at::kCPU, at::kDouble));
}

// The worst relative error over every parameter's gradient of `got` against `ref` (same names).
double worst_grad(torch::nn::Module& got, torch::nn::Module& ref) {
  auto r = ref.named_parameters();
  double worst = 0;
  for (const auto& p : got.named_parameters())
    if (p.value().grad().defined() && r[p.key()].grad().abs().max().item<double>() > 1e-9)
      worst = std::max(worst, err(p.value().grad(), r[p.key()].grad()));
  return worst;
}

template <class M>
void copy_weights(M& dst, M& src) {
  torch::NoGradGuard ng;
  auto s = src->named_parameters();
  for (auto& p : dst->named_parameters()) p.value().copy_(s[p.key()]);
  auto sb = src->named_buffers();
  for (auto& b : dst->named_buffers()) b.value().copy_(sb[b.key()]);
}

diffusion::DiT tiny_dit(AttentionPath path) {
  diffusion::DiTOptions o = diffusion::dit_options("MoH-DiT-Pixel/4-75");
  o.input_size = 8, o.in_channels = 3, o.depth = 2, o.num_classes = 10;
  o.heads = {{8, 2}}, o.shared = {{4, 2}}, o.topk = {{2, 2}};
  o.path = path;
  torch::manual_seed(0);
  diffusion::DiT m(o);
  torch::NoGradGuard ng;
  for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.05);  // adaLN-Zero: a non-trivial network
  return m;
}

// A MoH-DiT forward and backward (both attention paths) on the device, fp32 and bf16 autocast, against fp64 CPU.
TEST(OnDevice, DiTForwardBackwardMatchesFp64Cpu) {
  NoTf32 no_tf32;
  const torch::Device dev = test::device();
  for (AttentionPath path : {AttentionPath::dense, AttentionPath::sparse}) {
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      diffusion::DiT ref = tiny_dit(path), got = tiny_dit(path);
      ref->to(at::kDouble), got->to(dev);
      ref->eval(), got->eval();  // the router's choice without noise: the same heads on both sides
      torch::manual_seed(1);
      at::Tensor x = torch::randn({4, 3, 8, 8}, at::kDouble), t = torch::tensor({0, 10, 500, 999});
      at::Tensor y = torch::tensor({1, 3, 10, 7});  // 10 = the null class of CFG
      at::Tensor out_ref = ref->forward(x, t, y).out, out;
      {
        AutocastScope scope(RunContext::create(test::device_name(), p, 0));
        out = got->forward(x.to(dev, at::kFloat), t.to(dev), y.to(dev)).out;
      }
      out_ref.square().mean().backward();
      out.to(at::kFloat).square().mean().backward();
      const double tol = test::tolerance(p == Precision::bf16 ? at::kBFloat16 : at::kFloat);
      EXPECT_EQ(out.device(), dev);
      EXPECT_LE(err(out, out_ref), tol) << "path " << static_cast<int>(path) << " precision " << static_cast<int>(p);
      EXPECT_LE(worst_grad(*got, *ref), p == Precision::bf16 ? 0.1 : 1e-4) << "gradients";
    }
  }
}

// A MoH-ViT (TransNeXt) forward and backward on the device (on CUDA: the sliding-window kernels), fp32.
TEST(OnDevice, TransNeXtForwardBackwardMatchesFp64Cpu) {
  NoTf32 no_tf32;
  const torch::Device dev = test::device();
  for (AttentionPath path : {AttentionPath::dense, AttentionPath::sparse}) {
    vision::TransNeXtOptions o = vision::classifier_options("MoH-ViT-Nano-75");
    o.img_size = 32, o.in_chans = 1, o.num_classes = 10, o.attention_path = path;
    torch::manual_seed(3);
    vision::TransNeXt ref(o), got(o);
    copy_weights(got, ref);
    ref->to(at::kDouble), got->to(dev);
    ref->eval(), got->eval();
    at::Tensor img = torch::randn({2, 1, 32, 32}, at::kDouble);
    at::Tensor a = ref->forward(img).logits, b = got->forward(img.to(dev, at::kFloat)).logits;
    a.square().sum().backward();
    b.square().sum().backward();
    EXPECT_LE(err(b, a), test::tolerance(at::kFloat)) << "path " << static_cast<int>(path);
    EXPECT_LE(worst_grad(*got, *ref), 1e-4) << "gradients, path " << static_cast<int>(path);
  }
}

// The hybrid loss (ε MSE + VLB of the learned σ) and a DDIM chain with CFG on the device against fp64 CPU.
TEST(OnDevice, DiffusionLossAndSamplerMatchFp64Cpu) {
  NoTf32 no_tf32;
  const torch::Device dev = test::device();
  const auto d = diffusion::GaussianDiffusion::base(1000);
  torch::manual_seed(2);
  at::Tensor x0 = torch::rand({3, 3, 4, 4}, at::kDouble) * 2 - 1, noise = torch::randn({3, 3, 4, 4}, at::kDouble);
  at::Tensor t = torch::tensor({0, 5, 700}), out = torch::randn({3, 6, 4, 4}, at::kDouble);
  auto ref = d.training_losses(out, x0, d.q_sample(x0, t, noise), t, noise);
  auto f = [&](const at::Tensor& v) { return v.to(dev, at::kFloat); };
  auto got = d.training_losses(f(out), f(x0), d.q_sample(f(x0), t.to(dev), f(noise)), t.to(dev), f(noise));
  EXPECT_LE(err(got.loss, ref.loss), 1e-4);  // the VLB's log terms at t = 0 lose a few more bits in fp32
  EXPECT_LE(err(got.mse, ref.mse), test::tolerance(at::kFloat));

  diffusion::DiT m_ref = tiny_dit(AttentionPath::dense), m = tiny_dit(AttentionPath::dense);
  m_ref->to(at::kDouble), m->to(dev);
  m_ref->eval(), m->eval();
  const auto chain = diffusion::GaussianDiffusion::respaced(1000, "ddim10");
  diffusion::SampleOptions so;
  so.sampler = SamplerKind::ddim;
  so.cfg_scale = 2.0;
  at::Tensor z = torch::randn({2, 3, 8, 8}, at::kDouble), labels = torch::tensor({2, 5});
  torch::NoGradGuard ng;
  at::Tensor a = diffusion::sample_loop(m_ref, chain, z, labels, so);
  at::Tensor b = diffusion::sample_loop(m, chain, z.to(dev, at::kFloat), labels.to(dev), so);
  EXPECT_EQ(b.device(), dev);
  EXPECT_LE(err(b, a), 1e-4);  // ten steps of fp32 rounding through the network
}

// TransNeXt's pooling under deterministic kernels (avg_pool2d where the pool divides the map) equals the official
// adaptive_avg_pool2d; elsewhere it is the official pooling itself.
TEST(OnDevice, DeterministicPoolingEqualsTheOfficialPooling) {
  const torch::Device dev = test::device();
  torch::manual_seed(7);
  for (int64_t side : {14, 9}) {  // 14 -> 7: divisible; 9 -> 7: overlapping adaptive windows
    at::Tensor x = torch::randn({2, 8, side, side}, at::kDouble), ref = at::adaptive_avg_pool2d(x, {7, 7});
    EXPECT_LE(err(vision::average_pool(x.to(dev, at::kFloat), 7, 7, true), ref), test::tolerance(at::kFloat)) << side;
  }
  at::Tensor x = torch::randn({2, 8, 14, 14}, at::kDouble);  // the identity the substitution rests on
  EXPECT_LE(err(at::avg_pool2d(x, {2, 2}, {2, 2}), at::adaptive_avg_pool2d(x, {7, 7})), 1e-12);
}

// EMA updates and fp16 loss scaling (CUDA only) on the device; the EMA equals its fp64 CPU formula.
TEST(OnDevice, EmaAndLossScaling) {
  const torch::Device dev = test::device();
  torch::manual_seed(4);
  torch::nn::Linear model(8, 4), shadow(8, 4);
  model->to(dev), shadow->to(dev);
  ModelEma ema(shadow.ptr(), 0.9, /*warmup=*/false);
  const at::Tensor w0 = shadow->weight.detach().to(at::kCPU, at::kDouble);
  ema.update(*model, 1);
  const at::Tensor want = 0.9 * w0 + 0.1 * model->weight.detach().to(at::kCPU, at::kDouble);
  EXPECT_LE(err(shadow->weight, want), test::tolerance(at::kFloat));
  if (!dev.is_cuda()) return;  // fp16 autocast is CUDA's (RunContext refuses it on a CPU)
  GradScaler scaler(Precision::fp16);
  auto params = model->parameters();
  model->weight.mutable_grad() = torch::full_like(model->weight, 65536.0f * 2);
  model->bias.mutable_grad() = torch::zeros_like(model->bias);
  EXPECT_TRUE(scaler.unscale_and_update(params));
  EXPECT_LE(err(model->weight.grad(), torch::full({4, 8}, 2.0, at::kDouble)), 1e-7);
  model->weight.mutable_grad()[0][0].fill_(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(scaler.unscale_and_update(params));  // overflow: skip the step, halve the scale
  EXPECT_EQ(scaler.current_scale(), 32768.0);
}

// Sampling chains replayed as CUDA graphs (sampling.cuda_graph) against the eager chain on the same device: DDPM with
// CFG and a guidance interval (doubled and un-doubled batches: two graphs), DPM-Solver++ with a head-budget schedule
// (a graph per K), fp32 and bf16 autocast. The same kernels run, so the samples agree to fp32 rounding at most. The
// sparse path reads bucket sizes back to the host and cannot be captured: it falls back to eager, same samples.
TEST(OnDevice, CudaGraphSamplingEqualsTheEagerChain) {
  NoTf32 no_tf32;
  const torch::Device dev = test::device();
  if (!dev.is_cuda() || !diffusion::cuda_graphs_built()) GTEST_SKIP() << "CUDA graphs need a GPU and a CUDA LibTorch";
  for (AttentionPath path : {AttentionPath::dense, AttentionPath::sparse}) {
    diffusion::DiT model = tiny_dit(path);
    model->to(dev), model->eval();
    diffusion::SampleOptions ddpm;
    ddpm.cfg_scale = 4.0, ddpm.cfg_channels = CfgChannels::all, ddpm.cfg_interval = {0.0, 0.5};
    diffusion::SampleOptions dpm = ddpm;
    dpm.sampler = SamplerKind::dpmpp_2m, dpm.ode_steps = 6, dpm.topk_schedule = {1, 2};
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      for (const diffusion::SampleOptions& o : {ddpm, dpm}) {
        const diffusion::GaussianDiffusion chain =
            diffusion::sampling_chain(o.sampler, 1000, o.sampler == SamplerKind::ddpm ? "10" : "1000");
        RunContext ctx;
        ctx.device = dev, ctx.precision = p;
        const at::Tensor labels = torch::tensor({1, 7, 3}).to(dev);
        auto run = [&](diffusion::GraphedForward* graphs) {
          AutocastScope ac(ctx);
          torch::manual_seed(5);
          const at::Tensor noise = torch::randn({3, 3, 8, 8}).to(dev);
          return diffusion::sample_loop(model, chain, noise, labels, o, {}, nullptr, graphs).cpu();
        };
        const at::Tensor eager = run(nullptr);
        diffusion::GraphedForward graphs(model, true);
        const at::Tensor graphed = run(&graphs), again = run(&graphs);  // a second run replays the same graphs
        const std::string what = config::to_string(path) + " " + config::to_string(p) + " " +
                                 config::to_string(o.sampler) + " (" + std::to_string(graphs.graphs()) +
                                 " graphs, fallback: " + graphs.fallback_reason() + ")";
        if (path == AttentionPath::dense) {
          EXPECT_GT(graphs.replays(), 0) << what;
          EXPECT_TRUE(graphs.fallback_reason().empty()) << what;
        }
        EXPECT_LE(err(graphed, eager), test::tolerance(at::kFloat)) << what;
        EXPECT_TRUE(torch::equal(graphed, again)) << what;
        std::cerr << "[cuda graph] " << what << ": bitwise equal to eager: " << torch::equal(graphed, eager) << "\n";
      }
    }
  }
}

// The FID Inception network (random weights: only the arithmetic is compared) on the device against fp64 CPU.
TEST(OnDevice, FidInceptionFeaturesMatchFp64Cpu) {
  NoTf32 no_tf32;
  const torch::Device dev = test::device();
  torch::manual_seed(6);
  eval::FIDInceptionV3 ref, got;
  copy_weights(got, ref);
  ref->to(at::kDouble), got->to(dev);
  ref->eval(), got->eval();
  torch::NoGradGuard ng;
  at::Tensor x = torch::rand({2, 3, 299, 299}, at::kDouble) * 2 - 1;
  const eval::InceptionFeatures a = ref->forward(x), b = got->forward(x.to(dev, at::kFloat));
  EXPECT_LE(err(b.pool, a.pool), 1e-4);  // 40-odd conv + batch-norm layers of fp32 accumulation
  EXPECT_LE(err(b.spatial, a.spatial), 1e-4);
  EXPECT_LE(err(b.logits, a.logits), 1e-4);
}

// precision: tf32 (train.precision, sampling.precision) reaches the device: on a GPU a fp32 product inside a Tf32Scope
// rounds its inputs to TF32 (10-bit mantissa: relative error about 1e-3, not fp32's 1e-6), outside it it is exact
// fp32 again; on a CPU the scope changes nothing.
TEST(OnDevice, Tf32ScopeRoundsCudaProductsAndOnlyThere) {
  NoTf32 no_tf32;
  const torch::Device dev = test::device();
  torch::manual_seed(7);
  const at::Tensor a = at::randn({512, 512}, at::kDouble), b = at::randn({512, 512}, at::kDouble);
  const at::Tensor ref = at::matmul(a, b), ad = a.to(dev, at::kFloat), bd = b.to(dev, at::kFloat);
  const double strict = err(at::matmul(ad, bd), ref);
  double tf32 = 0;
  {
    const Tf32Scope on(Precision::tf32);
    tf32 = err(at::matmul(ad, bd), ref);
  }
  EXPECT_LE(strict, 1e-5);
  EXPECT_LE(err(at::matmul(ad, bd), ref), 1e-5);  // the scope ended: exact fp32 again
  if (dev.is_cuda()) {
    EXPECT_GT(tf32, 1e-4) << "TF32 was not used";
    EXPECT_LE(tf32, 1e-2);
  } else {
    EXPECT_EQ(tf32, strict);
  }
}

// The provenance a result file carries names the device it ran on (the GPU's own name there).
TEST(OnDevice, ProvenanceNamesTheDevice) {
  const torch::Device dev = test::device();
  const nlohmann::json p = provenance(dev);
  EXPECT_EQ(p.at("device"), dev.str());
  EXPECT_EQ(p.at("libtorch"), libtorch_version());
  if (dev.is_cuda()) {
    EXPECT_NE(p.at("device_name"), "unknown");
    EXPECT_NE(p.at("device_name"), cpu_model_name());
    EXPECT_FALSE(p.contains("threads"));  // CPU threads do not decide a GPU result
  } else {
    EXPECT_EQ(p.at("device_name"), cpu_model_name());
  }
}

}  // namespace
}  // namespace moh
