#include "vision/nn/attention_core.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/version.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "vision/nn/attention_cpu.h"
#include "vision/nn/fused_ops.h"

namespace moh::nn {

namespace {

// Sparse path: groups whose counts are within this factor of the bucket's largest share one padded batch.
constexpr double kBucketFill = 0.95;
// At most this many padded batches per call (bounds per-op overhead when routing is very skewed).
constexpr int kMaxBuckets = 8;
// Plain path: score blocks larger than this many elements are computed in query chunks. Blocks stay below glibc's
// mmap threshold (32 MB), so they are recycled from the heap instead of being mapped and page-faulted on every call
// (measured: at seq 4096 most of the time went to page faults), and stay cache-friendlier. Same values either way.
// 28 MB of fp32: a CFG sampling batch of DiT-S (16 × 6 heads × 256²) stays one block (chunking it cost ≈ 9 % of the
// 1.13 sampling chain in copies and the final cat).
constexpr int64_t kScoreChunkElems = int64_t{7} << 20;

at::Tensor attend_plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                        const at::Tensor& bias) {
  at::Tensor s = at::matmul(q * scale, k.transpose(-2, -1));  // (..., Nq, Nk)
  if (bias.defined()) s = s + bias;
  return at::matmul(at::softmax(s, -1), v);  // (..., Nq, d)
}

}  // namespace

AttentionPath auto_attention_path(double active, int64_t tokens, PathTarget target) {
  switch (target) {
    case PathTarget::cpu_libtorch2:
    case PathTarget::cpu_libtorch1: {  // 1.13 measured with its thread pools right (docs/BENCHMARKS.md): same rule
      const bool sparse = (tokens >= 1024 && active <= 0.85) || (tokens >= 256 && active <= 0.6);
      return sparse ? AttentionPath::sparse : AttentionPath::dense;
    }
    case PathTarget::cuda:  // the CPU rule was measured on a 2-core CPU only
      return AttentionPath::dense;
  }
  return AttentionPath::dense;
}

AttentionPath choose_attention_path(AttentionPath requested, double active, int64_t tokens, const c10::Device& device) {
  if (requested != AttentionPath::automatic) return requested;
  const PathTarget target = !device.is_cpu()           ? PathTarget::cuda
                            : TORCH_VERSION_MAJOR >= 2 ? PathTarget::cpu_libtorch2
                                                       : PathTarget::cpu_libtorch1;
  return auto_attention_path(active, tokens, target);
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, const at::Tensor& bias,
                  bool fused, const at::Tensor& live) {
  if (fused && !bias.defined() && attention_cpu_pays(q, k, v)) return attention_cpu(q, k, v, scale, live);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (fused) {  // kFusedAttentionAvailable
    c10::optional<at::Tensor> mask;
    if (bias.defined()) mask = bias.to(q.scalar_type());
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale);
  }
#endif
  const int64_t nq = q.size(-2), nk = k.size(-2);
  const int64_t lead = q.numel() / std::max<int64_t>(1, q.size(-1) * nq);  // batch·heads
  const int64_t rows = std::max<int64_t>(1, kScoreChunkElems / std::max<int64_t>(1, lead * nk));
  if (rows >= nq) return attend_plain(q, k, v, scale, bias);
  std::vector<at::Tensor> parts;  // query chunks: (..., rows, d) each
  for (int64_t start = 0; start < nq; start += rows) {
    const int64_t len = std::min(rows, nq - start);
    at::Tensor b = bias.defined() && bias.dim() >= 2 && bias.size(-2) == nq ? bias.narrow(-2, start, len) : bias;
    parts.push_back(attend_plain(q.narrow(-2, start, len), k, v, scale, b));
  }
  return at::cat(parts, -2);
}

at::Tensor mix_heads_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gates,
                           double scale, bool fused, bool fused_gates) {
  RECORD_USER_SCOPE("moh::attention");
  const int64_t B = q.size(0), h = q.size(1), N = q.size(2), d = q.size(3);
  at::Tensor kk = k.size(1) == h ? k : k.expand({B, h, k.size(2), d});
  at::Tensor vv = v.size(1) == h ? v : v.expand({B, h, v.size(2), d});
  // Where the CPU loop runs, the (token, head) pairs whose gate is 0 are not computed (their output is multiplied by
  // 0).
  const at::Tensor live = gates.defined() && fused && attention_cpu_pays(q, kk, vv)
                              ? (gates.view({B, N, h}) != 0).permute({0, 2, 1})  // (B, h, N)
                              : at::Tensor();
  const at::Tensor o = attend(q, kk, vv, scale, {}, fused, live);  // (B, h, N, d)
  if (gates.defined() && fused_gates) return fused_gate_heads(o, gates, consumer_dtype(o));
  if (gates.defined()) return plain_gate_heads(o, gates);  // official: einsum("bne,bned->bned")
  return o.transpose(1, 2).reshape({B, N, h * d});
}

