#include "diffusion/dit.h"

#include <torch/nn/functional/fold.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>

#include <cmath>

#include "core/error.h"
#include "core/registry.h"
#include "core/train/activation_checkpoint.h"
#include "diffusion/repa.h"
#include "vision/nn/fused_ops.h"

namespace moh::diffusion {

namespace {
constexpr double kNormEps = 1e-6;       // DiT LayerNorm(elementwise_affine=False, eps=1e-6)
constexpr double kEmbedInitStd = 0.02;  // label table and timestep MLP init
constexpr int64_t kFrequencyDim = 256;  // timestep sinusoid features

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}
at::Tensor layer_norm(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, {}, {}, kNormEps);
}
// A block's normalisation: DiT's LayerNorm without parameters, or LightningDiT's RMSNorm when the layer exists.
at::Tensor block_norm(nn::RMSNorm rms, const at::Tensor& x) {
  return rms ? rms->forward(x) : layer_norm(x);
}
}  // namespace

std::vector<int64_t> expand_runs(const LayerRuns& runs) {
  std::vector<int64_t> out;
  for (auto [value, count] : runs) out.insert(out.end(), static_cast<size_t>(count), value);
  return out;
}

nn::MoHAttentionOptions DiTOptions::layer(int64_t i) const {
  auto at_layer = [&](const LayerRuns& runs, int64_t fallback) {
    if (runs.empty()) return fallback;
    return expand_runs(runs).at(static_cast<size_t>(i));
  };
  nn::MoHAttentionOptions o(hidden_size, at_layer(heads, num_heads));
  o.head_dim = head_dim > 0 ? head_dim : hidden_size / num_heads;
  o.qkv_bias = true;
  o.path = path;
  o.router = router;
  o.qk_norm = qk_norm;
  o.qk_norm_kind = norm;
  o.rope_grid = pos == PosKind::rope2d ? grid_size() : 0;
  o.fused_ops = fused;
  if (attention == AttentionMode::moh)
    o.moh(at_layer(shared, 0), at_layer(topk, 0));
  else if (attention == AttentionMode::moa)
    o.moa(at_layer(topk, 0));
  return o;
}

double DiTOptions::active_ratio() const {
  double active = 0, total = 0;
  for (int64_t i = 0; i < depth; ++i) {
    auto o = layer(i);
    active += static_cast<double>(o.active_heads());
    total += static_cast<double>(o.num_heads);
  }
  return active / total;
}

int64_t DiTOptions::routed_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < depth; ++i) n += (attention != AttentionMode::mha && layer(i).topk > 0) ? 1 : 0;
  return n;
}

void DiTOptions::validate() const {
  const std::string what = "DiT options";
  check_router(router, attention == AttentionMode::moh, "MoH-DiT");
  if (input_size <= 0 || patch_size <= 0 || input_size % patch_size != 0)
    throw UserError(
        what,
        "input_size " + std::to_string(input_size) + " is not a multiple of patch_size " + std::to_string(patch_size),
        "");
  if (overlap_output && patch_size % 2 != 0)
    throw UserError(what, "overlapping output windows need an even patch_size (the window is centred on the patch)",
                    "set model.overlap_output: false");
  if (hidden_size % 4 != 0) throw UserError(what, "hidden_size must be a multiple of 4 (2-D sin-cos embedding)", "");
  if (depth <= 0 || num_heads <= 0) throw UserError(what, "depth and num_heads must be positive", "");
  if (head_dim == 0 && hidden_size % num_heads != 0)
    throw UserError(what, "hidden_size is not divisible by num_heads", "set head_dim");
  for (const auto* runs : {&heads, &shared, &topk})
    if (!runs->empty() && static_cast<int64_t>(expand_runs(*runs).size()) != depth)
      throw UserError(what,
                      "a per-layer schedule has " + std::to_string(expand_runs(*runs).size()) + " entries for depth " +
                          std::to_string(depth),
                      "");
  if (num_classes <= 0) throw UserError(what, "num_classes must be positive", "");
  if (class_dropout_prob < 0 || class_dropout_prob >= 1)
    throw UserError(what, "class_dropout_prob must be in [0,1)", "");
  for (int64_t i = 0; i < depth; ++i) layer(i).validate();
  if (!repa_z_dims.empty() && (repa_depth < 1 || repa_depth > depth || repa_projector_dim <= 0))
    throw UserError(what, "REPA's block " + std::to_string(repa_depth) + " is not one of 1.." + std::to_string(depth),
                    "set train.repa.depth");
}

