#include "vision/transnext.h"

#include <torch/nn/functional/normalization.h>
#include <torch/nn/init.h>

#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/registry.h"
#include "core/train/activation_checkpoint.h"
#include "vision/nn/fused_ops.h"
#include "vision/sliding_window_op.h"

namespace moh::vision {

namespace {
constexpr double kBlockNormEps = 1e-6;     // block and stage LayerNorms
constexpr double kEmbedNormEps = 1e-5;     // patch-embed and pool LayerNorms (PyTorch default)
constexpr double kNormalizeEps = 1e-12;    // F.normalize
constexpr double kInitTemperature = 0.24;  // softplus(τ) = 1 / 0.24 at init
constexpr double kTruncStd = 0.02;
constexpr double kLocalBiasStd = 0.0004;
constexpr int64_t kCpbHidden = 512;
constexpr int64_t kWindow = 3, kWindowArea = kWindow * kWindow;
constexpr double kCpbLogBase = 8.0;
// Sparse path buckets (vision/nn/attention_core.h: bucket_pairs): shared groups and routed ones near that size share
// the first bucket, the other routed groups the second.
constexpr double kBucketFill = 0.75;
constexpr int kMaxBuckets = 2;

// LayerNorm in its parameters' dtype (fp32): under CPU autocast LibTorch 1.13 hands layer_norm a bf16 input with fp32
// weights and fails; CUDA autocast runs layer_norm in fp32 anyway.
at::Tensor ln(torch::nn::LayerNorm m, const at::Tensor& x) {
  return m->forward(x.to(m->weight.scalar_type()));
}

at::Tensor l2n(const at::Tensor& x) {
  return x / x.norm(2, -1, true).clamp_min(kNormalizeEps);
}

// timm/torch trunc_normal_(std) truncates at absolute ±2, i.e. effectively a plain normal for small std.
void trunc_normal_(at::Tensor t, double std) {
  torch::NoGradGuard ng;
  t.normal_(0.0, std).clamp_(-2.0, 2.0);
}

at::Tensor drop_path(const at::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  const double keep = 1.0 - p;
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = x.size(0);
  return x * at::empty(shape, x.options()).bernoulli_(keep) / keep;  // timm DropPath: per-sample, scaled
}

}  // namespace

// ---- options ---------------------------------------------------------------------------------------------------

int64_t TransNeXtOptions::stage_size(int64_t i) const {
  return img_size / (patch_size << i);
}
int64_t TransNeXtOptions::pretrain_stage_size(int64_t i) const {
  return (pretrain_size > 0 ? pretrain_size : img_size) / (patch_size << i);
}

nn::MoHAttentionOptions TransNeXtOptions::stage_attention(int64_t i) const {
  nn::MoHAttentionOptions o(embed_dims[i], num_heads[i]);
  o.qkv_bias = qkv_bias;
  o.path = attention_path;
  o.router = router;
  o.fused_ops = fused;
  if (attention[i] == AttentionMode::moh)
    o.moh(shared_heads[i], topk[i]);
  else if (attention[i] == AttentionMode::moa)
    o.moa(topk[i]);
  return o;
}

double TransNeXtOptions::active_ratio() const {
  double active = 0, total = 0;
  for (int64_t i = 0; i < 4; ++i) {
    active += static_cast<double>(depths[i] * stage_attention(i).active_heads());
    total += static_cast<double>(depths[i] * num_heads[i]);
  }
  return active / total;
}

int64_t TransNeXtOptions::routed_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < 4; ++i) n += (attention[i] != AttentionMode::mha && topk[i] > 0) ? depths[i] : 0;
  return n;
}

void TransNeXtOptions::validate() const {
  const std::string what = "TransNeXt options";
  const int64_t unit = patch_size * 8;
  if (img_size <= 0 || img_size % unit != 0)
    throw UserError(what,
                    "img_size " + std::to_string(img_size) + " must be a positive multiple of " + std::to_string(unit) +
                        " (patch_size · 8)",
                    "resize or pad the input");
  for (int64_t i = 0; i < 4; ++i) {
    if (pretrain_stage_size(i) < 2)
      throw UserError(what,
                      "stage " + std::to_string(i + 1) +
                          " map is 1×1 at the (pretraining) size, which makes the "
                          "CPB coordinates divide by zero (NaN)",
                      "use a larger img_size or a smaller patch_size");
    if (sr_ratios[i] > 1 && stage_size(i) / sr_ratios[i] < 1)
      throw UserError(what, "stage " + std::to_string(i + 1) + " pool would be empty", "lower sr_ratios");
    if (depths[i] < 0) throw UserError(what, "depths must be >= 0", "");
    stage_attention(i).validate();
  }
  if (drop_path_rate < 0 || drop_path_rate >= 1) throw UserError(what, "drop_path_rate must be in [0, 1)", "");
  check_router(router, std::find(attention.begin(), attention.end(), AttentionMode::moh) != attention.end(), "MoH-ViT");
  if (num_classes <= 0 || in_chans <= 0) throw UserError(what, "num_classes and in_chans must be positive", "");
}

