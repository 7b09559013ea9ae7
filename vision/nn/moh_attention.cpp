#include "vision/nn/moh_attention.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

#include "core/train/activation_checkpoint.h"
#include "vision/nn/attention_core.h"
#include "vision/nn/fused_ops.h"

namespace moh::nn {

namespace {
// Floor of the top-K renormalisation denominator (official code clamps the sum; it never binds since the K
// largest of E probabilities sum to at least K/E).
constexpr double kRenormEps = 1e-12;

// Softmax over the last dim of the router's few logits (E, h_s or 2). On a CPU, for fp32 / fp64 rows of at most 8,
// exp(x - max) / sum: ATen's last-dim kernel sets up a vectorised pass per row, which at two or three logits costs
// more than the row itself (docs/BENCHMARKS.md, "MoH router on a CPU"). Elsewhere (a GPU, bf16 logits, whose softmax
// autocast runs in fp32) at::softmax itself.
at::Tensor router_softmax(const at::Tensor& x) {
  const bool few = x.is_cpu() && x.size(-1) <= 8 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  if (!few) return at::softmax(x, -1);
  const at::Tensor e = (x - std::get<0>(x.max(-1, true))).exp();
  return e / e.sum(-1, true);
}
}  // namespace

int64_t MoHAttentionOptions::active_heads() const {
  switch (mode) {
    case AttentionMode::mha:
      return num_heads;
    case AttentionMode::moa:
      return topk;
    case AttentionMode::moh:
      return topk == 0 ? num_heads : shared_heads + topk;
  }
  return num_heads;
}

void MoHAttentionOptions::validate() const {
  const std::string what = "attention options";
  if (rope_grid > 0 && (head_dim > 0 ? head_dim : (num_heads > 0 ? dim / num_heads : 0)) % 4 != 0)
    throw UserError(what, "2-D rotary embedding needs a head width divisible by 4", "model.pos: sincos");
  if (dim <= 0 || num_heads <= 0) throw UserError(what, "dim and num_heads must be positive", "");
  if (head_dim == 0 && dim % num_heads != 0)
    throw UserError(what, "dim " + std::to_string(dim) + " is not divisible by num_heads " + std::to_string(num_heads),
                    "choose heads dividing dim, or set head_dim explicitly");
  if (head_dim < 0) throw UserError(what, "head_dim must be >= 0 (0 = dim / num_heads)", "");
  if (mode == AttentionMode::moh) {
    if (const std::string why = head_split_error(num_heads, shared_heads, topk); !why.empty())
      throw UserError(what, why, "");
  } else if (mode == AttentionMode::moa) {
    if (router == RouterKind::query_norm)
      throw UserError(what, "the query_norm router is for moh layers (moa keeps one key/value head)",
                      "router: learned");
    if (topk <= 0 || topk > num_heads)
      throw UserError(what, "moa needs 1 <= topk <= num_heads, got " + std::to_string(topk), "");
  }
}

HeadRouter::HeadRouter(torch::nn::Module& owner, const MoHAttentionOptions& o)
    : heads(o.num_heads),
      shared(o.mode == AttentionMode::moh ? o.shared_heads : 0),
      topk(o.topk),
      scale_by_k(o.mode == AttentionMode::moh),
      fused(o.fused_ops) {
  if (o.mode == AttentionMode::mha) {
    topk = 0;
    return;
  }
  by_query_norm = o.router == RouterKind::query_norm;
  if (by_query_norm) return;  // no parameters
  auto lin = [&](int64_t out) { return Linear(torch::nn::LinearOptions(o.dim, out).bias(false)); };
  if (topk > 0) wg = owner.register_module("wg", lin(heads - shared));
  if (topk > 0 && shared > 0) wg_0 = owner.register_module("wg_0", lin(2));
  if (shared > 1) wg_1 = owner.register_module("wg_1", lin(shared));
}

HeadRouting HeadRouter::route(const at::Tensor& x, bool training) const {
  RECORD_USER_SCOPE("moh::router");  // profiles (moh bench train --profile) count this as the router's time
  if (plain || topk == 0 || shared_only) return route_plain(x, training);
  return use_fused_ops(fused, x.device()) ? route_fused(x, training) : route_compact(x, training);
}

HeadRouting HeadRouter::route_plain(const at::Tensor& x, bool training) const {
  HeadRouting r;
  const int64_t T = x.size(0);
  at::Tensor shared_g, routed_g;
  if (topk > 0 && shared_only) {
    routed_g = at::zeros({T, heads - shared}, x.options());  // no routed head: r.routed stays undefined
  } else if (topk > 0) {
    const int64_t E = heads - shared;
    at::Tensor p = at::softmax(at::linear(x, wg->weight), -1);  // (T, E): softmax before top-K (official order)
    r.routed = std::get<1>(p.topk(topk, -1));                   // (T, K)
    at::Tensor mask = at::zeros_like(p).scatter_(1, r.routed, 1.0);
    routed_g = p * mask;
    routed_g = routed_g / routed_g.sum(-1, true).clamp_min(kRenormEps);  // renormalise the kept weights
    if (scale_by_k) routed_g = routed_g * static_cast<double>(topk);     // average 1 per active routed head
    if (training) r.aux_loss = (p.mean(0) * mask.mean(0)).sum() * static_cast<double>(E);  // E·Σ P_i f_i
  }
  if (shared > 1)
    shared_g = at::softmax(at::linear(x, wg_1->weight), -1) * static_cast<double>(shared);  // (T, h_s)
  else if (shared == 1)
    shared_g = at::ones({T, 1}, x.options());
  if (topk > 0 && shared > 0) {
    at::Tensor a = at::softmax(at::linear(x, wg_0->weight), -1) * 2.0;  // (T, 2): α1, α2 ∈ (0, 2)
    shared_g = shared_g * a.narrow(1, 0, 1);
    routed_g = routed_g * a.narrow(1, 1, 1);
  }
  if (shared_g.defined() && routed_g.defined())
    r.gates = at::cat({shared_g, routed_g}, -1);  // [shared | routed]: router index j is head h_s + j
  else
    r.gates = shared_g.defined() ? shared_g : routed_g;
  return r;
}

std::vector<at::Tensor> split_heads(const at::Tensor& y, int64_t parts, int64_t heads, int64_t d) {
  std::vector<at::Tensor> out = y.view({y.size(0), y.size(1), parts, heads, d}).unbind(2);  // (B, N, heads, d) each
  for (auto& t : out) t = t.transpose(1, 2);
  return out;
}

namespace {
// The router's logits from one product over its layers' stacked rows: columns [wg (E) | wg_1 (h_s > 1) | wg_0 (h_s >
// 0)].
at::Tensor stacked_logits(const HeadRouter& r, const at::Tensor& x) {
  std::vector<at::Tensor> w{working_weight(r.wg->weight)};
  if (r.wg_1) w.push_back(working_weight(r.wg_1->weight));
  if (r.wg_0) w.push_back(working_weight(r.wg_0->weight));
  return at::linear(x, w.size() == 1 ? w[0] : at::cat(w, 0));  // (T, E + n_shared + n_alpha)
}
}  // namespace

HeadRouting HeadRouter::route_compact(const at::Tensor& x, bool training) const {
  HeadRouting r;
  const int64_t T = x.size(0), E = heads - shared;
  const int64_t n_alpha = shared > 0 ? 2 : 0, n_shared = shared > 1 ? shared : 0;
  const at::Tensor logits = stacked_logits(*this, x);           // one product for the three layers
  const at::Tensor p = router_softmax(logits.narrow(1, 0, E));  // (T, E)
  auto [kept, routed] = p.topk(topk, -1);                       // (T, K) each
  r.routed = routed;
  // The kept weights renormalised (their sum is at least K/E: the plain path's clamp never binds) times K, and α2.
  at::Tensor alpha;  // (T, 2) = softmax(wg_0 x) × 2
  at::Tensor coef = (scale_by_k ? static_cast<double>(topk) : 1.0) / kept.sum(-1, true);  // (T, 1)
  if (n_alpha > 0) {
    alpha = router_softmax(logits.narrow(1, E + n_shared, 2)) * 2.0;
    coef = coef * alpha.narrow(1, 1, 1);
  }
  const at::Tensor routed_g = at::zeros({T, E}, p.options()).scatter(1, routed, kept * coef);  // (T, E)
  if (training) {  // E·Σ P_i f_i, f_i = picks_i / T (integer counts: exact, and deterministic on a GPU)
    const at::Tensor flat = routed.reshape({-1});
    r.picks = at::zeros({E}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));  // (E) int64
    r.aux_loss = (p.mean(0) * r.picks.to(p.scalar_type())).sum() * (static_cast<double>(E) / static_cast<double>(T));
  }
  if (shared == 0) {
    r.gates = routed_g;
    return r;
  }
  const at::Tensor a1 = alpha.narrow(1, 0, 1);  // (T, 1)
  const at::Tensor shared_g =
      n_shared > 0 ? router_softmax(logits.narrow(1, E, n_shared)) * (a1 * static_cast<double>(shared)) : a1;
  r.gates = at::cat({shared_g, routed_g}, -1);  // [shared | routed]: router index j is head h_s + j
  return r;
}