SwiGLUImpl::SwiGLUImpl(int64_t dim, int64_t hidden) {
  w12 = register_module("w12", nn::Linear(dim, 2 * hidden));
  w3 = register_module("w3", nn::Linear(hidden, dim));
}
at::Tensor SwiGLUImpl::forward(const at::Tensor& x) {
  const auto x12 = w12->forward(x).chunk(2, -1);  // (…, hidden) each
  return w3->forward(at::silu(x12[0]) * x12[1]);
}

RopeBuffersImpl::RopeBuffersImpl(int64_t head_dim, int64_t grid) {
  const nn::RopeTables t = nn::rope2d_tables(head_dim, grid);
  freqs_cos = register_buffer("freqs_cos", t.cos);
  freqs_sin = register_buffer("freqs_sin", t.sin);
}

TimestepEmbedderImpl::TimestepEmbedderImpl(int64_t dim, int64_t fdim) : frequency_dim(fdim) {
  mlp = register_module("mlp", torch::nn::Sequential(nn::Linear(fdim, dim), torch::nn::SiLU(), nn::Linear(dim, dim)));
}

at::Tensor TimestepEmbedderImpl::timestep_embedding(const at::Tensor& t, int64_t dim, double max_period) {
  const int64_t half = dim / 2;
  at::Tensor freqs = at::exp(-std::log(max_period) * at::arange(half, t.options().dtype(at::kFloat)) /
                             static_cast<double>(half));                 // (half)
  at::Tensor args = t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);  // (N, half)
  at::Tensor emb = at::cat({at::cos(args), at::sin(args)}, -1);          // cos first, then sin
  if (dim % 2) emb = at::cat({emb, at::zeros_like(emb.narrow(1, 0, 1))}, -1);
  return emb;
}

at::Tensor TimestepEmbedderImpl::forward(const at::Tensor& t) {
  // The frequencies in fp32 as the official code computes them, then in the weights' dtype (an fp64 twin of the
  // model is the reference of tests/test_on_device.cpp; autocast casts for itself).
  const at::ScalarType w = mlp->parameters().front().scalar_type();
  return mlp->forward(timestep_embedding(t, frequency_dim).to(w == at::kDouble ? w : at::kFloat));  // (N, D)
}

LabelEmbedderImpl::LabelEmbedderImpl(int64_t classes, int64_t dim, double p) : num_classes(classes), dropout_prob(p) {
  embedding_table = register_module("embedding_table", torch::nn::Embedding(classes + (p > 0 ? 1 : 0), dim));
}

at::Tensor LabelEmbedderImpl::forward(const at::Tensor& labels, const at::Tensor& force_drop) {
  at::Tensor y = labels;
  if (force_drop.defined()) {
    y = at::where(force_drop.to(at::kBool), at::full_like(y, num_classes), y);
  } else if (is_training() && dropout_prob > 0) {
    at::Tensor drop = at::rand({y.size(0)}, y.options().dtype(at::kFloat)) < dropout_prob;
    y = at::where(drop, at::full_like(y, num_classes), y);
  }
  return embedding_table->forward(y);  // (N, D)
}

