// DiT / MoH-DiT registry (exact parameter counts, tiny forward/backward, zero output at init, official key names)
// and the diffusion schedule/respacing against float64 values of guided-diffusion's linear schedule and respace.py.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/train/checkpoint.h"
#include "diffusion/diffusion_schedule.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/dit.h"
#include "tests/test_util.h"

namespace moh::diffusion {
namespace {

using test::count_params;

// Exact counts from the spec tables (model.parameters(), pos_embed included), 256 px / 32×32×4 latents.
const std::map<std::string, int64_t>& expected_counts() {
  static const std::map<std::string, int64_t> m{
      {"DiT-S/2", 32963360},
      {"DiT-S/4", 32945024},
      {"DiT-S/8", 33148160},
      {"DiT-B/2", 130512416},
      {"DiT-B/4", 130475648},
      {"DiT-B/8", 130881536},
      {"DiT-L/2", 458102816},
      {"DiT-L/4", 458053760},
      {"DiT-L/8", 458594816},
      {"DiT-XL/2", 675129632},
      {"DiT-XL/4", 675074432},
      {"DiT-XL/8", 675683072},
      {"MoH-DiT-S/2-90", 32997152},
      {"MoH-DiT-S/2-75", 32998688},
      {"MoH-DiT-B/2-90", 130638368},
      {"MoH-DiT-B/2-75", 130638368},
      {"MoH-DiT-L/2-90", 458512416},
      {"MoH-DiT-L/2-75", 458528800},
      {"MoH-DiT-XL/2-90", 675666464},
      {"MoH-DiT-XL/2-75", 675689504},
      // This toolkit's pixel-space variants (no official count): D = 128, 6 layers, 49 tokens of 4×4×1, 10 classes.
      // MHA by hand: patch 2,176 + t-embedder 49,408 + label table 11·128 + pos 49·128 + 6 × 296,832 per block +
      // final layer 37,152 = 1,877,408; MoH adds a bias-free router of 4 + 2 + 4 outputs per layer (6 × 1,280).
      {"DiT-Pixel/4", 1877408},
      {"MoH-DiT-Pixel/4-75", 1877408 + 6 * 1280},
      // The patch-2 pixel variants: D = 64, 4 heads, 196 tokens of 2×2×1: patch 320 + t-embedder 20,608 + labels
      // 11·64 + pos 196·64 + 6 × 74,688 per block + final layer 8,840 = 491,144; MoH's router has 2 + 2 + 2 outputs
      // (2 shared and 2 routed heads) in every layer (6 × 384).
      {"DiT-Pixel/2", 491144},
      {"MoH-DiT-Pixel/2-75", 491144 + 6 * 384},
      {"MoH-DiT-Pixel/2-90", 491144 + 3 * 384 + 3 * 256},  // wg, wg_0, wg_1 (64 → 2 each); then wg_1 (64 → 4)
      // LightningDiT (16×16×32 VA-VAE latents, RMSNorm, SwiGLU, RoPE, no learned σ): hustvl/LightningDiT's
      // models/lightningdit.py run on 2026-11-26 with its released config (use_swiglu, use_rope, use_rmsnorm).
      {"LightningDiT-B/1", 130556192},
      {"LightningDiT-B/2", 130556288},
      {"LightningDiT-XL/1", 675256736},
      {"LightningDiT-XL/2", 675256832},
      // No official MoH-LightningDiT: LightningDiT-XL/1 plus what MoH-DiT-XL/2-90's head schedule adds to DiT-XL/2's
      // attention (675,666,464 − 675,129,632; the block options do not touch the attention's parameters).
      {"MoH-LightningDiT-XL/1-90", 675256736 + (675666464 - 675129632)}};
  return m;
}

// pos_embed (1, T, D) is the only parameter whose size depends on the input; checked directly on one model here so
// the registry test below can build every variant small.
TEST(DiTRegistry, ExactParameterCountAtFullSize) {
  DiT m(dit_options("MoH-DiT-S/2-75"));
  EXPECT_EQ(count_params(m), expected_counts().at("MoH-DiT-S/2-75"));
  DiTOptions small = dit_options("MoH-DiT-S/2-75");
  small.input_size = 8;
  DiT s(small);
  EXPECT_EQ(count_params(m) - count_params(s), (256 - 16) * 384);
}

TEST(DiTRegistry, PaperActiveHeadRatios) {
  EXPECT_NEAR(dit_options("MoH-DiT-S/2-90").active_ratio(), 64.0 / 72, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-S/2-75").active_ratio(), 54.0 / 72, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-B/2-90").active_ratio(), 129.0 / 144, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-B/2-75").active_ratio(), 108.0 / 144, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-L/2-90").active_ratio(), 344.0 / 384, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-L/2-75").active_ratio(), 288.0 / 384, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-XL/2-90").active_ratio(), 403.0 / 448, 1e-12);
  EXPECT_NEAR(dit_options("MoH-DiT-XL/2-75").active_ratio(), 336.0 / 448, 1e-12);
  EXPECT_EQ(dit_options("MoH-DiT-XL/2-90").routed_layers(), 9);
}

