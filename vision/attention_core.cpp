#include "vision/attention_core.h"

#include <torch/version.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace moh::vision {

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

AttentionPath choose_attention_path(AttentionPath requested, double active, int64_t tokens) {
  if (requested != AttentionPath::automatic) return requested;
#if TORCH_VERSION_MAJOR >= 2
  const bool sparse = (tokens >= 1024 && active <= 0.85) || (tokens >= 256 && active <= 0.6);
  return sparse ? AttentionPath::sparse : AttentionPath::dense;
#else
  (void)active, (void)tokens;  // 1.13's gathers and small batched products: sparse is not reliably faster
  return AttentionPath::dense;
#endif
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, const at::Tensor& bias,
                  bool fused) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (fused) {  // kFusedAttentionAvailable
    c10::optional<at::Tensor> mask;
    if (bias.defined()) mask = bias.to(q.scalar_type());
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale);
  }
#else
  (void)fused;
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
                           double scale, bool fused) {
  const int64_t B = q.size(0), h = q.size(1), N = q.size(2), d = q.size(3);
  at::Tensor kk = k.size(1) == h ? k : k.expand({B, h, k.size(2), d});
  at::Tensor vv = v.size(1) == h ? v : v.expand({B, h, v.size(2), d});
  at::Tensor o = attend(q, kk, vv, scale, {}, fused).transpose(1, 2);  // (B, N, h, d)
  if (gates.defined()) o = o * gates.view({B, N, h, 1});               // official: einsum("bne,bned->bned")
  return o.reshape({B, N, h * d});
}

at::Tensor index_tensor(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
}

std::vector<PairBucket> bucket_pairs(const at::Tensor& routed, int64_t B, int64_t N, int64_t h, int64_t hs,
                                     bool all_shared, double fill, int max_buckets) {
  const int64_t T = B * N, E = h - hs, scratch_row = T * h;
  // Group g = b·h + head holds the tokens n that use that head, ascending n.
  const int64_t G = B * h;
  std::vector<int64_t> count(G, 0);
  at::Tensor sel;
  const int64_t* sel_p = nullptr;
  const int64_t K = routed.defined() ? routed.size(1) : 0;
  if (K > 0) {
    TORCH_CHECK(routed.size(0) == T, "bucket_pairs: routed must be (B·N, K)");
    sel = routed.to(at::kCPU, at::kLong).contiguous();
    sel_p = sel.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < K; ++s) {
        TORCH_CHECK(sel_p[t * K + s] >= 0 && sel_p[t * K + s] < E, "bucket_pairs: routed index out of range");
        ++count[(t / N) * h + hs + sel_p[t * K + s]];
      }
  }
  if (all_shared)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < hs; ++j) count[b * h + j] = N;
  std::vector<int64_t> start(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) start[g + 1] = start[g] + count[g];
  std::vector<int64_t> tokens(start[G]);
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t b = t / N, n = t % N;
      if (all_shared)
        for (int64_t j = 0; j < hs; ++j) tokens[fill[b * h + j]++] = n;
      for (int64_t s = 0; s < K; ++s) tokens[fill[b * h + hs + sel_p[t * K + s]]++] = n;
    }
  }
  std::vector<int64_t> order(G);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return count[a] > count[b]; });
  std::vector<PairBucket> buckets;
  size_t pos = 0;
  while (pos < order.size() && count[order[pos]] > 0) {
    const int64_t M = count[order[pos]];
    size_t end = pos;
    const bool last = buckets.size() + 1 >= static_cast<size_t>(std::max(1, max_buckets));
    while (end < order.size() && count[order[end]] > 0 && (last || count[order[end]] >= fill * M)) ++end;
    PairBucket bk;
    bk.groups = static_cast<int64_t>(end - pos), bk.rows = M;
    bk.token.resize(bk.groups * M), bk.gate_row.resize(bk.groups * M), bk.out_row.resize(bk.groups * M);
    for (int64_t i = 0; i < bk.groups; ++i) {
      const int64_t g = order[pos + i], b = g / h, head = g % h, c = count[g];
      bk.batch.push_back(b), bk.head.push_back(head);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t n = tokens[start[g] + std::min(m, c - 1)];  // padding repeats a valid row, never read back
        bk.token[i * M + m] = n;
        bk.gate_row[i * M + m] = (b * N + n) * h + head;
        bk.out_row[i * M + m] = m < c ? bk.gate_row[i * M + m] : scratch_row;
      }
    }
    buckets.push_back(std::move(bk));
    pos = end;
  }
  return buckets;
}

at::Tensor mix_heads_sparse(const QuerySource& queries, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& gates, const at::Tensor& routed, int64_t h, int64_t hs, double scale,
                            bool fused) {
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
    out.narrow(0, 0, T * h).view({B, N, h, d}).narrow(2, 0, hs).copy_(o * gates.narrow(1, 0, hs).reshape({B, N, hs, 1}));
  }

  // ---- routed heads: only the selected (token, head) pairs -----------------------------------------------------
  if (routed.defined() && routed.numel() > 0) {
    for (const PairBucket& bk : bucket_pairs(routed, B, N, h, hs, false, kBucketFill, kMaxBuckets)) {
      const int64_t Gb = bk.groups, M = bk.rows;
      std::vector<int64_t> q_index(Gb * M), kv_index(Gb);
      for (int64_t i = 0; i < Gb; ++i) {
        const int64_t b = bk.batch[i], head = bk.head[i];
        kv_index[i] = b * hkv + (hkv == h ? head : 0);
        for (int64_t m = 0; m < M; ++m) {
          const int64_t n = bk.token[i * M + m];
          q_index[i * M + m] = queries.q.defined() ? (b * h + head) * N + n : b * N + n;
        }
      }
      const at::Device dev = k.device();
      at::Tensor qi = index_tensor(q_index, dev);
      at::Tensor q;  // (Gb, M, d)
      if (queries.q.defined()) {
        q = queries.q.reshape({B * h * N, d}).index_select(0, qi).view({Gb, M, d});
      } else {
        const int64_t C = queries.x.size(1);
        at::Tensor hidx = index_tensor(bk.head, dev);
        at::Tensor x_rows = queries.x.index_select(0, qi).view({Gb, M, C});                   // (Gb, M, C)
        at::Tensor w = queries.wq.view({h, d, C}).index_select(0, hidx).transpose(1, 2);      // (Gb, C, d)
        if (queries.bq.defined())
          q = at::baddbmm(queries.bq.view({h, 1, d}).index_select(0, hidx), x_rows, w);       // (Gb, M, d)
        else
          q = at::bmm(x_rows, w);
      }
      at::Tensor ki = index_tensor(kv_index, dev);
      at::Tensor o = attend(q, k_rows.index_select(0, ki), v_rows.index_select(0, ki), scale, {}, fused);  // (Gb,M,d)
      o = o * gates_flat.index_select(0, index_tensor(bk.gate_row, dev)).view({Gb, M, 1});
      out.index_copy_(0, index_tensor(bk.out_row, dev), o.reshape({Gb * M, d}));  // scatter (padding -> scratch)
    }
  }

  return out.narrow(0, 0, T * h).view({B, N, h * d});
}

}  // namespace moh::vision