HeadRouting HeadRouter::route_fused(const at::Tensor& x, bool training) const {
  fused::RouterShape s;
  s.experts = static_cast<int>(heads - shared), s.shared = static_cast<int>(shared), s.topk = static_cast<int>(topk);
  s.scale_by_k = scale_by_k;
  const at::Tensor logits = stacked_logits(*this, x);
  if (s.logits() > fused::kMaxRouterLogits || topk > fused::kMaxRouterTopK || !fused_dtype(logits.scalar_type()) ||
      !fused_kernels_available(logits.device()))
    return route_compact(x, training);
  FusedRouting f = fused_route(logits, s, training);
  return {f.gates, f.routed, f.aux_loss, f.picks};
}

void HeadRouter::set_topk(int64_t k) {
  if (topk == 0) return;  // mha and all-shared layers route nothing
  const int64_t pool = heads - shared;
  if (k < 0 || k > pool)
    throw UserError("top-K " + std::to_string(k), "outside [0, " + std::to_string(pool) + "], the routed pool",
                    "choose at most the pool size");
  if (k == 0 && shared == 0)
    throw UserError("top-K 0", "a layer without shared heads would attend with no head", "choose K ≥ 1");
  shared_only = k == 0;
  if (k > 0) topk = k;
}

HeadRouting HeadRouter::route_by_queries(const at::Tensor& q) const {
  RECORD_USER_SCOPE("moh::router");
  HeadRouting r;
  const int64_t T = q.size(0), E = heads - shared;
  if (topk == 0) {
    r.gates = at::ones({T, heads}, q.options());
    return r;
  }
  if (shared_only)
    return {at::cat({at::ones({T, shared}, q.options()), at::zeros({T, E}, q.options())}, -1), {}, {}, {}};
  const at::Tensor norms = q.detach().norm(2, {-1});  // (T, E)
  const at::Tensor logits = E > 1 ? norms / norms.std({-1}, /*unbiased=*/true, /*keepdim=*/true) : norms;
  r.routed = std::get<1>(at::softmax(logits, -1).topk(topk, -1));  // (T, K), the official order: softmax, top-K
  at::Tensor routed_g = at::zeros({T, E}, q.options()).scatter_(1, r.routed, 1.0);
  r.gates = shared > 0 ? at::cat({at::ones({T, shared}, q.options()), routed_g}, -1) : routed_g;
  return r;
}