// The variant name without its patch size ("MoH-DiT-XL/2-90" → "MoH-DiT-XL-90"): variants of one such name, width and
// depth share every block, so one forward/backward covers them (only the patch embedder and the final layer differ,
// and the parameter count checks those). The pixel variants differ in width too (DiT-Pixel/4: D = 128, /2: 64).
std::string block_structure(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return name;
  size_t end = slash + 1;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  return name.substr(0, slash) + name.substr(end);
}

// `o` with only the layers `layers` (indices into its depth), each keeping its heads / shared / top-K.
DiTOptions with_layers(const DiTOptions& o, const std::vector<int64_t>& layers) {
  DiTOptions p = o;
  p.depth = static_cast<int64_t>(layers.size());
  for (auto [from, to] : {std::pair{&o.heads, &p.heads}, {&o.shared, &p.shared}, {&o.topk, &p.topk}}) {
    if (from->empty()) continue;
    const std::vector<int64_t> each = expand_runs(*from);
    to->clear();
    for (int64_t l : layers) to->emplace_back(each[static_cast<size_t>(l)], 1);
  }
  return p;
}

// The layers of `o` in runs of one block kind (equal heads, shared and top-K): (first layer, run length).
std::vector<std::pair<int64_t, int64_t>> block_runs(const DiTOptions& o) {
  const auto kind = [&](int64_t l) {
    const auto at = [&](const LayerRuns& r) { return r.empty() ? -1 : expand_runs(r)[static_cast<size_t>(l)]; };
    return std::make_tuple(at(o.heads), at(o.shared), at(o.topk));
  };
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t l = 0; l < o.depth; ++l) {
    if (!runs.empty() && kind(runs.back().first) == kind(l))
      ++runs.back().second;
    else
      runs.emplace_back(l, 1);
  }
  return runs;
}

int64_t count_of(const DiTOptions& o) {
  DiT model(o);
  return count_params(model);
}