namespace {
// The distinct values of a 1-D tensor, ascending, and each element's rank among them: at::_unique2(x, sorted,
// return_inverse), by one sort (LibTorch 1.13's CPU unique hashes every element). Values that compare equal share a
// rank, as in unique.
std::pair<at::Tensor, at::Tensor> sorted_ranks(const at::Tensor& x) {  // x (n) → values (u), rank (n)
  auto [sorted, order] = x.sort();
  const int64_t n = x.numel();
  at::Tensor fresh = at::ones({n}, x.options().dtype(at::kBool));  // the first of each run of equal values
  if (n > 1) fresh.narrow(0, 1, n - 1).copy_(sorted.narrow(0, 1, n - 1) != sorted.narrow(0, 0, n - 1));
  at::Tensor rank_sorted = fresh.to(at::kLong).cumsum(0) - 1;
  return {sorted.masked_select(fresh), at::empty_like(rank_sorted).scatter_(0, order, rank_sorted)};
}

// One axis's relative coordinates: each query position against each pooled key bin's centre, scaled to the
// pretraining size as CPB scales them. (q·k), query-major.
at::Tensor axis_coordinates(int64_t q, int64_t k, int64_t pretrain) {
  const at::Tensor aq = at::arange(q, at::kFloat);
  const at::Tensor ak = at::adaptive_avg_pool1d(aq.unsqueeze(0), {k}).squeeze(0);  // pool-bin centres
  return ((aq.reshape({-1, 1}) - ak.reshape({1, -1})) / static_cast<double>(pretrain - 1) * 8.0).reshape({-1});
}

std::pair<at::Tensor, at::Tensor> compute_relative_position_cpb(int64_t qh, int64_t qw, int64_t kh, int64_t kw,
                                                                int64_t ph, int64_t pw) {
  // A pair's height coordinate depends only on (query row, key row), its width coordinate only on (query column, key
  // column), and every height value meets every width value: the distinct pairs are the product of each axis's
  // distinct values, in unique_dim's lexicographic order, and a pair's row is rank_h · |widths| + rank_w. Ranking
  // the Nq·Nk pairs themselves took seconds for a large first stage (10M pairs in MoH-ViT-Nano's at 224 px).
  auto [uh, rank_h] = sorted_ranks(axis_coordinates(qh, kh, ph));  // (Uh), (qh·kh)
  auto [uw, rank_w] = sorted_ranks(axis_coordinates(qw, kw, pw));  // (Uw), (qw·kw)
  const int64_t nw = uw.size(0);
  at::Tensor table = at::stack({uh.repeat_interleave(nw), uw.repeat({uh.size(0)})}, -1);  // (Uh·Uw, 2)
  table = at::sign(table) * at::log2(table.abs() + 1.0) / std::log2(kCpbLogBase);         // log-spaced
  // (qh, qw, kh, kw) flattened: query (i, j) row-major, then key (k, l) row-major.
  at::Tensor index = (rank_h.view({qh, 1, kh, 1}) * nw + rank_w.view({1, qw, 1, kw})).reshape({-1});
  return {table, index};
}
}  // namespace

std::pair<at::Tensor, at::Tensor> relative_position_cpb(int64_t qh, int64_t qw, int64_t kh, int64_t kw, int64_t ph,
                                                        int64_t pw) {
  // Memoised per grid: a run builds the model several times (its EMA copy, the memory check's steps). Clones: a
  // model may move its own copy.
  static std::mutex mutex;
  static std::map<std::array<int64_t, 6>, std::pair<at::Tensor, at::Tensor>> done;
  const std::array<int64_t, 6> key{qh, qw, kh, kw, ph, pw};
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = done.find(key);
  if (it == done.end()) it = done.emplace(key, compute_relative_position_cpb(qh, qw, kh, kw, ph, pw)).first;
  return {it->second.first.clone(), it->second.second.clone()};
}

at::Tensor gather_bias(const at::Tensor& b, const at::Tensor& index, int64_t nq, int64_t nk) {
  // Head by head from its 1-D column: the backward of a gather along a dim of a 2-D tensor adds index by index in
  // LibTorch 1.13 (a separate op for each of the 10M positions of a 224-px first stage), that of a 1-D one in one
  // loop; and one flat gather of all heads would hold an int64 index twice the size of the bias until the backward.
  std::vector<at::Tensor> heads;
  for (int64_t i = 0; i < b.size(1); ++i) heads.push_back(b.select(1, i).index_select(0, index));  // (Nq·Nk)
  return at::stack(heads).view({b.size(1), nq, nk});                                               // (h, Nq, Nk)
}

namespace {
at::Tensor cpb_bias(nn::Linear fc1, nn::Linear fc2, const at::Tensor& table, const at::Tensor& index, int64_t nq,
                    int64_t nk) {
  return gather_bias(fc2->forward(at::relu(fc1->forward(table))), index, nq, nk);  // MLP (T, h) → (h, Nq, Nk)
}
}  // namespace

// ---- attention ---------------------------------------------------------------------------------------------------