namespace {

// Every selected pair as (group g = b·h + head, token n), in ascending token order within each group: the routed
// pairs of `routed` (B·N, K) and, with all_shared, every token of heads [0, shared). (T·K [+ T·shared]) each.
std::pair<at::Tensor, at::Tensor> selected_pairs(const at::Tensor& routed, int64_t N, int64_t h, int64_t hs,
                                                 bool all_shared) {
  const auto opts = routed.options().dtype(at::kLong);
  const int64_t T = routed.size(0), K = routed.size(1);
  at::Tensor t = at::arange(T, opts).repeat_interleave(K);  // (T·K) token row of each routed pair
  at::Tensor g = (t.div(N, "floor") * h + hs) + routed.reshape({-1}).to(at::kLong);
  if (all_shared && hs > 0) {
    at::Tensor ts = at::arange(T, opts).repeat_interleave(hs);  // (T·hs)
    at::Tensor gs = ts.div(N, "floor") * h + at::arange(hs, opts).repeat({T});
    t = at::cat({ts, t});
    g = at::cat({gs, g});
  }
  return {g, t.remainder(N)};
}

// Host plan of the buckets from the pair counts: groups by descending count (stable), cut where a count falls below
// `fill` of the bucket's first (the last bucket takes the rest).
std::vector<std::vector<int64_t>> plan_buckets(const std::vector<int64_t>& count, double fill, int max_buckets) {
  std::vector<int64_t> order(count.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return count[a] > count[b]; });
  std::vector<std::vector<int64_t>> plan;
  for (size_t pos = 0; pos < order.size() && count[order[pos]] > 0;) {
    const int64_t M = count[order[pos]];
    const bool last = plan.size() + 1 >= static_cast<size_t>(std::max(1, max_buckets));
    std::vector<int64_t> groups;
    for (; pos < order.size() && count[order[pos]] > 0 && (last || count[order[pos]] >= fill * M); ++pos)
      groups.push_back(order[pos]);
    plan.push_back(std::move(groups));
  }
  return plan;
}

}  // namespace

std::vector<PairBucket> bucket_pairs(const at::Tensor& routed, int64_t B, int64_t N, int64_t h, int64_t hs,
                                     bool all_shared, double fill, int max_buckets) {
  const int64_t G = B * h, scratch_row = B * N * h;
  TORCH_CHECK(routed.dim() == 2 && routed.size(0) == B * N, "bucket_pairs: routed must be (B·N, K)");
  const auto [g, n] = selected_pairs(routed, N, h, hs, all_shared);
  const at::Tensor tokens = n.index_select(0, std::get<1>(at::sort(g, /*stable=*/true, 0, false)));  // by group, n asc.
  const at::Tensor counts_dev = at::bincount(g, {}, G);
  TORCH_CHECK(counts_dev.size(0) == G, "bucket_pairs: routed index out of range");
  const at::Tensor counts_host = counts_dev.to(at::kCPU).contiguous();  // the one host read: (B·h) counts
  const std::vector<int64_t> count(counts_host.data_ptr<int64_t>(), counts_host.data_ptr<int64_t>() + G);
  std::vector<int64_t> start(G, 0);
  for (int64_t k = 1; k < G; ++k) start[k] = start[k - 1] + count[k - 1];
  std::vector<PairBucket> buckets;
  for (const std::vector<int64_t>& groups : plan_buckets(count, fill, max_buckets)) {
    const auto Gb = static_cast<int64_t>(groups.size());
    std::vector<int64_t> host(3 * Gb);  // group ids, counts, starts: uploaded once
    for (int64_t i = 0; i < Gb; ++i) {
      host[i] = groups[i];
      host[Gb + i] = count[groups[i]];
      host[2 * Gb + i] = start[groups[i]];
    }
    const at::Tensor meta = at::tensor(host, at::kLong).to(routed.device()).view({3, Gb, 1});
    const at::Tensor gid = meta[0], c = meta[1], st = meta[2];  // (Gb, 1) each
    PairBucket bk;
    bk.groups = Gb;
    bk.rows = count[groups[0]];
    const at::Tensor m = at::arange(bk.rows, g.options()).view({1, bk.rows});  // (1, M)
    bk.token = tokens.index_select(0, (st + at::minimum(m, c - 1)).reshape({-1})).view({Gb, bk.rows});
    bk.batch = gid.div(h, "floor").view({Gb});
    bk.head = gid.remainder(h).view({Gb});
    bk.gate_row = (bk.batch.view({Gb, 1}) * N + bk.token) * h + bk.head.view({Gb, 1});  // (Gb, M)
    bk.out_row = at::where(m < c, bk.gate_row, at::full_like(bk.gate_row, scratch_row));
    buckets.push_back(std::move(bk));
  }
  return buckets;
}