at::Tensor routed_queries(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& bq, int64_t shared,
                          int64_t heads) {
  const int64_t d = wq.size(0) / heads, rows = (heads - shared) * d;
  const at::Tensor w = wq.narrow(0, shared * d, rows), b = bq.defined() ? bq.narrow(0, shared * d, rows) : bq;
  return at::linear(x, w, b).view({x.size(0), heads - shared, d});
}

MoHAttentionImpl::MoHAttentionImpl(const MoHAttentionOptions& o) : options(o) {
  options.validate();
  const int64_t C = o.dim, inner = o.inner_dim(), d = o.head_dim_resolved();
  using torch::nn::LinearOptions;
  if (o.mode == AttentionMode::moa) {
    q = register_module("q", Linear(LinearOptions(C, inner).bias(o.qkv_bias)));
    kv = register_module("kv", Linear(LinearOptions(C, 2 * d).bias(o.qkv_bias)));
  } else {
    qkv = register_module("qkv", Linear(LinearOptions(C, 3 * inner).bias(o.qkv_bias)));
  }
  proj = register_module("proj", Linear(LinearOptions(inner, C)));
  router = HeadRouter(*this, o);
  if (o.qk_norm) {
    auto make = [&]() -> std::shared_ptr<torch::nn::Module> {
      if (o.qk_norm_kind == NormKind::rmsnorm) return RMSNorm(d).ptr();
      return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})).ptr();  // nn.LayerNorm(d): affine, eps 1e-5
    };
    q_norm = register_module("q_norm", make());
    k_norm = register_module("k_norm", make());
  }
}