DiTBlockImpl::DiTBlockImpl(const DiTOptions& o, int64_t layer) : dim(o.hidden_size) {
  const int64_t d = o.hidden_size, hidden = static_cast<int64_t>(static_cast<double>(d) * o.mlp_ratio);
  if (o.norm == NormKind::rmsnorm) {
    norm1 = register_module("norm1", nn::RMSNorm(d));
    norm2 = register_module("norm2", nn::RMSNorm(d));
  }
  attn = register_module("attn", nn::MoHAttention(o.layer(layer)));
  if (o.mlp == MlpKind::swiglu)
    swiglu = register_module("mlp", SwiGLU(d, static_cast<int64_t>(2.0 / 3.0 * static_cast<double>(hidden))));
  else
    mlp = register_module("mlp", Mlp(d, hidden, /*tanh_gelu=*/true));
  adaLN_modulation =
      register_module("adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), nn::Linear(d, 6 * d)));
  set_fused_ops(o.fused);
}

void DiTBlockImpl::set_fused_ops(FusedMode mode) {
  fused = mode;
  attn->set_fused_ops(mode);
  if (mlp) mlp->fused = mode;
}

DiTOutput DiTBlockImpl::forward(const at::Tensor& x, const at::Tensor& c, const nn::RopeTables& rope) {
  auto mod = adaLN_modulation->forward(c).chunk(6, 1);  // shift/scale/gate for msa, then mlp; each (N, D)
  if (!norm1 && nn::use_fused_ops(fused, x.device())) return forward_fused(x, mod, rope);
  auto a = attn->forward(modulate(block_norm(norm1, x), mod[0], mod[1]), rope);  // router sees the modulated tokens
  at::Tensor h = x + mod[2].unsqueeze(1) * a.out;
  const at::Tensor m = modulate(block_norm(norm2, h), mod[3], mod[4]);
  h = h + mod[5].unsqueeze(1) * (swiglu ? swiglu->forward(m) : mlp->forward(m));
  return {h, a.aux_loss, a.routed, {}};  // (N, T, D)
}

DiTOutput DiTBlockImpl::forward_fused(const at::Tensor& x, const std::vector<at::Tensor>& mod,
                                      const nn::RopeTables& rope) {
  // A normalised input with one consumer is stored in the type that product casts it to (the same values). The
  // attention input of a routed layer feeds the router's product too, so it stays in x's type and the two
  // gradients add up there, as in the official sequence.
  const bool one_reader = attn->options.mode == AttentionMode::mha;
  const at::Tensor a_in =
      nn::fused_ln_modulate(x, mod[0], mod[1], kNormEps, one_reader ? nn::consumer_dtype(x) : x.scalar_type());
  auto a = attn->forward(a_in, rope);
  at::Tensor h = nn::fused_gate_residual(x, mod[2], a.out);                                        // (N, T, D)
  const at::Tensor m = nn::fused_ln_modulate(h, mod[3], mod[4], kNormEps, nn::consumer_dtype(h));  // fc1's input
  h = nn::fused_gate_residual(h, mod[5], swiglu ? swiglu->forward(m) : mlp->forward(m));
  return {h, a.aux_loss, a.routed, {}};
}

FinalLayerImpl::FinalLayerImpl(int64_t d, int64_t window, int64_t out_channels, NormKind norm) : dim(d) {
  if (norm == NormKind::rmsnorm) norm_final = register_module("norm_final", nn::RMSNorm(d));
  linear = register_module("linear", nn::Linear(d, window * window * out_channels));
  adaLN_modulation =
      register_module("adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), nn::Linear(d, 2 * d)));
}

at::Tensor FinalLayerImpl::forward(const at::Tensor& x, const at::Tensor& c) {
  auto mod = adaLN_modulation->forward(c).chunk(2, 1);  // shift first, then scale
  if (!norm_final && nn::use_fused_ops(fused, x.device()))
    return linear->forward(nn::fused_ln_modulate(x, mod[0], mod[1], kNormEps, nn::consumer_dtype(x)));
  return linear->forward(modulate(block_norm(norm_final, x), mod[0], mod[1]));
}

at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid) {
  const int64_t quarter = dim / 4;
  at::Tensor omega = 1.0 / at::pow(10000.0, at::arange(quarter, at::kDouble) / static_cast<double>(quarter));
  at::Tensor pos = at::arange(grid, at::kDouble);
  at::Tensor rows = pos.repeat_interleave(grid), cols = pos.repeat({grid});  // token k = r·G + c
  auto emb1d = [&](const at::Tensor& p) {
    at::Tensor out = p.unsqueeze(1) * omega.unsqueeze(0);
    return at::cat({at::sin(out), at::cos(out)}, 1);
  };
  return at::cat({emb1d(cols), emb1d(rows)}, 1);  // first half encodes the column (MAE's meshgrid order)
}

DiTImpl::DiTImpl(const DiTOptions& o) : options(o) {
  options.validate();
  const int64_t D = o.hidden_size;
  x_embedder = register_module("x_embedder", PatchEmbed(o.in_channels, D, o.patch_size));
  t_embedder = register_module("t_embedder", TimestepEmbedder(D, kFrequencyDim));
  y_embedder = register_module("y_embedder", LabelEmbedder(o.num_classes, D, o.class_dropout_prob));
  pos_embed = register_parameter("pos_embed", at::zeros({1, o.num_patches(), D}), /*requires_grad=*/false);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) blocks->push_back(DiTBlock(o, i));
  final_layer = register_module("final_layer", FinalLayer(D, o.output_window(), o.out_channels(), o.norm));
  final_layer->fused = o.fused;
  if (o.pos == PosKind::rope2d)
    feat_rope = register_module("feat_rope", RopeBuffers(o.layer(0).head_dim_resolved(), o.grid_size()));
  if (!o.repa_z_dims.empty()) {
    projectors = register_module("projectors", torch::nn::ModuleList());
    for (int64_t z : o.repa_z_dims) projectors->push_back(repa_projector(D, o.repa_projector_dim, z));
  }
  initialize_weights();
}

