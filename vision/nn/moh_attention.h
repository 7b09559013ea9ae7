#pragma once
// The one attention class of the toolkit (used by the classifier and by DiT): plain multi-head attention (mha),
// Mixture-of-Head attention (moh, Jin et al. 2024, arXiv 2410.11842; math as in SkyworkAI/MoH@2cefd57) and Mixture of
// Attention heads (moa, Zhang et al. 2022) are options of it. The MoH router (`wg`, `wg_0`, `wg_1`) is a small helper
// that registers its layers on the owning module, so official checkpoints load by name, and is reused by the
// TransNeXt aggregated attention.
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

#include "vision/nn/attention_core.h"
#include "vision/nn/head_surgery.h"
#include "vision/nn/linear.h"
#include "vision/nn/model_config.h"
#include "vision/nn/norms.h"

namespace moh::nn {

/// Options of MoHAttention. Example: MoHAttentionOptions{384, 6}.moh(2, 2) — 6 heads, 2 shared, top-2 of 4 routed.
struct MoHAttentionOptions {
  int64_t dim = 0;        ///< C, token width
  int64_t num_heads = 0;  ///< h
  int64_t head_dim = 0;   ///< d; 0 = dim / num_heads (DiT-L/XL MoH layers decouple it)
  bool qkv_bias = true;
  AttentionMode mode = AttentionMode::mha;
  int64_t shared_heads = 0;  ///< h_s: heads [0, h_s) always on (moh)
  int64_t topk = 0;          ///< K: routed heads chosen per token from the pool of h − h_s (moh); experts (moa)
  AttentionPath path = AttentionPath::dense;  ///< dense, sparse or automatic (per call: choose_attention_path)
  RouterKind router = RouterKind::learned;    ///< learned (wg, wg_0, wg_1) or query_norm (no parameters; moh only)
  bool fused = true;     ///< the fused attention core (attend: SDPA on LibTorch ≥ 2.1, else on a CPU attention_cpu.h)
  bool qk_norm = false;  ///< normalise queries and keys per head over d (LightningDiT)
  NormKind qk_norm_kind = NormKind::layernorm;  ///< with qk_norm: LayerNorm (affine, eps 1e-5) or RMSNorm (eps 1e-6)
  int64_t rope_grid = 0;                        ///< > 0: 2-D rotary q/k over a rope_grid² token grid (d % 4 == 0)
  FusedMode fused_ops = FusedMode::off;  ///< the fused router and head gates (vision/nn/fused_ops.h; model.fused)

  MoHAttentionOptions() = default;
  MoHAttentionOptions(int64_t dim_, int64_t heads_) : dim(dim_), num_heads(heads_) {}
  MoHAttentionOptions& moh(int64_t shared, int64_t k) {
    return mode = AttentionMode::moh, shared_heads = shared, topk = k, *this;
  }
  MoHAttentionOptions& moa(int64_t k) { return mode = AttentionMode::moa, shared_heads = 0, topk = k, *this; }

  int64_t head_dim_resolved() const { return head_dim > 0 ? head_dim : dim / num_heads; }
  int64_t inner_dim() const { return num_heads * head_dim_resolved(); }
  /// Size of the routed pool E (moh: h − h_s; moa: h).
  int64_t routed_pool() const { return mode == AttentionMode::mha ? 0 : num_heads - shared_heads; }
  /// Heads active per token (h for mha, h_s + K for moh with K > 0, h for all-shared K = 0 layers, K for moa).
  int64_t active_heads() const;
  /// Throws UserError on inconsistent options (K > h − h_s, h_s > h, dim % heads, ...).
  void validate() const;
};

/// Per-token head weights produced by the router.
struct HeadRouting {
  at::Tensor gates;     ///< (T, h): weight of each head; exactly 0 for unselected routed heads. Undefined for mha.
  at::Tensor routed;    ///< (T, K) int64: selected heads as indices into the routed pool. Undefined if K == 0.
  at::Tensor aux_loss;  ///< scalar load-balance loss E·Σ P_i f_i (training, K > 0), else undefined.
  at::Tensor picks;  ///< (h − h_s) int64: tokens that picked each routed head (compact path, training), or undefined
};

/// The MoH/MoA router layers, registered on the owning module under the official names:
/// `wg` (C → h − h_s, created iff K > 0), `wg_0` (C → 2, iff K > 0 and h_s > 0), `wg_1` (C → h_s, iff h_s > 1).
struct HeadRouter {
  nn::Linear wg{nullptr}, wg_0{nullptr}, wg_1{nullptr};
  int64_t heads = 0, shared = 0, topk = 0;
  bool scale_by_k = true;      ///< MoH multiplies renormalised routed gates by K; MoA keeps them summing to 1
  bool by_query_norm = false;  ///< RouterKind::query_norm: no layers; route_by_queries decides
  bool shared_only = false;    ///< K = 0 set at run time: routed gates 0, shared gates as trained, routed undefined
  /// The official op sequence (three products, the top-K mask, the renormalisation over all E) instead of the compact
  /// one (one product over the layers' stacked rows, the renormalisation over the K kept): the same function, fewer
  /// kernels and autograd nodes per layer (a GPU step of small kernels waits on the host). Reference for the parity
  /// test and `moh bench train --router plain`.
  bool plain = false;
  /// The fused router (fused_route: softmax, top-K, gates, loss and picks in one pass after the one product) instead
  /// of the compact op sequence, its reference, where use_fused_ops says so; learned routers with K > 0 only.
  FusedMode fused = FusedMode::off;