// Every registered variant at an 8×8 input: exact parameter count (spec table, with pos_embed at 32×32); once per
// block structure (the smallest patch size: the most tokens), zero output at init (adaLN-Zero) and finite gradients
// everywhere. The S and pixel models (D <= 384) are built whole. A wider one is built with one block of each run of
// its block kinds (equal heads / shared / top-K): its count is that model's plus each run's further blocks at a
// block's count (a two-block model's minus a one-block model's), and the forward/backward runs on it, every block
// kind present; building each B/L/XL variant whole would initialise ~6 billion parameters. Other patch sizes of a
// structure share its blocks: their count is the first variant's plus the difference of the two one-block models.
TEST(DiTRegistry, EveryVariantCountsForwardBackward) {
  ASSERT_EQ(dit_variants().size(), expected_counts().size());
  // Block structure (the name without its patch size, the width and depth) → its first variant's count and one-block
  // count.
  std::map<std::tuple<std::string, int64_t, int64_t>, std::pair<int64_t, int64_t>> first;
  for (const auto& [name, base] : dit_variants()) {
    const auto structure = std::make_tuple(block_structure(name), base.hidden_size, base.depth);
    DiTOptions o = base;
    o.input_size = 8;
    const DiTOptions one = with_layers(o, {0});  // its first block only
    const int64_t pos_rest = (base.num_patches() - o.num_patches()) * o.hidden_size;
    torch::manual_seed(0);
    if (const auto it = first.find(structure); it != first.end()) {
      const int64_t derived = it->second.first + count_of(one) - it->second.second;
      EXPECT_EQ(derived + pos_rest, expected_counts().at(name)) << name;
      if (o.hidden_size <= 384) {
        EXPECT_EQ(count_of(o), derived) << name;
      }
      continue;
    }
    const bool whole = o.hidden_size <= 384;
    std::vector<int64_t> kinds;
    int64_t further = 0;  // the parameters of the blocks a reduced model leaves out
    for (auto [layer, length] : block_runs(o)) {
      kinds.push_back(layer);
      if (!whole && length > 1)
        further += (length - 1) * (count_of(with_layers(o, {layer, layer})) - count_of(with_layers(o, {layer})));
    }
    const DiTOptions built = whole ? o : with_layers(o, kinds);
    DiT m(built);
    const int64_t total = count_params(m) + further;
    EXPECT_EQ(total + pos_rest, expected_counts().at(name)) << name;
    first[structure] = std::make_pair(total, count_of(one));
    m->train();
    torch::Tensor x = torch::randn({2, o.in_channels, 8, 8});
    auto out = m->forward(x, torch::tensor({3, 999}), torch::tensor({1, 7}));
    ASSERT_EQ(out.out.sizes(), (std::vector<int64_t>{2, o.out_channels(), 8, 8})) << name;
    EXPECT_EQ(out.out.abs().max().item<double>(), 0.0) << name << ": adaLN-Zero output must be 0 at init";
    EXPECT_EQ(out.aux_loss.defined(), o.routed_layers() > 0) << name;
    torch::Tensor loss = (out.out - x.repeat({1, o.out_channels() / o.in_channels, 1, 1})).pow(2).mean();
    if (out.aux_loss.defined()) loss = loss + 0.01 * out.aux_loss;
    loss.backward();
    for (const auto& p : m->named_parameters()) {
      if (!p.value().requires_grad()) continue;
      // A sum is finite only if every term is (a NaN or ±inf term makes it NaN or ±inf; these gradients are far from
      // overflowing), in one pass over the gradients instead of isfinite().all()'s four.
      ASSERT_TRUE(p.value().grad().defined() && std::isfinite(p.value().grad().sum().item<double>()))
          << name << " " << p.key();
    }
  }
  // S, B, L, XL × {DiT, MoH-90, MoH-75}; LightningDiT B and XL, MoH-LightningDiT-XL; DiT-Pixel and MoH-DiT-Pixel-75 at
  // patch 4 (D = 128), and at patch 2 (D = 64) also MoH-DiT-Pixel/2-90.
  EXPECT_EQ(first.size(), 20u);
}

TEST(DiTRegistry, OfficialKeyNamesAndErrors) {
  DiT m(dit_options("MoH-DiT-S/2-90"));
  auto params = m->named_parameters();
  for (const char* k : {"pos_embed", "x_embedder.proj.weight", "t_embedder.mlp.0.weight", "t_embedder.mlp.2.bias",
                        "y_embedder.embedding_table.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.wg.weight",
                        "blocks.0.attn.wg_0.weight", "blocks.0.attn.wg_1.weight", "blocks.11.attn.wg_1.weight",
                        "blocks.0.mlp.fc1.weight", "blocks.0.adaLN_modulation.1.weight", "final_layer.linear.weight",
                        "final_layer.adaLN_modulation.1.bias"})
    EXPECT_TRUE(params.contains(k)) << k;
  EXPECT_FALSE(params.contains("blocks.11.attn.wg.weight"));             // K = 0 layer: no routed router
  EXPECT_EQ(params["y_embedder.embedding_table.weight"].size(0), 1001);  // null class row
  EXPECT_FALSE(params["pos_embed"].requires_grad());
  try {
    dit_options("DiT-XXL/2");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("DiT-XL/2"), std::string::npos) << e.what();
  }
}