TransNeXtAttentionImpl::TransNeXtAttentionImpl(const nn::MoHAttentionOptions& o, int64_t height, int64_t width,
                                               int64_t sr_)
    : options(o), H(height), W(width), sr_ratio(sr_), aggregated(sr_ > 1) {
  options.validate();
  const int64_t C = o.dim, h = o.num_heads, d = o.head_dim_resolved(), N = H * W;
  TORCH_CHECK(h * d == C, "TransNeXt attention needs head_dim · heads == dim");
  if (aggregated) {
    q = register_module("q", nn::Linear(torch::nn::LinearOptions(C, C).bias(o.qkv_bias)));
    kv = register_module("kv", nn::Linear(torch::nn::LinearOptions(C, 2 * C).bias(o.qkv_bias)));
  } else {
    qkv = register_module("qkv", nn::Linear(torch::nn::LinearOptions(C, 3 * C).bias(o.qkv_bias)));
  }
  proj = register_module("proj", nn::Linear(C, C));
  temperature =
      register_parameter("temperature", at::full({h, 1, 1}, std::log(std::exp(1.0 / kInitTemperature) - 1.0)));
  query_embedding = register_parameter("query_embedding", at::empty({h, 1, d}));
  trunc_normal_(query_embedding, kTruncStd);
  cpb_fc1 = register_module("cpb_fc1", nn::Linear(2, kCpbHidden));
  cpb_fc2 = register_module("cpb_fc2", nn::Linear(kCpbHidden, h));
  if (aggregated) {
    pool_h = H / sr_ratio;
    pool_w = W / sr_ratio;
    sr = register_module("sr", torch::nn::Conv2d(torch::nn::Conv2dOptions(C, C, 1)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C}).eps(kEmbedNormEps)));
    relative_pos_bias_local = register_parameter("relative_pos_bias_local", at::empty({h, kWindowArea}));
    trunc_normal_(relative_pos_bias_local, kLocalBiasStd);
    learnable_tokens = register_parameter("learnable_tokens", at::empty({h, d, kWindowArea}));
    trunc_normal_(learnable_tokens, kTruncStd);
    learnable_bias = register_parameter("learnable_bias", at::zeros({h, 1, kWindowArea}));
    // Valid neighbours per position (unfold of ones) -> padding mask and log(valid + P) length scale.
    at::Tensor ones = at::ones({1, 1, H, W});
    at::Tensor valid =
        at::im2col(ones, {kWindow, kWindow}, {1, 1}, {1, 1}, {1, 1}).view({kWindowArea, N}).t();  // (N, 9)
    padding_mask = valid.eq(0);
    at::Tensor ids = at::arange(N, at::kFloat).view({1, 1, H, W}) + 1;  // 1-based, so zero padding reads as −1
    neighbours = (at::im2col(ids, {kWindow, kWindow}, {1, 1}, {1, 1}, {1, 1}).view({kWindowArea, N}).t() - 1)
                     .to(at::kLong)
                     .contiguous();                                                         // (N, 9)
    seq_length_scale = at::log(valid.sum(1, true) + static_cast<double>(pool_h * pool_w));  // (N, 1)
  } else {
    seq_length_scale = at::full({1}, std::log(static_cast<double>(N)));
  }
  router = nn::HeadRouter(*this, o);
}

std::vector<nn::HeadTensor> TransNeXtAttentionImpl::head_tensors() const {
  // Projections are head-major ((groups, h, d) rows; proj columns (h, d)); the others lead with the head axis.
  std::vector<nn::HeadTensor> t{{"q.weight", 0, 1},   {"q.bias", 0, 1},   {"kv.weight", 0, 2},  {"kv.bias", 0, 2},
                                {"qkv.weight", 0, 3}, {"qkv.bias", 0, 3}, {"proj.weight", 1, 1}};
  for (const char* name : {"temperature", "query_embedding", "relative_pos_bias_local", "learnable_tokens",
                           "learnable_bias", "cpb_fc2.weight", "cpb_fc2.bias"})
    t.push_back({name, 0, 1});
  return t;
}

nn::AttentionOutput TransNeXtAttentionImpl::forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& i) {
  nn::AttentionOutput out = run(x, t, i, false);
  if (is_training() && out.routed.defined() && !recomputing())
    count_training_picks(out.routed, options.routed_pool(), out.picks);
  return out;
}
nn::AttentionOutput TransNeXtAttentionImpl::forward_reference(const at::Tensor& x, const at::Tensor& t,
                                                              const at::Tensor& i) {
  return run(x, t, i, true);
}

nn::HeadRouting TransNeXtAttentionImpl::route(const at::Tensor& x) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2), h = options.num_heads;
  if (router.by_query_norm) {  // the raw query projections (before TransNeXt's L2 normalisation) decide
    const nn::Linear& q_lin = aggregated ? q : qkv;  // query rows [0, C), head-major
    const at::Tensor bq = q_lin->bias.defined() ? q_lin->bias.narrow(0, 0, C) : at::Tensor();
    return router.route_by_queries(
        nn::routed_queries(x.reshape({B * N, C}), q_lin->weight.narrow(0, 0, C), bq, router.shared, h));
  }
  if (options.mode != AttentionMode::mha) return router.route(x.reshape({B * N, C}), is_training());
  return {};
}

nn::AttentionOutput TransNeXtAttentionImpl::run(const at::Tensor& x, const at::Tensor& table, const at::Tensor& index,
                                                bool reference) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2), h = options.num_heads;
  TORCH_CHECK(N == H * W, "TransNeXt attention built for ", H, "x", W, " tokens, got ", N,
              " (the model's img_size must equal the input size)");
  const at::Tensor len_scale = seq_length_scale.to(x.device(), x.scalar_type());
  const at::Tensor tau = at::softplus(temperature);  // (h, 1, 1)
  const nn::HeadRouting routing = route(x);
  nn::AttentionOutput out;
  out.aux_loss = routing.aux_loss;
  out.routed = routing.routed;
  out.picks = routing.picks;
  if (!reference && options.path == AttentionPath::sparse && routing.routed.defined()) {  // automatic: dense
    out.out = proj->forward(head_hooks.apply(mix_sparse(x, tau, len_scale, table, index, routing), proj->weight, h));
    return out;
  }
  const at::Tensor o = aggregated ? aggregated_attention(x, tau, len_scale, table, index, reference)
                                  : full_attention(x, tau, len_scale, table, index);  // (B, h, N, d)
  at::Tensor mixed;                                                                   // (B, N, C)
  if (routing.gates.defined() && nn::use_fused_ops(options.fused_ops, o.device()))
    mixed = nn::fused_gate_heads(o, routing.gates, nn::consumer_dtype(o));
  else if (routing.gates.defined())
    mixed = nn::plain_gate_heads(o, routing.gates);
  else
    mixed = o.transpose(1, 2).reshape({B, N, C});
  out.out = proj->forward(head_hooks.apply(mixed, proj->weight, h));
  return out;
}