void DiTImpl::initialize_weights() {
  torch::NoGradGuard ng;
  const int64_t by_name = options.init_seed;  // >= 0: each module from its own seeded stream (train.paired)
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    if (auto* lin = item.value()->as<nn::Linear>()) {
      seed_for_module(by_name, item.key());
      torch::nn::init::xavier_uniform_(lin->weight);
      if (lin->bias.defined()) torch::nn::init::zeros_(lin->bias);
    }
  }
  pos_embed.copy_(sincos_pos_embed_2d(options.hidden_size, options.grid_size()).to(at::kFloat).unsqueeze(0));
  auto& w = x_embedder->proj->weight;
  seed_for_module(by_name, "x_embedder.proj");
  torch::nn::init::xavier_uniform_(w.view({w.size(0), -1}));
  torch::nn::init::zeros_(x_embedder->proj->bias);
  seed_for_module(by_name, "y_embedder.embedding_table");
  torch::nn::init::normal_(y_embedder->embedding_table->weight, 0.0, kEmbedInitStd);
  seed_for_module(by_name, "t_embedder.mlp");
  torch::nn::init::normal_(t_embedder->mlp[0]->as<nn::Linear>()->weight, 0.0, kEmbedInitStd);
  torch::nn::init::normal_(t_embedder->mlp[2]->as<nn::Linear>()->weight, 0.0, kEmbedInitStd);
  auto zero_linear = [](const std::shared_ptr<torch::nn::Module>& m) {
    auto* l = m->as<nn::Linear>();
    torch::nn::init::zeros_(l->weight);
    torch::nn::init::zeros_(l->bias);
  };
  for (auto& b : *blocks) zero_linear(b->as<DiTBlockImpl>()->adaLN_modulation[1]);
  zero_linear(final_layer->adaLN_modulation[1]);
  zero_linear(final_layer->linear.ptr());
}

void DiTImpl::set_fused_ops(FusedMode mode) {
  options.fused = mode;
  for (auto& b : *blocks) b->as<DiTBlockImpl>()->set_fused_ops(mode);
  final_layer->fused = mode;
}