// LightningDiT's state_dict keys (the official model's, listed on 2026-11-26): 351 tensors for XL/1, 159 for B/1,
// the rotary tables among them as buffers.
TEST(DiTRegistry, LightningDiTKeysAreTheOfficialOnes) {
  for (const auto& [name, keys] :
       std::vector<std::pair<std::string, size_t>>{{"LightningDiT-XL/1", 351}, {"LightningDiT-B/1", 159}}) {
    DiTOptions o = dit_options(name);
    o.depth = name == "LightningDiT-XL/1" ? 28 : 12;
    DiT m(o);
    const auto params = m->named_parameters();
    const auto buffers = m->named_buffers();
    EXPECT_EQ(params.size() + buffers.size(), keys) << name;
    for (const char* k : {"blocks.0.norm1.weight", "blocks.0.norm2.weight", "blocks.0.mlp.w12.weight",
                          "blocks.0.mlp.w3.bias", "final_layer.norm_final.weight", "blocks.0.attn.qkv.weight"})
      EXPECT_TRUE(params.contains(k)) << name << " " << k;
    EXPECT_TRUE(buffers.contains("feat_rope.freqs_cos") && buffers.contains("feat_rope.freqs_sin")) << name;
    EXPECT_FALSE(params.contains("blocks.0.mlp.fc1.weight")) << name;
    EXPECT_EQ(params["blocks.0.mlp.w12.weight"].size(0), 2 * (4 * o.hidden_size * 2 / 3)) << name;
  }
  // Off (DiT's block): none of them.
  const auto dit = DiT(dit_options("DiT-S/2"))->named_parameters();
  EXPECT_FALSE(dit.contains("blocks.0.norm1.weight") || dit.contains("final_layer.norm_final.weight"));
  EXPECT_EQ(DiT(dit_options("DiT-S/2"))->named_buffers().size(), 0u);
}

// overlap_add against its definition written out pixel by pixel: the tent-weighted mean of the 2p×2p windows (centred
// on each token's patch) that cover the pixel; a constant in every window comes back unchanged.
TEST(DiTLayers, OverlapAddIsTheTentWeightedMeanOfTheCoveringWindows) {
  for (const int64_t p : {2, 4}) {
    const int64_t g = 3, c = 2, k = 2 * p, side = g * p;
    torch::manual_seed(0);
    const torch::Tensor x = torch::randn({1, g * g, k * k * c});
    const torch::Tensor out = overlap_add(x, p, c, g);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, c, side, side}));
    auto tent = [&](int64_t i) { return std::min(i + 0.5, k - i - 0.5) / static_cast<double>(p); };
    const auto v = x.accessor<float, 3>();
    double worst = 0;
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t py = 0; py < side; ++py)
        for (int64_t px = 0; px < side; ++px) {
          double num = 0, den = 0;
          for (int64_t r = 0; r < g; ++r)
            for (int64_t q = 0; q < g; ++q) {
              const int64_t i = py - (r * p - p / 2),
                            j = px - (q * p - p / 2);  // position inside token (r, q)'s window
              if (i < 0 || i >= k || j < 0 || j >= k) continue;
              const double w = tent(i) * tent(j);
              num += w * v[0][r * g + q][(i * k + j) * c + ch];  // layout (kh, kw, C)
              den += w;
            }
          worst = std::max(worst, std::abs(out[0][ch][py][px].item<double>() - num / den));
        }
    // At most 4 windows per pixel: a few fp32 roundings of values below max|x|.
    EXPECT_LE(worst, 16 * std::numeric_limits<float>::epsilon() * x.abs().max().item<double>()) << "p " << p;
    const torch::Tensor flat = overlap_add(torch::full({1, g * g, k * k * c}, 0.75f), p, c, g);
    EXPECT_LE((flat - 0.75).abs().max().item<double>(), 4 * std::numeric_limits<float>::epsilon()) << "p " << p;
  }
}