at::Tensor TransNeXtAttentionImpl::full_attention(const at::Tensor& x, const at::Tensor& tau,
                                                  const at::Tensor& len_scale, const at::Tensor& table,
                                                  const at::Tensor& index) {
  const int64_t N = x.size(1), h = options.num_heads, d = x.size(2) / h;
  const std::vector<at::Tensor> parts = nn::split_heads(qkv->forward(x), 3, h, d);  // (B, h, N, d) each
  const at::Tensor qs = (l2n(parts[0]) + query_embedding) * tau * len_scale;        // length-scaled cosine query
  const at::Tensor bias = cpb_bias(cpb_fc1, cpb_fc2, table, index, N, N);           // (h, N, N)
  return at::matmul(at::softmax(at::matmul(qs, l2n(parts[1]).transpose(-2, -1)) + bias, -1), parts[2]);
}

namespace {
// The 3×3 window around each token: its keys' logits and the weighted sum of its values, computed one of three
// equal ways: the sliding-window ops (CPU; CUDA builds with options.fused), the official native code's im2col +
// matmul, or neighbour by neighbour over shifted zero-padded maps (the test reference).
struct LocalWindow {
  enum class Path { kernels, im2col, reference };
  Path path;
  int64_t H, W;
  at::Tensor k, v;                           // kernels: (B, h, N, d) maps; im2col: (B, h, N, d, 9) neighbours
  std::vector<at::Tensor> k_shift, v_shift;  // reference: per neighbour z = row·3 + col, (B, h, N, d)

  // k_loc, v_loc: (B, N, h, d), keys already normalised.
  LocalWindow(Path p, const at::Tensor& k_loc, const at::Tensor& v_loc, int64_t height, int64_t width)
      : path(p), H(height), W(width) {
    const int64_t B = k_loc.size(0), N = k_loc.size(1), h = k_loc.size(2), d = k_loc.size(3), C = h * d;
    if (path == Path::kernels) {
      k = k_loc.permute({0, 2, 1, 3});
      v = v_loc.permute({0, 2, 1, 3});
    } else if (path == Path::im2col) {
      at::Tensor maps = at::cat({k_loc.reshape({B, N, C}), v_loc.reshape({B, N, C})}, -1)
                            .permute({0, 2, 1})
                            .reshape({B, 2 * C, H, W});
      auto kv_nb = at::im2col(maps, {kWindow, kWindow}, {1, 1}, {1, 1}, {1, 1})  // (B, 2C·9, N), channel-major
                       .reshape({B, 2 * h, d, kWindowArea, N})
                       .permute({0, 1, 4, 2, 3})  // (B, 2h, N, d, 9)
                       .chunk(2, 1);
      k = kv_nb[0];
      v = kv_nb[1];
    } else {
      auto grid = [&](const at::Tensor& t) {  // (B, N, h, d) -> padded (B, h, H+2, W+2, d)
        return at::constant_pad_nd(t.permute({0, 2, 1, 3}).reshape({B, h, H, W, d}), {0, 0, 1, 1, 1, 1});
      };
      const at::Tensor kp = grid(k_loc), vp = grid(v_loc);
      for (int64_t di = 0; di < kWindow; ++di)
        for (int64_t dj = 0; dj < kWindow; ++dj) {
          k_shift.push_back(kp.narrow(2, di, H).narrow(3, dj, W).reshape({B, h, N, d}));
          v_shift.push_back(vp.narrow(2, di, H).narrow(3, dj, W).reshape({B, h, N, d}));
        }
    }
  }

  at::Tensor logits(const at::Tensor& qs) const {  // qs (B, h, N, d) -> (B, h, N, 9)
    if (path == Path::kernels) return sliding_window_qk(qs, k, H, W);
    if (path == Path::im2col) return at::matmul(qs.unsqueeze(-2), k).squeeze(-2);
    std::vector<at::Tensor> per_slot;
    for (const at::Tensor& kz : k_shift) per_slot.push_back((qs * kz).sum(-1));
    return at::stack(per_slot, -1);
  }

  // attn (B, h, N, 9) -> (B, h, N, d); the reference sums into zeros like `qs` (its dtype under autocast).
  at::Tensor mix(const at::Tensor& attn, const at::Tensor& qs) const {
    if (path == Path::kernels) return sliding_window_av(attn, v, H, W);
    if (path == Path::im2col) return at::matmul(attn.unsqueeze(-2), v.transpose(-2, -1)).squeeze(-2);
    at::Tensor out = at::zeros_like(qs);
    for (int64_t z = 0; z < kWindowArea; ++z) out = out + attn.select(-1, z).unsqueeze(-1) * v_shift[z];
    return out;
  }
};
}  // namespace