at::Tensor MoHAttentionImpl::shape_qk(const at::Tensor& t, const std::shared_ptr<torch::nn::Module>& norm,
                                      const RopeTables& rope) const {
  at::Tensor out = t;
  if (norm) {
    if (auto* rms = norm->as<RMSNormImpl>())
      out = rms->forward(out);
    else
      out = norm->as<torch::nn::LayerNormImpl>()->forward(out);
  }
  return rope.defined() ? apply_rope(out, rope) : out;
}

void MoHAttentionImpl::set_fused_ops(FusedMode mode) {
  options.fused_ops = router.fused = mode;
}

void MoHAttentionImpl::set_routed_topk(int64_t k) {
  router.set_topk(k);
  if (router.topk > 0) options.topk = router.topk;  // the active ratio the automatic path rule reads
}

std::vector<HeadTensor> MoHAttentionImpl::head_tensors() const {
  if (options.mode == AttentionMode::moa)  // one key/value head: only queries and the projection are per head
    return {{"q.weight", 0, 1}, {"q.bias", 0, 1}, {"proj.weight", 1, 1}};
  return {{"qkv.weight", 0, 3}, {"qkv.bias", 0, 3}, {"proj.weight", 1, 1}};  // rows (3, h, d), columns (h, d)
}

AttentionOutput MoHAttentionImpl::forward(const at::Tensor& x, const RopeTables& rope) {
  AttentionOutput out = forward_with_path(x, options.path, rope);
  if (is_training() && out.routed.defined() && !recomputing())
    count_training_picks(out.routed, options.routed_pool(), out.picks);
  return out;
}

double MoHAttentionImpl::active_share() const {
  const auto h = static_cast<double>(options.num_heads);
  if (options.mode == AttentionMode::mha || options.topk == 0) return static_cast<double>(options.active_heads()) / h;
  const int64_t k = router.shared_only ? 0 : router.topk;
  return static_cast<double>(options.mode == AttentionMode::moa ? k : router.shared + k) / h;
}

AttentionOutput MoHAttentionImpl::forward_with_path(const at::Tensor& x, AttentionPath path, const RopeTables& rope) {
  TORCH_CHECK(rope.defined() == (options.rope_grid > 0), "MoHAttention: rotary tables are needed iff rope_grid > 0");
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  HeadRouting routing;  // the query_norm router waits for the queries
  if (options.mode != AttentionMode::mha && !router.by_query_norm)
    routing = router.route(x.reshape({B * N, C}), is_training());  // router input = the tensor feeding QKV
  path = choose_attention_path(path, active_share(), N, x.device());
  const bool sparse = path == AttentionPath::sparse && router.topk > 0;
  const at::Tensor mixed = !sparse && options.mode != AttentionMode::moa ? mix_fused_qkv(x, rope, routing)
                                                                         : mix_split_qkv(x, rope, routing, sparse);
  AttentionOutput out;
  out.out = proj->forward(head_hooks.apply(mixed, proj->weight, options.num_heads));  // (B, N, C)
  out.aux_loss = routing.aux_loss;
  out.routed = routing.routed;
  out.picks = routing.picks;
  return out;
}