// model.overlap_output: final_layer.linear predicts (2p)²·C_out per token, the output is 0 at init (adaLN-Zero) and
// has the image's shape, the gradient reaches the layer, weights of that shape read back as overlapping (learned σ
// or not), and an odd patch is refused.
TEST(DiTLayers, OverlapOutputModel) {
  DiTOptions o = dit_options("DiT-Pixel/4");
  o.input_size = 8;
  o.depth = 1;
  DiTOptions plain_o = o;
  o.overlap_output = true;
  torch::manual_seed(0);
  DiT m(o), plain(plain_o);
  EXPECT_EQ(count_params(m), count_params(plain) + 3 * 16 * 2 * (o.hidden_size + 1));  // C_out = 2 (learned σ)
  auto params = m->named_parameters();
  ASSERT_EQ(params["final_layer.linear.weight"].size(0), 8 * 8 * 2);
  const torch::Tensor x = torch::randn({2, 1, 8, 8});
  const torch::Tensor out = m->forward(x, torch::tensor({10, 900}), torch::tensor({1, 7})).out;
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 2, 8, 8}));
  EXPECT_EQ(out.abs().max().item<double>(), 0.0);
  (out - x.repeat({1, 2, 1, 1})).pow(2).mean().backward();
  EXPECT_GT(params["final_layer.linear.weight"].grad().abs().max().item<double>(), 0.0);
  TensorMap w;
  for (const auto& p : params) w[p.key()] = p.value().detach();
  const DiTOptions read = dit_options_for_weights(dit_options("DiT-Pixel/4"), w);
  EXPECT_TRUE(read.overlap_output && read.learn_sigma);
  w["final_layer.linear.weight"] = w["final_layer.linear.weight"].slice(0, 0, 64);  // one channel: no σ
  const DiTOptions read1 = dit_options_for_weights(dit_options("DiT-Pixel/4"), w);
  EXPECT_TRUE(read1.overlap_output && !read1.learn_sigma);
  w["final_layer.linear.weight"] = w["final_layer.linear.weight"].slice(0, 0, 32);  // DiT's own (p²·2): no overlap
  const DiTOptions read2 = dit_options_for_weights(dit_options("DiT-Pixel/4"), w);
  EXPECT_TRUE(!read2.overlap_output && read2.learn_sigma);
  DiTOptions odd = dit_options("DiT-S/2");
  odd.patch_size = 1, odd.overlap_output = true;
  EXPECT_THROW(odd.validate(), UserError);
}

TEST(DiTLayers, PosEmbedAndTimestepEmbeddingFormulas) {
  torch::Tensor pe = sincos_pos_embed_2d(8, 3);  // D/4 = 2 frequencies: ω = [1, 1/100]
  ASSERT_EQ(pe.sizes(), (std::vector<int64_t>{9, 8}));
  const int64_t k = 1 * 3 + 2;                                                         // row 1, col 2
  EXPECT_NEAR(pe[k][0].item<double>(), std::sin(2.0), 1e-12);                          // sin(col·ω0)
  EXPECT_NEAR(pe[k][3].item<double>(), std::cos(2.0 / 100), 1e-12);                    // cos(col·ω1)
  EXPECT_NEAR(pe[k][4].item<double>(), std::sin(1.0), 1e-12);                          // sin(row·ω0)
  torch::Tensor te = TimestepEmbedderImpl::timestep_embedding(torch::tensor({5}), 4);  // half = 2
  EXPECT_NEAR(te[0][0].item<double>(), std::cos(5.0), 1e-6);                           // cos first
  EXPECT_NEAR(te[0][3].item<double>(), std::sin(5.0 * std::exp(-std::log(1e4) / 2)), 1e-6);
}