at::Tensor overlap_add(const at::Tensor& x, int64_t p, int64_t c, int64_t g) {
  namespace F = torch::nn::functional;
  const int64_t N = x.size(0), k = 2 * p;
  const at::Tensor i = at::arange(k, x.options().dtype(at::kFloat)) + 0.5;
  const at::Tensor tent = at::minimum(i, k - i) / static_cast<double>(p);  // (k)
  const at::Tensor w = tent.unsqueeze(1) * tent.unsqueeze(0);              // (k, k)
  const at::Tensor cols = x.to(at::kFloat).reshape({N, g * g, k, k, c}) * w.view({1, 1, k, k, 1});
  const auto opts = F::FoldFuncOptions({g * p, g * p}, {k, k}).stride(p).padding(p / 2);
  const at::Tensor sum = F::fold(cols.permute({0, 4, 2, 3, 1}).reshape({N, c * k * k, g * g}), opts);
  const at::Tensor cover = F::fold(w.reshape({1, k * k, 1}).expand({1, k * k, g * g}), opts);  // (1, 1, H, W)
  return (sum / cover).to(x.scalar_type());                                                    // (N, C, H, W)
}

at::Tensor DiTImpl::unpatchify(const at::Tensor& x) const {
  const int64_t N = x.size(0), p = options.patch_size, c = options.out_channels(), g = options.grid_size();
  if (options.overlap_output) return overlap_add(x, p, c, g);
  return x.reshape({N, g, g, p, p, c}).permute({0, 5, 1, 3, 2, 4}).reshape({N, c, g * p, g * p});  // nhwpqc->nchpwq
}

namespace {
// A block under activation checkpointing: its output and load-balance loss, its activations recomputed in backward.
DiTOutput checkpointed_block(DiTBlockImpl& block, const at::Tensor& h, const at::Tensor& c,
                             const nn::RopeTables& rope) {
  const std::vector<at::Tensor> outs = checkpointed(
      [&block, rope](const std::vector<at::Tensor>& in) {  // kept for the backward's recompute: tables by value
        DiTOutput o = block.forward(in[0], in[1], rope);
        return o.aux_loss.defined() ? std::vector<at::Tensor>{o.out, o.aux_loss} : std::vector<at::Tensor>{o.out};
      },
      {h, c});
  DiTOutput o;
  o.out = outs[0];
  if (outs.size() > 1) o.aux_loss = outs[1];
  return o;
}
}  // namespace

DiTOutput DiTImpl::forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y,
                           const at::Tensor& force_drop) {
  at::Tensor h = x_embedder->forward(x) + pos_embed;                           // (N, T, D)
  at::Tensor c = t_embedder->forward(t) + y_embedder->forward(y, force_drop);  // (N, D)
  at::Tensor aux_sum;
  int64_t routed = 0;
  std::vector<at::Tensor> selections;  // per block, for the routing observer
  const bool recompute = options.grad_checkpoint && is_training() && at::GradMode::is_enabled();
  const nn::RopeTables rope = feat_rope ? feat_rope->tables() : nn::RopeTables{};
  std::vector<at::Tensor> zs;
  for (size_t i = 0; i < blocks->size(); ++i) {
    DiTBlockImpl& block = *blocks[i]->as<DiTBlockImpl>();
    DiTOutput o = recompute ? checkpointed_block(block, h, c, rope) : block.forward(h, c, rope);
    h = o.out;
    if (projectors && is_training() && static_cast<int64_t>(i) + 1 == options.repa_depth)
      for (auto& p : *projectors) zs.push_back(p->as<torch::nn::Sequential>()->forward(h));  // (N, T, z)
    if (o.aux_loss.defined()) {
      aux_sum = aux_sum.defined() ? aux_sum + o.aux_loss : o.aux_loss;
      ++routed;
    }
    if (routing_observer) selections.push_back(o.routed);
  }
  DiTOutput out;
  out.out = unpatchify(final_layer->forward(h, c));  // (N, C_out, H, W)
  out.zs = std::move(zs);
  if (routed > 0) out.aux_loss = aux_sum / static_cast<double>(routed);  // mean over routed layers
  if (routing_observer) {  // the labels the network saw: a dropped label is the null class
    const at::Tensor seen =
        force_drop.defined() ? at::where(force_drop.to(y.device()) != 0, at::full_like(y, options.num_classes), y) : y;
    routing_observer(selections, t, seen);
  }
  return out;
}

// ---- variant table -------------------------------------------------------------------------------------------