at::Tensor TransNeXtAttentionImpl::aggregated_attention(const at::Tensor& x, const at::Tensor& tau,
                                                        const at::Tensor& len_scale, const at::Tensor& table,
                                                        const at::Tensor& index, bool reference) {
  const int64_t B = x.size(0), N = x.size(1), h = options.num_heads, d = x.size(2) / h, P = pool_h * pool_w;
  const at::Tensor qn = l2n(q->forward(x).reshape({B, N, h, d}).permute({0, 2, 1, 3}));  // (B, h, N, d)
  const at::Tensor qs = (qn + query_embedding) * tau * len_scale;                        // (B, h, N, d)
  auto kvl = kv->forward(x).chunk(2, -1);                                                // K | V, each (B, N, C)
  using Path = LocalWindow::Path;
  Path path = reference ? Path::reference : Path::im2col;  // im2col: window_kernels = false, or no kernels built
  if (!reference && window_kernels && (x.is_cpu() || options.fused) && sliding_window_kernels_available(x.device()))
    path = Path::kernels;
  const LocalWindow window(path, l2n(kvl[0].reshape({B, N, h, d})), kvl[1].reshape({B, N, h, d}), H, W);
  const at::Tensor attn_local = (window.logits(qs) + relative_pos_bias_local.unsqueeze(1))
                                    .masked_fill(padding_mask.to(x.device()),
                                                 -std::numeric_limits<double>::infinity());  // bias, then mask
  // Pooled branch: 1×1 conv -> GELU -> adaptive avg pool -> LN; keys/values from the same kv projection.
  const std::vector<at::Tensor> kvp = pooled_kv(x);                                        // (B, h, P, d) each
  const at::Tensor pool_bias = cpb_bias(cpb_fc1, cpb_fc2, table, index, N, P);             // (h, N, P)
  const at::Tensor attn_pool = at::matmul(qs, l2n(kvp[0]).transpose(-2, -1)) + pool_bias;  // (B, h, N, P)
  const at::Tensor attn = at::softmax(at::cat({attn_local, attn_pool}, -1), -1);           // one softmax
  // Learnable tokens and bias, added after the softmax with the plain normalised query.
  const at::Tensor local = at::matmul(qn, learnable_tokens) + learnable_bias + attn.narrow(-1, 0, kWindowArea);
  return window.mix(local, qs) + at::matmul(attn.narrow(-1, kWindowArea, P), kvp[1]);  // (B, h, N, d)
}

at::Tensor average_pool(const at::Tensor& x, int64_t ph, int64_t pw, bool deterministic) {
  const int64_t H = x.size(-2), W = x.size(-1);
  if (deterministic && x.is_cuda() && H % ph == 0 && W % pw == 0)
    return at::avg_pool2d(x, {H / ph, W / pw}, {H / ph, W / pw});
  return at::adaptive_avg_pool2d(x, {ph, pw});
}

std::vector<at::Tensor> TransNeXtAttentionImpl::pooled_kv(const at::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(2), h = options.num_heads, d = C / h, P = pool_h * pool_w;
  at::Tensor xs = x.permute({0, 2, 1}).reshape({B, C, H, W});
  xs = average_pool(at::gelu(sr->forward(xs)), pool_h, pool_w, at::globalContext().deterministicAlgorithms())
           .reshape({B, C, P})
           .permute({0, 2, 1});
  return nn::split_heads(kv->forward(ln(norm, xs)), 2, h, d);  // (B, h, P, d) each
}