// Float64 values of guided-diffusion's linear-schedule arrays (betas 1e-4..0.02, 1000 steps), computed with numpy
// and printed to 10 digits: relative tolerance 1e-9.
TEST(Diffusion, ScheduleMatchesSpecVectors) {
  auto near = [](double a, double b) { EXPECT_NEAR(a, b, 1e-9 * std::max(1.0, std::abs(b))) << a << " vs " << b; };
  DiffusionSchedule s = make_schedule(linear_betas(1000));
  near(s.betas[0], 1e-4);
  near(s.alphas_cumprod[0], 0.9999);
  near(s.posterior_variance[0], 0.0);
  near(s.posterior_log_variance_clipped[0], -9.816725135);
  near(s.posterior_mean_coef1[0], 1.0);
  near(s.posterior_mean_coef2[0], 0.0);
  near(s.betas[1], 1.199199199e-4);
  near(s.alphas_cumprod[1], 0.9997800921);
  near(s.posterior_variance[1], 5.453187661e-5);
  near(s.posterior_log_variance_clipped[1], -9.816725135);
  near(s.posterior_mean_coef1[1], 0.5452914995);
  near(s.posterior_mean_coef2[1], 0.454708499);
  near(s.betas[499], 0.01004004004);
  near(s.alphas_cumprod[499], 0.07858724288);
  near(s.posterior_log_variance_clipped[499], -4.60203955);
  near(s.betas[999], 0.02);
  near(s.alphas_cumprod[999], 4.035829765e-5);
  near(s.posterior_log_variance_clipped[999], -3.912023829);

  DiffusionSchedule r = respace(linear_betas(1000), space_timesteps(1000, "250"));
  ASSERT_EQ(r.num_steps(), 250);
  near(r.betas[0], 1e-4);
  near(r.alphas_cumprod[0], 0.9999);
  near(r.posterior_log_variance_clipped[0], -9.36462816);
  near(std::log(r.betas[0]), -9.210340372);
  near(r.betas[1], 5.990655645e-4);
  near(r.alphas_cumprod[1], 0.9993009943);
  EXPECT_EQ(r.timestep_map[124], 497);
  near(r.betas[124], 0.03928879314);
  near(r.alphas_cumprod[124], 0.08018775501);
  near(r.posterior_log_variance_clipped[124], -3.24038754);
  near(std::log(r.betas[124]), -3.236815963);
  near(r.betas[249], 0.07751934499);
  near(r.alphas_cumprod[249], 4.035829765e-5);
  near(r.posterior_log_variance_clipped[249], -2.557231153);
  near(std::log(r.betas[249]), -2.557227761);
}