namespace {

DiTOptions base(int64_t depth, int64_t hidden, int64_t heads, int64_t patch) {
  DiTOptions o;
  o.depth = depth;
  o.hidden_size = hidden;
  o.num_heads = heads;
  o.patch_size = patch;
  return o;
}

DiTOptions moh_variant(DiTOptions o, int64_t head_dim, LayerRuns heads, LayerRuns shared, LayerRuns topk) {
  o.attention = AttentionMode::moh;
  o.head_dim = head_dim;
  o.heads = std::move(heads);
  o.shared = std::move(shared);
  o.topk = std::move(topk);
  return o;
}

// The embedded dataset's images: 28×28, one channel, 10 classes.
DiTOptions pixel(DiTOptions o) {
  o.input_size = 28;
  o.in_channels = 1;
  o.num_classes = 10;
  return o;
}

DiTOptions lightning(DiTOptions o) {
  o.input_size = 16;
  o.in_channels = 32;
  o.learn_sigma = false;
  o.norm = NormKind::rmsnorm;
  o.mlp = MlpKind::swiglu;
  o.pos = PosKind::rope2d;
  return o;
}

}  // namespace

const std::vector<std::pair<std::string, DiTOptions>>& dit_variants() {
  static const std::vector<std::pair<std::string, DiTOptions>> table = [] {
    std::vector<std::pair<std::string, DiTOptions>> t;
    struct Size {
      const char* name;
      int64_t depth, hidden, heads;
    };
    for (const Size& s :
         {Size{"S", 12, 384, 6}, Size{"B", 12, 768, 12}, Size{"L", 24, 1024, 16}, Size{"XL", 28, 1152, 16}})
      for (int64_t p : {2, 4, 8})
        t.push_back({std::string("DiT-") + s.name + "/" + std::to_string(p), base(s.depth, s.hidden, s.heads, p)});
    // MoH-DiT schedules (MoH-DiT/models.py), as runs of (value, layers).
    const DiTOptions S = base(12, 384, 6, 2), B = base(12, 768, 12, 2), L = base(24, 1024, 16, 2),
                     XL = base(28, 1152, 16, 2);
    t.push_back({"MoH-DiT-S/2-90", moh_variant(S, 64, {{6, 12}}, {{3, 8}, {6, 4}}, {{2, 8}, {0, 4}})});
    t.push_back({"MoH-DiT-S/2-75", moh_variant(S, 64, {{6, 12}}, {{2, 2}, {3, 8}, {6, 2}}, {{1, 6}, {2, 4}, {0, 2}})});
    t.push_back({"MoH-DiT-B/2-90", moh_variant(B, 64, {{12, 12}}, {{6, 5}, {7, 5}, {12, 2}}, {{4, 10}, {0, 2}})});
    t.push_back(
        {"MoH-DiT-B/2-75", moh_variant(B, 64, {{12, 12}}, {{4, 2}, {6, 8}, {12, 2}}, {{2, 2}, {3, 8}, {0, 2}})});
    const LayerRuns l_heads{{8, 8}, {16, 8}, {24, 8}}, xl_heads{{8, 9}, {16, 10}, {24, 9}};
    t.push_back({"MoH-DiT-L/2-90", moh_variant(L, 64, l_heads, {{8, 8}, {16, 16}}, {{0, 16}, {3, 8}})});
    t.push_back({"MoH-DiT-L/2-75", moh_variant(L, 64, l_heads, {{8, 16}, {12, 8}}, {{0, 8}, {4, 16}})});
    t.push_back({"MoH-DiT-XL/2-90", moh_variant(XL, 72, xl_heads, {{8, 9}, {16, 19}}, {{0, 19}, {3, 9}})});
    t.push_back({"MoH-DiT-XL/2-75", moh_variant(XL, 72, xl_heads, {{8, 9}, {10, 10}, {14, 9}}, {{0, 9}, {2, 19}})});
    // LightningDiT (hustvl/LightningDiT, models/lightningdit.py, its released config): RMSNorm, SwiGLU, 2-D RoPE on
    // top of the sin-cos embedding, no learned σ, on VA-VAE f16d32 latents (16×16×32 for 256 px; patch 1).
    for (const Size& s : {Size{"B", 12, 768, 12}, Size{"XL", 28, 1152, 16}})
      for (int64_t p : {1, 2}) {
        DiTOptions o = lightning(base(s.depth, s.hidden, s.heads, p));
        t.push_back({std::string("LightningDiT-") + s.name + "/" + std::to_string(p), o});
      }
    // MoH-LightningDiT: MoH-DiT-XL/2-90's head schedule on LightningDiT-XL/1's block.
    t.push_back({"MoH-LightningDiT-XL/1-90",
                 moh_variant(lightning(base(28, 1152, 16, 1)), 72, xl_heads, {{8, 9}, {16, 19}}, {{0, 19}, {3, 9}})});
    // Small pixel-space models for the embedded dataset (Fashion-MNIST 28×28 grey, 10 classes): 7×7 tokens of 4×4
    // pixels, 8 heads of 16 dims; MoH-75 keeps 4 shared + top-2 of 4 routed heads in every layer (6/8 active).
    const DiTOptions px = pixel(base(6, 128, 8, 4));
    t.push_back({"DiT-Pixel/4", px});
    t.push_back({"MoH-DiT-Pixel/4-75", moh_variant(px, 16, {{8, 6}}, {{4, 6}}, {{2, 6}})});
    // The same at 14×14 tokens of 2×2 pixels and half the width (4 heads of 16 dims; MoH-75: 2 shared + top-1 of 2
    // routed): about the FLOPs of a /4 linear layer per image, for samples without the /4 model's 4×4 patch seams.
    const DiTOptions px2 = pixel(base(6, 64, 4, 2));
    t.push_back({"DiT-Pixel/2", px2});
    t.push_back({"MoH-DiT-Pixel/2-75", moh_variant(px2, 16, {{4, 6}}, {{2, 6}}, {{1, 6}})});
    // MoH-DiT-S/2-90's shape on 4 heads: the first half of the layers as -75, the second all-shared and weighted
    // (3·3 + 3·4 of 24 heads: 87.5 % active, as S/2-90's 88.9 %).
    t.push_back({"MoH-DiT-Pixel/2-90", moh_variant(px2, 16, {{4, 6}}, {{2, 3}, {4, 3}}, {{1, 3}, {0, 3}})});
    return t;
  }();
  return table;
}