at::Tensor mix_heads_sparse(const QuerySource& queries, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& gates, const at::Tensor& routed, int64_t h, int64_t hs, double scale,
                            bool fused) {
  RECORD_USER_SCOPE("moh::attention");
  const int64_t B = k.size(0), hkv = k.size(1), N = k.size(2), d = k.size(3);
  const int64_t T = B * N;
  TORCH_CHECK(hkv == h || hkv == 1, "mix_heads_sparse: k/v must have h or 1 heads");
  TORCH_CHECK(gates.defined() && gates.size(0) == T && gates.size(1) == h, "mix_heads_sparse: gates must be (B·N, h)");
  const auto opts = k.options();
  const at::Tensor gates_flat = gates.reshape({T * h});
  at::Tensor k_rows = k.reshape({B * hkv, N, d}), v_rows = v.reshape({B * hkv, N, d});

  // Output rows (T·h, d) plus one scratch row that absorbs the padding slots of the routed buckets (its values and
  // gradients are discarded, so padded duplicates never contribute). Unselected routed heads stay exactly zero.
  at::Tensor out = at::zeros({T * h + 1, d}, opts);

  // ---- shared heads: every token ------------------------------------------------------------------------------
  if (hs > 0) {
    at::Tensor q_s;
    if (queries.q.defined()) {
      q_s = queries.q.narrow(1, 0, hs);  // (B, hs, N, d)
    } else {
      at::Tensor w = queries.wq.narrow(0, 0, hs * d);
      at::Tensor b = queries.bq.defined() ? queries.bq.narrow(0, 0, hs * d) : at::Tensor();
      q_s = at::linear(queries.x, w, b).view({B, N, hs, d}).transpose(1, 2);
    }
    at::Tensor k_s = hkv == h ? k.narrow(1, 0, hs) : k.expand({B, hs, N, d});
    at::Tensor v_s = hkv == h ? v.narrow(1, 0, hs) : v.expand({B, hs, N, d});
    at::Tensor o = attend(q_s, k_s, v_s, scale, {}, fused).transpose(1, 2);  // (B, N, hs, d)
    out.narrow(0, 0, T * h)
        .view({B, N, h, d})
        .narrow(2, 0, hs)
        .copy_(o * gates.narrow(1, 0, hs).reshape({B, N, hs, 1}));
  }

  // ---- routed heads: only the selected (token, head) pairs -----------------------------------------------------
  if (routed.defined() && routed.numel() > 0) {
    for (const PairBucket& bk : bucket_pairs(routed, B, N, h, hs, false, kBucketFill, kMaxBuckets)) {
      const int64_t Gb = bk.groups, M = bk.rows;
      const at::Tensor kv_index = hkv == h ? bk.batch * hkv + bk.head : bk.batch * hkv;  // (Gb)
      const at::Tensor qi =
          (queries.q.defined() ? (bk.batch * h + bk.head).view({Gb, 1}) : bk.batch.view({Gb, 1})) * N +
          bk.token;  // (Gb, M) rows of q (B·h·N, d) or of x (B·N, C)
      at::Tensor q;  // (Gb, M, d)
      if (queries.q.defined()) {
        q = queries.q.reshape({B * h * N, d}).index_select(0, qi.reshape({-1})).view({Gb, M, d});
      } else {
        const int64_t C = queries.x.size(1);
        at::Tensor x_rows = queries.x.index_select(0, qi.reshape({-1})).view({Gb, M, C});    // (Gb, M, C)
        at::Tensor w = queries.wq.view({h, d, C}).index_select(0, bk.head).transpose(1, 2);  // (Gb, C, d)
        if (queries.bq.defined())
          q = at::baddbmm(queries.bq.view({h, 1, d}).index_select(0, bk.head), x_rows, w);  // (Gb, M, d)
        else
          q = at::bmm(x_rows, w);
      }
      at::Tensor o = attend(q, k_rows.index_select(0, kv_index), v_rows.index_select(0, kv_index), scale, {}, fused);
      o = o * gates_flat.index_select(0, bk.gate_row.reshape({-1})).view({Gb, M, 1});  // (Gb, M, d)
      // scatter (padding -> scratch); under CUDA autocast the gated rows come out fp32 into a bf16/fp16 buffer
      out.index_copy_(0, bk.out_row.reshape({-1}), o.reshape({Gb * M, d}).to(out.scalar_type()));
    }
  }

  return out.narrow(0, 0, T * h).view({B, N, h * d});
}

}  // namespace moh::nn