// guided-diffusion respace.py space_timesteps(1000, "250") and "25" (Python's round-half-to-even at 166.5, 499.5,
// 832.5).
TEST(Diffusion, RespacingMapsMatchSpec) {
  const std::string appendix_a =
      "0 4 8 12 16 20 24 28 32 36 40 44 48 52 56 60 64 68 72 76 80 84 88 92 96 100 104 108 112 116 120 124 128 132 "
      "136 140 144 148 152 156 160 164 169 173 177 181 185 189 193 197 201 205 209 213 217 221 225 229 233 237 241 "
      "245 249 253 257 261 265 269 273 277 281 285 289 293 297 301 305 309 313 317 321 325 329 333 337 341 345 349 "
      "353 357 361 365 369 373 377 381 385 389 393 397 401 405 409 413 417 421 425 429 433 437 441 445 449 453 457 "
      "461 465 469 473 477 481 485 489 493 497 502 506 510 514 518 522 526 530 534 538 542 546 550 554 558 562 566 "
      "570 574 578 582 586 590 594 598 602 606 610 614 618 622 626 630 634 638 642 646 650 654 658 662 666 670 674 "
      "678 682 686 690 694 698 702 706 710 714 718 722 726 730 734 738 742 746 750 754 758 762 766 770 774 778 782 "
      "786 790 794 798 802 806 810 814 818 822 826 830 835 839 843 847 851 855 859 863 867 871 875 879 883 887 891 "
      "895 899 903 907 911 915 919 923 927 931 935 939 943 947 951 955 959 963 967 971 975 979 983 987 991 995 999";
  std::vector<int64_t> expect;
  std::istringstream in(appendix_a);
  for (int64_t v; in >> v;) expect.push_back(v);
  EXPECT_EQ(space_timesteps(1000, "250"), expect);
  auto s25 = space_timesteps(1000, "25");
  EXPECT_EQ(std::vector<int64_t>(s25.begin(), s25.begin() + 6), (std::vector<int64_t>{0, 42, 83, 125, 166, 208}));
  EXPECT_NE(std::find(s25.begin(), s25.end(), 500), s25.end());
  EXPECT_NE(std::find(s25.begin(), s25.end(), 832), s25.end());
  auto s50 = space_timesteps(1000, "50");
  EXPECT_EQ(std::vector<int64_t>(s50.begin(), s50.begin() + 6), (std::vector<int64_t>{0, 20, 41, 61, 82, 102}));
  EXPECT_EQ(std::vector<int64_t>(s50.end() - 4, s50.end()), (std::vector<int64_t>{938, 958, 979, 999}));
  auto s100 = space_timesteps(1000, "100");
  EXPECT_EQ(std::vector<int64_t>(s100.end() - 4, s100.end()), (std::vector<int64_t>{969, 979, 989, 999}));
  auto d50 = space_timesteps(1000, "ddim50");
  EXPECT_EQ(d50.size(), 50u);
  EXPECT_EQ(d50.back(), 980);
  EXPECT_EQ(space_timesteps(1000, "ddim250").back(), 996);
  EXPECT_EQ(space_timesteps(1000, "").size(), 1000u);
  EXPECT_THROW(space_timesteps(1000, "ddim999"), UserError);
  EXPECT_THROW(space_timesteps(1000, "2000"), UserError);
  EXPECT_THROW(space_timesteps(1000, "fast"), UserError);
}

// The training draws (t, noise, label drops) come from the global CPU generator whatever the device: the `meta`
// device stands in for a GPU (drawing there would leave the CPU generator untouched, so a checkpoint's generator
// state would not describe what a resumed GPU run must draw next). Two ranks draw the rows of one process's batch.
TEST(DiffusionTrainer, DrawsComeFromTheCpuGeneratorWhateverTheDevice) {
  const std::vector<int64_t> shape{4, 3, 2, 2};
  torch::manual_seed(21);
  const DiffusionDraws cpu = draw_training_noise(shape, 1000, 0.1, 0, 1, c10::Device(c10::kCPU));
  const at::Tensor after_cpu = cpu_rng_state();
  torch::manual_seed(21);
  const DiffusionDraws dev = draw_training_noise(shape, 1000, 0.1, 0, 1, c10::Device(c10::kMeta));
  EXPECT_TRUE(dev.noise.is_meta() && dev.t.is_meta() && dev.drop.is_meta());
  EXPECT_TRUE(torch::equal(cpu_rng_state(), after_cpu)) << "the device run drew elsewhere than the CPU generator";
  EXPECT_EQ(cpu.noise.sizes(), at::IntArrayRef(shape));
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(21);
    const DiffusionDraws half = draw_training_noise({2, 3, 2, 2}, 1000, 0.1, r, 2, c10::Device(c10::kCPU));
    EXPECT_TRUE(torch::equal(half.noise, cpu.noise.slice(0, r, 4, 2)));
    EXPECT_TRUE(torch::equal(half.t, cpu.t.slice(0, r, 4, 2)));
    EXPECT_TRUE(torch::equal(half.drop, cpu.drop.slice(0, r, 4, 2)));
    EXPECT_TRUE(torch::equal(cpu_rng_state(), after_cpu)) << "rank " << r << " drew the whole global batch";
  }
}

}  // namespace
}  // namespace moh::diffusion