DiTOptions dit_options(const std::string& name) {
  return find_variant(dit_variants(), name, "DiT variant");
}

DiTOptions dit_options_for_weights(DiTOptions o, const TensorMap& w) {
  auto shape = [&](const char* name) -> std::vector<int64_t> {
    auto it = w.find(name);
    return it == w.end() ? std::vector<int64_t>{} : it->second.sizes().vec();
  };
  const auto patch = shape("x_embedder.proj.weight");  // (D, C_in, p, p)
  if (patch.size() == 4 && patch[2] == o.patch_size) o.in_channels = patch[1];
  const auto pos = shape("pos_embed");  // (1, T, D), T = (input/p)²
  if (pos.size() == 3) {
    const auto g = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(pos[1]))));
    if (g * g == pos[1]) o.input_size = g * o.patch_size;
  }
  const auto table = shape("y_embedder.embedding_table.weight");  // (classes + null row, D)
  if (table.size() == 2 && table[0] > 1) {
    // A table with a null row can only be told apart from one without by the official default (dropout 0.1).
    o.num_classes = o.class_dropout_prob > 0 ? table[0] - 1 : table[0];
  }
  const auto last = shape("final_layer.linear.weight");  // (p²·C_out, D); overlap_output: ((2p)²·C_out, D)
  for (const bool overlap : {false, true}) {
    const int64_t window = overlap ? 2 * o.patch_size : o.patch_size, rows = window * window * o.in_channels;
    if (last.size() == 2 && (last[0] == rows || last[0] == 2 * rows)) {
      o.learn_sigma = last[0] == 2 * rows;
      o.overlap_output = overlap;
    }
  }
  return o;
}

}  // namespace moh::diffusion