// Sparse path: only the (token, head) pairs with a non-zero gate (every shared head, the K routed ones) attend.
// Queries are projected per pair; keys and values stay whole (every token is some selected query's neighbour or
// key). Pairs are grouped by (batch, head) into padded buckets (bucket_pairs): per group the pooled (or, at stage 4,
// all) keys are one small matrix product, the 3×3 window is a gather of [K | V] rows with a zero row for positions
// outside the map (what unfold's zero padding gives the dense path).
at::Tensor TransNeXtAttentionImpl::mix_sparse(const at::Tensor& x, const at::Tensor& tau, const at::Tensor& len_scale,
                                              const at::Tensor& table, const at::Tensor& index,
                                              const nn::HeadRouting& routing) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2), h = options.num_heads, d = C / h, T = B * N;
  const at::Device dev = x.device();
  // Queries of every (token, head) by one product: gathering the input rows per pair instead would move C values
  // per pair (more than the d of a query) and a per-group copy of the head's weights, in both directions.
  const nn::Linear& q_lin = aggregated ? q : qkv;  // query rows [0, C), head-major
  const at::Tensor q_rows =
      at::linear(x, q_lin->weight.narrow(0, 0, C), q_lin->bias.defined() ? q_lin->bias.narrow(0, 0, C) : at::Tensor())
          .reshape({T * h, d});        // row (b·N + n)·h + head
  at::Tensor keys, values, bias_rows;  // (B·h, Nk, d) normalised / plain, (h·N, Nk): pooled (Nk = P) or all tokens
  at::Tensor local;                    // (T·h + 1, 2d): [normalised K | V] per (token, head), last row zeros
  if (aggregated) {
    const int64_t P = pool_h * pool_w;
    at::Tensor kvl = kv->forward(x);                                     // (B, N, 2C)
    at::Tensor k_loc = l2n(kvl.narrow(-1, 0, C).reshape({B, N, h, d}));  // (B, N, h, d)
    at::Tensor v_loc = kvl.narrow(-1, C, C).reshape({B, N, h, d});
    local = at::constant_pad_nd(at::cat({k_loc, v_loc}, -1).reshape({T * h, 2 * d}), {0, 0, 0, 1});
    const std::vector<at::Tensor> kvp = pooled_kv(x);  // (B, h, P, d) each
    keys = l2n(kvp[0]).reshape({B * h, P, d});
    values = kvp[1].reshape({B * h, P, d});
    bias_rows = cpb_bias(cpb_fc1, cpb_fc2, table, index, N, P).reshape({h * N, P});
  } else {
    const at::Tensor& w = qkv->weight;
    const at::Tensor b = qkv->bias.defined() ? qkv->bias.narrow(0, C, 2 * C) : at::Tensor();
    auto kvx = at::linear(x, w.narrow(0, C, 2 * C), b).view({B, N, 2, h, d}).permute({2, 0, 3, 1, 4});  // (2,B,h,N,d)
    keys = l2n(kvx[0]).reshape({B * h, N, d});
    values = kvx[1].reshape({B * h, N, d});
    bias_rows = cpb_bias(cpb_fc1, cpb_fc2, table, index, N, N).reshape({h * N, N});
  }
  const at::Tensor nbr = aggregated ? neighbours.to(dev) : at::Tensor();
  const at::Tensor gates_flat = routing.gates.reshape({T * h});
  at::Tensor out = at::zeros({T * h + 1, d}, x.options().dtype(values.scalar_type()));  // + scratch row (padding)

  // Two buckets at most: every gather's backward adds into a zero tensor the size of its source, once per bucket,
  // which costs more than padding the routed groups to their largest count (shared groups hold every token).
  for (const nn::PairBucket& bk :
       nn::bucket_pairs(routing.routed, B, N, h, router.shared, true, kBucketFill, kMaxBuckets)) {
    const int64_t Gb = bk.groups, M = bk.rows;
    const at::Tensor& hidx = bk.head;                                                  // (Gb)
    const at::Tensor gidx = bk.batch * h + bk.head;                                    // (Gb) rows of keys / values
    const at::Tensor tok = bk.token.reshape({-1}), pair = bk.gate_row.reshape({-1});   // (Gb·M)
    const at::Tensor bias_row = (bk.head.view({Gb, 1}) * N + bk.token).reshape({-1});  // (Gb·M) rows of bias_rows
    at::Tensor qn = l2n(q_rows.index_select(0, pair).view({Gb, M, d}));                // (Gb, M, d)
    at::Tensor ls = aggregated ? len_scale.index_select(0, tok).view({Gb, M, 1}) : len_scale;
    at::Tensor qs = (qn + query_embedding.index_select(0, hidx)) * tau.index_select(0, hidx) * ls;  // (Gb, M, d)
    at::Tensor global = at::baddbmm(bias_rows.index_select(0, bias_row).view({Gb, M, -1}), qs,
                                    keys.index_select(0, gidx).transpose(1, 2));  // (Gb, M, Nk)
    at::Tensor o;                                                                 // (Gb, M, d)
    if (!aggregated) {
      o = at::bmm(at::softmax(global, -1), values.index_select(0, gidx));
    } else {
      // Window rows: (b·N + neighbour)·h + head, or the zero row T·h outside the map.
      at::Tensor nb = nbr.index_select(0, tok).view({Gb, M, kWindowArea});  // neighbour token, −1 outside
      at::Tensor outside = nb.lt(0);
      at::Tensor rows = (bk.batch.view({Gb, 1, 1}) * N + nb) * h + hidx.view({Gb, 1, 1});
      rows = rows.masked_fill(outside, T * h);
      at::Tensor kv_nb = local.index_select(0, rows.reshape({-1})).view({Gb, M, kWindowArea, 2 * d});
      at::Tensor k_nb = kv_nb.narrow(-1, 0, d), v_nb = kv_nb.narrow(-1, d, d);            // (Gb, M, 9, d)
      at::Tensor loc = at::matmul(qs.unsqueeze(-2), k_nb.transpose(-2, -1)).squeeze(-2);  // (Gb, M, 9)
      loc = (loc + relative_pos_bias_local.index_select(0, hidx).unsqueeze(1))
                .masked_fill(outside, -std::numeric_limits<double>::infinity());
      at::Tensor attn = at::softmax(at::cat({loc, global}, -1), -1);
      at::Tensor a_loc = at::matmul(qn, learnable_tokens.index_select(0, hidx)) + learnable_bias.index_select(0, hidx) +
                         attn.narrow(-1, 0, kWindowArea);  // (Gb, M, 9)
      o = at::matmul(a_loc.unsqueeze(-2), v_nb).squeeze(-2) +
          at::bmm(attn.narrow(-1, kWindowArea, attn.size(-1) - kWindowArea), values.index_select(0, gidx));
    }
    o = o * gates_flat.index_select(0, pair).view({Gb, M, 1});
    out.index_copy_(0, bk.out_row.reshape({-1}), o.reshape({Gb * M, d}).to(out.scalar_type()));
  }
  return out.narrow(0, 0, T * h).view({B, N, C});
}

// ---- MLP, block, embed ---------------------------------------------------------------------------------------------

DWConvImpl::DWConvImpl(int64_t dim) {
  dwconv = register_module("dwconv", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 3).padding(1).groups(dim)));
}
at::Tensor DWConvImpl::forward(const at::Tensor& x, int64_t H, int64_t W) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  (void)N;
  return dwconv->forward(x.transpose(1, 2).reshape({B, C, H, W})).flatten(2).transpose(1, 2);
}

ConvolutionalGLUImpl::ConvolutionalGLUImpl(int64_t dim, int64_t hidden) {
  const int64_t hf = static_cast<int64_t>(2 * hidden / 3);
  fc1 = register_module("fc1", nn::Linear(dim, 2 * hf));
  dwconv = register_module("dwconv", DWConv(hf));
  fc2 = register_module("fc2", nn::Linear(hf, dim));
}
at::Tensor ConvolutionalGLUImpl::forward(const at::Tensor& x, int64_t H, int64_t W) {
  auto gv = fc1->forward(x).chunk(2, -1);  // first half gates
  return fc2->forward(at::gelu(dwconv->forward(gv[0], H, W)) * gv[1]);
}

TransNeXtBlockImpl::TransNeXtBlockImpl(const nn::MoHAttentionOptions& heads, int64_t height, int64_t width,
                                       int64_t sr_ratio, int64_t mlp_ratio, double dp)
    : drop_path(dp), H(height), W(width) {
  const int64_t C = heads.dim;
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C}).eps(kBlockNormEps)));
  attn = register_module("attn", TransNeXtAttention(heads, height, width, sr_ratio));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C}).eps(kBlockNormEps)));
  mlp = register_module("mlp", ConvolutionalGLU(C, C * mlp_ratio));
}

nn::AttentionOutput TransNeXtBlockImpl::forward(const at::Tensor& x, const at::Tensor& table, const at::Tensor& index) {
  nn::AttentionOutput a = attn->forward(ln(norm1, x), table, index);
  at::Tensor y = x + ::moh::vision::drop_path(a.out, drop_path, is_training());
  a.out = y + ::moh::vision::drop_path(mlp->forward(ln(norm2, y), H, W), drop_path, is_training());
  return a;
}