  HeadRouter() = default;
  /// Creates and registers the layers needed by (options.mode, h_s, K) on `owner`.
  HeadRouter(torch::nn::Module& owner, const MoHAttentionOptions& options);
  /// Gates for tokens x (T, C). MoH (official code): routed p = softmax(wg x); top-K; renormalise; × K.
  /// Shared softmax(wg_1 x) × h_s (1 if h_s == 1). Two-stage α = softmax(wg_0 x) × 2 scales shared by α1 and routed
  /// by α2. K = 0 layers: softmax(wg_1 x) × h over all heads.
  HeadRouting route(const at::Tensor& x, bool training) const;
  HeadRouting route_plain(const at::Tensor& x, bool training) const;    ///< route() by the official op sequence
  HeadRouting route_compact(const at::Tensor& x, bool training) const;  ///< route() for K > 0 in fewer ops
  HeadRouting route_fused(const at::Tensor& x, bool training) const;    ///< route_compact() in one fused pass
  /// Parameter-free routing (RouterKind::query_norm) from the routed heads' queries q (T, h − h_s, d): logits =
  /// ‖q_j‖₂ / std_j ‖q_j‖₂ (unbiased, as torch.std), softmax, top-K; gate 1 for the shared heads and the K selected,
  /// 0 for the others (the choice carries no gradient); no load-balance loss. K = 0 layers: every gate 1.
  HeadRouting route_by_queries(const at::Tensor& q_routed) const;
  /// Sets K of a routed MoH/MoA layer at run time (0 ≤ k ≤ pool; UserError outside); layers built with K = 0 keep
  /// 0. k = 0 switches the routed heads off (shared_only; needs h_s > 0) and keeps `topk` at its last K, so the layer
  /// still reads as routed; the shared heads keep their trained gates (α1 included).
  void set_topk(int64_t k);
};

/// The query projections of heads [shared, heads): x (T, C), wq (heads·d, C) with head-major rows, bq (heads·d) or
/// undefined → (T, heads − shared, d).
at::Tensor routed_queries(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& bq, int64_t shared,
                          int64_t heads);

/// y (B, N, parts·heads·d), a projection's output, as `parts` views (B, heads, N, d) (q, k, v or k, v). Through
/// unbind, whose backward stacks the parts' gradients into y's own layout in one copy: indexing a (parts, B, heads, N,
/// d) permutation instead zero-fills a gradient of y's full size for every part, adds them up and copies the sum back.
std::vector<at::Tensor> split_heads(const at::Tensor& y, int64_t parts, int64_t heads, int64_t d);

/// Output of an attention layer.
struct AttentionOutput {
  at::Tensor out;       ///< (B, N, C)
  at::Tensor aux_loss;  ///< load-balance loss of this layer (training, routed layers only), else undefined
  at::Tensor routed;    ///< (B·N, K) selected routed heads (for head-load statistics), else undefined
  at::Tensor picks;     ///< HeadRouting::picks of the forward, when the router counted them
};

/// Multi-head self-attention with optional head routing. State-dict names follow DiT/timm (`qkv`, `proj`) plus the
/// MoH router names; MoA uses `q`, `kv` (keys/values shared by all heads), `proj`, `wg`.
struct MoHAttentionImpl : torch::nn::Module, HeadControl {
  explicit MoHAttentionImpl(const MoHAttentionOptions& options);
  /// x (B, N, C) → out (B, N, C). `path` overrides options.path when given. `rope`: the rotary tables (N, d) of
  /// options.rope_grid, held by the model (LightningDiT's one `feat_rope` for every layer).
  AttentionOutput forward(const at::Tensor& x, const RopeTables& rope = {});
  AttentionOutput forward_with_path(const at::Tensor& x, AttentionPath path, const RopeTables& rope = {});

  int64_t head_count() const override { return options.num_heads; }
  int64_t shared_count() const override { return router.shared; }
  int64_t routed_topk() const override { return router.topk; }
  void set_routed_topk(int64_t k) override;
  void set_plain_router(bool on) override { router.plain = on; }
  void set_fused_ops(FusedMode mode) override;
  std::vector<HeadTensor> head_tensors() const override;
  /// The share of heads a token attends with now: the trained (h_s + K) / h, or that of a K set at run time
  /// (sampling.topk; K = 0: the shared heads only). What attention_path: auto decides by.
  double active_share() const;

  MoHAttentionOptions options;
  nn::Linear qkv{nullptr}, q{nullptr}, kv{nullptr}, proj{nullptr};
  HeadRouter router;
  /// qk_norm's layers, registered as `q_norm` / `k_norm` (LightningDiT's names): LayerNorm or RMSNorm over d.
  std::shared_ptr<torch::nn::Module> q_norm, k_norm;

 private:
  /// The heads' gated outputs (B, N, h·d) from one qkv product for every head (the dense path of MHA and MoH).
  at::Tensor mix_fused_qkv(const at::Tensor& x, const RopeTables& rope, HeadRouting& routing);
  /// The same from keys/values projected apart from the queries: MoA (one key/value head), and the sparse path
  /// (queries only for the selected (token, head) pairs when no qk_norm or rotation needs them whole).
  at::Tensor mix_split_qkv(const at::Tensor& x, const RopeTables& rope, HeadRouting& routing, bool sparse);
  /// Queries or keys (B, h, N, d) after qk_norm and the rotary embedding (as given when both are off).
  at::Tensor shape_qk(const at::Tensor& t, const std::shared_ptr<torch::nn::Module>& norm,
                      const RopeTables& rope) const;
};
TORCH_MODULE(MoHAttention);

}  // namespace moh::nn