at::Tensor MoHAttentionImpl::mix_fused_qkv(const at::Tensor& x, const RopeTables& rope, HeadRouting& routing) {
  // One qkv product for Q, K and V of every head (as the official module), then every head attends.
  const int64_t B = x.size(0), N = x.size(1), h = options.num_heads, d = options.head_dim_resolved();
  const std::vector<at::Tensor> qkvx = split_heads(qkv->forward(x), 3, h, d);  // (B, h, N, d) each
  if (router.by_query_norm)
    routing = router.route_by_queries(
        qkvx[0].narrow(1, router.shared, h - router.shared).permute({0, 2, 1, 3}).reshape({B * N, -1, d}));
  return mix_heads_dense(shape_qk(qkvx[0], q_norm, rope), shape_qk(qkvx[1], k_norm, rope), qkvx[2], routing.gates,
                         1.0 / std::sqrt(static_cast<double>(d)), options.fused,
                         use_fused_ops(options.fused_ops, x.device()));  // (B, N, h·d)
}

at::Tensor MoHAttentionImpl::mix_split_qkv(const at::Tensor& x, const RopeTables& rope, HeadRouting& routing,
                                           bool sparse) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  const int64_t h = options.num_heads, d = options.head_dim_resolved(), inner = h * d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor x_flat = x.reshape({B * N, C});  // (T, C)
  // Keys/values of every head (they cannot shrink: any selected query attends to all of them).
  at::Tensor k, v;    // (B, h_kv, N, d)
  at::Tensor wq, bq;  // query projection (inner, C) / (inner)
  if (options.mode == AttentionMode::moa) {
    const std::vector<at::Tensor> kvx = split_heads(kv->forward(x), 2, 1, d);  // (B, 1, N, d) each
    k = kvx[0];
    v = kvx[1];
    wq = q->weight;
    bq = options.qkv_bias ? q->bias : at::Tensor();
  } else {
    const at::Tensor& w = qkv->weight;  // rows [0, inner) = Q, [inner, 2·inner) = K, [2·inner, 3·inner) = V
    at::Tensor b = options.qkv_bias ? qkv->bias : at::Tensor();
    const std::vector<at::Tensor> kvx = split_heads(
        at::linear(x, w.narrow(0, inner, 2 * inner), b.defined() ? b.narrow(0, inner, 2 * inner) : b), 2, h, d);
    k = kvx[0];  // (B, h, N, d)
    v = kvx[1];
    wq = w.narrow(0, 0, inner);
    bq = b.defined() ? b.narrow(0, 0, inner) : b;
  }
  if (router.by_query_norm) routing = router.route_by_queries(routed_queries(x_flat, wq, bq, router.shared, h));
  k = shape_qk(k, k_norm, rope);
  QuerySource qs;
  if (sparse && !options.qk_norm && !rope.defined()) {  // queries projected only for the selected pairs
    qs.x = x_flat;
    qs.wq = wq;
    qs.bq = bq;
    return mix_heads_sparse(qs, k, v, routing.gates, routing.routed, h, router.shared, scale, options.fused);
  }
  // Queries normalised / rotated whole; MoA's dense path: queries of every head, keys/values shared by all heads.
  qs.q = shape_qk(at::linear(x, wq, bq).view({B, N, h, d}).transpose(1, 2), q_norm, rope);  // (B, h, N, d)
  if (sparse) return mix_heads_sparse(qs, k, v, routing.gates, routing.routed, h, router.shared, scale, options.fused);
  return mix_heads_dense(qs.q, k, v, routing.gates, scale, options.fused, use_fused_ops(options.fused_ops, x.device()));
}

}  // namespace moh::nn