OverlapPatchEmbedImpl::OverlapPatchEmbedImpl(int64_t in_chans, int64_t dim, int64_t kernel, int64_t stride) {
  proj = register_module(
      "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_chans, dim, kernel).stride(stride).padding(kernel / 2)));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(kEmbedNormEps)));
}
at::Tensor OverlapPatchEmbedImpl::forward(const at::Tensor& x) {
  return ln(norm, proj->forward(x).flatten(2).transpose(1, 2));  // (B, N, D)
}

// ---- model ---------------------------------------------------------------------------------------------------------

TransNeXtImpl::TransNeXtImpl(const TransNeXtOptions& o) : options(o) {
  options.validate();
  std::vector<double> dpr(o.total_layers());
  for (size_t j = 0; j < dpr.size(); ++j)  // linspace(0, rate, total), indexed over all blocks
    dpr[j] = dpr.size() > 1 ? o.drop_path_rate * static_cast<double>(j) / static_cast<double>(dpr.size() - 1) : 0.0;
  int64_t cur = 0;
  for (int64_t i = 0; i < 4; ++i) {
    const std::string s = std::to_string(i + 1);
    const int64_t in = i == 0 ? o.in_chans : o.embed_dims[i - 1];
    const int64_t kernel = i == 0 ? 2 * o.patch_size - 1 : 3, stride = i == 0 ? o.patch_size : 2;
    patch_embed[i] = register_module("patch_embed" + s, OverlapPatchEmbed(in, o.embed_dims[i], kernel, stride));
    const int64_t side = o.stage_size(i);
    block[i] = register_module("block" + s, torch::nn::ModuleList());
    for (int64_t j = 0; j < o.depths[i]; ++j)
      block[i]->push_back(
          TransNeXtBlock(o.stage_attention(i), side, side, o.sr_ratios[i], o.mlp_ratios[i], dpr[cur++]));
    norm[i] = register_module("norm" + s,
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed_dims[i]}).eps(kBlockNormEps)));
    const int64_t pool = o.sr_ratios[i] > 1 ? side / o.sr_ratios[i] : side;
    const int64_t pre = o.pretrain_stage_size(i);
    std::tie(cpb_table[i], cpb_index[i]) = relative_position_cpb(side, side, pool, pool, pre, pre);
  }
  head = register_module("head", nn::Linear(o.embed_dims[3], o.num_classes));
  initialize_weights();
}

void TransNeXtImpl::initialize_weights() {
  torch::NoGradGuard ng;
  const int64_t by_name = options.init_seed;  // >= 0: each module from its own seeded stream (train.paired)
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    const auto& m = item.value();
    seed_for_module(by_name, item.key());
    if (auto* lin = m->as<nn::Linear>()) {
      trunc_normal_(lin->weight, kTruncStd);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* conv = m->as<torch::nn::Conv2d>()) {
      const auto& co = conv->options;
      const double fan_out =
          static_cast<double>(co.kernel_size()->at(0) * co.kernel_size()->at(1) * co.out_channels()) /
          static_cast<double>(co.groups());
      conv->weight.normal_(0.0, std::sqrt(2.0 / fan_out));
      if (conv->bias.defined()) conv->bias.zero_();
    } else if (auto* ln = m->as<torch::nn::LayerNorm>()) {
      ln->weight.fill_(1.0);
      ln->bias.zero_();
    }
  }
  if (by_name < 0) return;  // the attention's own parameters were drawn in construction order, as TransNeXt does
  for (const auto& p : named_parameters()) {  // drawn again by name: the stream of construction order is not shared
    const std::string& name = p.key();
    const auto ends = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const double std = ends("query_embedding")           ? kTruncStd
                       : ends("learnable_tokens")        ? kTruncStd
                       : ends("relative_pos_bias_local") ? kLocalBiasStd
                                                         : 0.0;
    if (std == 0.0) continue;
    seed_for_module(by_name, name);
    trunc_normal_(p.value(), std);
  }
}

namespace {
// A block under activation checkpointing: output and load-balance loss (the routed heads are not kept: training
// counts its head load inside the attention), activations recomputed in the backward pass.
nn::AttentionOutput checkpointed_block(TransNeXtBlockImpl& block, const at::Tensor& x, const at::Tensor& table,
                                       const at::Tensor& index) {
  const std::vector<at::Tensor> outs = checkpointed(
      [&block, index](const std::vector<at::Tensor>& in) {
        nn::AttentionOutput a = block.forward(in[0], in[1], index);
        return a.aux_loss.defined() ? std::vector<at::Tensor>{a.out, a.aux_loss} : std::vector<at::Tensor>{a.out};
      },
      {x, table});
  nn::AttentionOutput a;
  a.out = outs[0];
  if (outs.size() > 1) a.aux_loss = outs[1];
  return a;
}
}  // namespace

ClassifierOutput TransNeXtImpl::forward(const at::Tensor& input) {
  ClassifierOutput out;
  at::Tensor x = input, aux_sum;
  int64_t routed = 0;
  const int64_t B = input.size(0);
  const bool recompute = options.grad_checkpoint && is_training() && at::GradMode::is_enabled();
  for (int64_t i = 0; i < 4; ++i) {
    x = patch_embed[i]->forward(x);  // (B, N, C)
    const at::Tensor table = cpb_table[i].to(x.device(), x.scalar_type()), index = cpb_index[i].to(x.device());
    for (auto& m : *block[i]) {
      TransNeXtBlockImpl& b = *m->as<TransNeXtBlockImpl>();
      nn::AttentionOutput a = recompute ? checkpointed_block(b, x, table, index) : b.forward(x, table, index);
      x = a.out;
      out.routed.push_back(a.routed);
      if (a.aux_loss.defined()) {
        aux_sum = aux_sum.defined() ? aux_sum + a.aux_loss : a.aux_loss;
        ++routed;
      }
    }
    x = ln(norm[i], x);
    const int64_t side = options.stage_size(i);
    out.stages[i] = x.reshape({B, side, side, -1});  // (B, H, W, C)
    if (i < 3) {
      x = out.stages[i];
      if (i == 2) out.stage3 = x;
      x = x.permute({0, 3, 1, 2});  // (B, C, H, W) for the next patch embedding
    }
  }
  out.features = x.mean(1);  // (B, C4): global average over the final tokens
  out.logits = head->forward(out.features);
  if (routed > 0) out.aux_loss = aux_sum / static_cast<double>(routed);  // mean over routed layers
  return out;
}

// ---- variant table ------------------------------------------------------------------------------------------------

namespace {

TransNeXtOptions transnext(std::array<int64_t, 4> dims, std::array<int64_t, 4> heads, std::array<int64_t, 4> depths,
                           double drop_path) {
  TransNeXtOptions o;
  o.embed_dims = dims;
  o.num_heads = heads;
  o.depths = depths;
  o.drop_path_rate = drop_path;
  return o;
}

TransNeXtOptions with_moh(TransNeXtOptions o, std::array<int64_t, 4> shared, std::array<int64_t, 4> topk) {
  o.attention = {AttentionMode::moh, AttentionMode::moh, AttentionMode::moh, AttentionMode::moh};
  o.shared_heads = shared;
  o.topk = topk;
  return o;
}

// Mixture-of-Attention-heads baseline: stages with topk > 0 route every head (no shared heads), the others stay MHA.
TransNeXtOptions with_moa(TransNeXtOptions o, std::array<int64_t, 4> topk) {
  for (int i = 0; i < 4; ++i)
    if (topk[i] > 0) {
      o.attention[i] = AttentionMode::moa;
      o.shared_heads[i] = 0;
      o.topk[i] = topk[i];
    }
  return o;
}

// Small-input backbone for 28–64 px data (Fashion-MNIST padded to 32): stem stride 2, so the stage maps are
// 16/8/4/2 at 32 px and no stage is 1×1 (the NaN pitfall of the 224-px variants at small inputs).
TransNeXtOptions nano() {
  TransNeXtOptions o = transnext({32, 64, 128, 256}, {2, 4, 8, 8}, {1, 2, 3, 1}, 0.05);
  o.img_size = 32;
  o.patch_size = 2;
  o.in_chans = 1;
  o.num_classes = 10;
  o.mlp_ratios = {4, 4, 4, 4};
  o.sr_ratios = {4, 2, 2, 1};
  return o;
}

}  // namespace

const std::vector<std::pair<std::string, TransNeXtOptions>>& classifier_variants() {
  static const std::vector<std::pair<std::string, TransNeXtOptions>> table = [] {
    const auto micro = transnext({48, 96, 192, 384}, {2, 4, 8, 16}, {2, 2, 15, 2}, 0.15);
    const auto tiny = transnext({72, 144, 288, 576}, {3, 6, 12, 24}, {2, 2, 15, 2}, 0.25);
    const auto small = transnext({72, 144, 288, 576}, {3, 6, 12, 24}, {5, 5, 22, 5}, 0.45);
    const auto base = transnext({96, 192, 384, 768}, {4, 8, 16, 32}, {5, 5, 23, 5}, 0.6);
    return std::vector<std::pair<std::string, TransNeXtOptions>>{
        {"TransNeXt-Micro", micro},
        {"TransNeXt-Tiny", tiny},
        {"TransNeXt-Small", small},
        {"TransNeXt-Base", base},
        // MoH-ViT (MoH-ViT/transnext.py): per-stage shared heads h_s and top-K.
        {"MoH-ViT-S-80", with_moh(small, {3, 6, 3, 8}, {0, 0, 6, 12})},
        {"MoH-ViT-S-75", with_moh(small, {3, 6, 3, 4}, {0, 0, 6, 12})},
        {"MoH-ViT-B-75", with_moh(base, {4, 8, 4, 5}, {0, 0, 8, 16})},
        {"MoH-ViT-B-50", with_moh(base, {2, 2, 2, 4}, {2, 4, 6, 8})},
        {"ViT-Nano", nano()},
        {"MoH-ViT-Nano", with_moh(nano(), {2, 4, 2, 4}, {0, 0, 4, 2})},
        // The small-scale ablation (studies/small/run.sh): heads {2, 4, 8, 8} × depths {1, 2, 3, 1} = 42
        // head-layers; active = shared + top-K per stage.
        {"MoH-ViT-Nano-90", with_moh(nano(), {2, 4, 3, 4}, {0, 0, 4, 3})},  // 2 + 8 + 21 + 7 = 38 / 42 = 90.5 %
        {"MoH-ViT-Nano-75", with_moh(nano(), {2, 2, 2, 4}, {0, 1, 4, 2})},  // 2 + 6 + 18 + 6 = 32 / 42 = 76.2 %
        {"MoH-ViT-Nano-50", with_moh(nano(), {2, 1, 2, 2}, {0, 1, 2, 2})},  // 2 + 4 + 12 + 4 = 22 / 42 = 52.4 %
        {"MoA-ViT-Nano", with_moa(nano(), {0, 0, 6, 6})},                   // MoA: top-6 of 8 routed, no shared heads
    };
  }();
  return table;
}

TransNeXtOptions classifier_options(const std::string& name) {
  return find_variant(classifier_variants(), name, "classifier variant");
}

}  // namespace moh::vision
