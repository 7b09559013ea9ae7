#include "vision/nn/head_mix.h"

#include <ATen/ExpandUtils.h>
#include <torch/version.h>

#include <array>
#include <vector>

#include "vision/nn/attention_core.h"
#include "vision/nn/attention_cpu.h"
#include "vision/nn/fused_ops.h"

namespace moh::nn {

namespace {

// LibTorch's fused CPU attention with the log-sum-exp its backward needs, as one public ATen op pair.
constexpr bool kFusedCpuCore = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3);

at::ScalarType compute_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

bool one_float_type(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::ScalarType t = q.scalar_type();
  return (t == at::kFloat || t == at::kBFloat16) && k.scalar_type() == t && v.scalar_type() == t;
}

AttentionCore resolve_core(AttentionCore wanted, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& bias) {
  const bool cpu_float = q.is_cpu() && !bias.defined() && one_float_type(q, k, v);
  const bool fused_ok = kFusedCpuCore && cpu_float;
  const bool kernel_ok = cpu_float && attention_cpu_applies(q, k, v);
  switch (wanted) {
    case AttentionCore::fused_cpu:
      return fused_ok ? wanted : AttentionCore::plain;
    case AttentionCore::kernel_cpu:
      return kernel_ok ? wanted : AttentionCore::plain;
    case AttentionCore::plain:
      return wanted;
    case AttentionCore::automatic:  // attend()'s choice with fused = true
      if (kernel_ok && attention_cpu_pays(q, k, v)) return AttentionCore::kernel_cpu;
      if (fused_ok) return AttentionCore::fused_cpu;
      return AttentionCore::plain;
  }
  return AttentionCore::plain;
}

// ---- the attention core: q (G..., n, d), k/v (G..., nk, d) → o (G..., n, d), lse (G..., n), both contiguous --------

struct Core {
  at::Tensor o, lse;
};

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// The fused CPU op takes (B, heads, n, d): groups of a 3-D operand become batches of one head.
at::Tensor as4(const at::Tensor& t) {
  return t.dim() == 3 ? t.unsqueeze(1) : t;
}
#endif

Core plain_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                   double scale) {
  const at::ScalarType ct = compute_type(q);
  const at::Tensor qs = q.to(ct) * scale, kf = k.to(ct), vf = v.to(ct);
  at::Tensor s = at::matmul(qs, kf.transpose(-2, -1));  // (G..., n, nk)
  if (bias.defined()) s = s + bias.to(ct);
  at::Tensor lse = at::logsumexp(s, -1);
  const at::Tensor p = at::exp(s - lse.unsqueeze(-1));
  return {at::matmul(p, vf).to(q.scalar_type()).contiguous(), lse.contiguous()};
}

Core core_forward(AttentionCore kind, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& bias, double scale) {
  if (kind == AttentionCore::kernel_cpu) {
    const AttentionCpuResult r = attention_cpu_forward(q, k, v, scale);
    return {r.out.contiguous(), r.lse.contiguous()};
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  if (kind == AttentionCore::fused_cpu) {
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(as4(q), as4(k), as4(v), 0.0, false, {}, scale);
    if (q.dim() == 3) o = o.squeeze(1), lse = lse.squeeze(1);
    return {o.contiguous(), lse.to(at::kFloat).contiguous()};
  }
#endif
  return plain_forward(q, k, v, bias, scale);
}

// {dq, dk, dv, dscores}: dscores (G..., n, nk) in the compute type when a bias needs it, else undefined.
std::array<at::Tensor, 4> plain_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& bias, const at::Tensor& lse,
                                         double scale) {
  const at::ScalarType ct = compute_type(q);
  const at::Tensor qs = q.to(ct) * scale, kf = k.to(ct), vf = v.to(ct), dof = dout.to(ct);
  at::Tensor s = at::matmul(qs, kf.transpose(-2, -1));
  if (bias.defined()) s = s + bias.to(ct);
  const at::Tensor p = at::exp(s - lse.to(ct).unsqueeze(-1));  // (G..., n, nk), the forward's probabilities
  const at::Tensor dp = at::matmul(dof, vf.transpose(-2, -1));
  const at::Tensor ds = p * (dp - (p * dp).sum(-1, true));  // softmax backward
  return {(at::matmul(ds, kf) * scale).to(q.scalar_type()), at::matmul(ds.transpose(-2, -1), qs).to(k.scalar_type()),
          at::matmul(p.transpose(-2, -1), dof).to(v.scalar_type()), bias.defined() ? ds : at::Tensor()};
}

std::array<at::Tensor, 4> core_backward(AttentionCore kind, const at::Tensor& dout, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                                        const at::Tensor& o, const at::Tensor& lse, double scale) {
  if (kind == AttentionCore::kernel_cpu) {
    const auto g = attention_cpu_backward(dout, q, k, v, lse, scale);
    return {g[0], g[1], g[2], at::Tensor()};
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  if (kind == AttentionCore::fused_cpu) {
    // The op reads the log-sum-exp in the layout its forward wrote: (B, n, heads) memory seen as (B, heads, n).
    const at::Tensor l3 = q.dim() == 3 ? lse.unsqueeze(1) : lse;
    const at::Tensor l4 = l3.transpose(1, 2).contiguous().transpose(1, 2);
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        as4(dout.contiguous()), as4(q), as4(k), as4(v), as4(o), l4, 0.0, false, {}, scale);
    if (q.dim() == 3) dq = dq.squeeze(1), dk = dk.squeeze(1), dv = dv.squeeze(1);
    return {dq, dk, dv, at::Tensor()};
  }
#endif
  return plain_backward(dout, q, k, v, bias, lse, scale);
}

// ---- gating: out (B, N, h·d) = o (B, h, N, d) · gates (B·N, h), with the fused loops where they serve ------------

bool fused_gating(const at::Tensor& o) {
  return fused_dtype(o.scalar_type()) && fused_kernels_available(o.device());
}

at::Tensor gate(const at::Tensor& o, const at::Tensor& gates) {
  const int64_t B = o.size(0), h = o.size(1), N = o.size(2), d = o.size(3);
  if (!gates.defined())  // a new tensor, never a view of o (one head: the transposition alone would be o's memory)
    return at::empty({B, N, h, d}, o.options()).copy_(o.transpose(1, 2)).view({B, N, h * d});
  if (fused_gating(o)) return fused::gate_heads_forward(o, gates.to(at::kFloat), o.scalar_type());
  return plain_gate_heads(o, gates.to(o.scalar_type())).contiguous();
}

// {do (B, h, N, d), dgates (B·N, h) in the gates' type or undefined}
std::array<at::Tensor, 2> gate_backward(const at::Tensor& dout, const at::Tensor& o, const at::Tensor& gates) {
  const int64_t B = o.size(0), h = o.size(1), N = o.size(2), d = o.size(3);
  const at::Tensor d4 = dout.reshape({B, N, h, d});
  if (!gates.defined()) return {d4.transpose(1, 2), at::Tensor()};
  if (fused_gating(o)) {
    auto g = fused::gate_heads_backward(dout.to(o.scalar_type()), o, gates.to(at::kFloat));
    return {g[0], g[1].to(gates.scalar_type())};
  }
  const at::Tensor g = gates.to(o.scalar_type()).reshape({B, N, h, 1});
  return {(d4 * g).transpose(1, 2), (d4 * o.transpose(1, 2)).sum(-1).reshape({B * N, h}).to(gates.scalar_type())};
}

at::Tensor expand_heads(const at::Tensor& t, int64_t h) {
  return t.size(1) == h ? t : t.expand({t.size(0), h, t.size(2), t.size(3)});
}

// A bias of heads [0, hs) as (B|1, hs, N, N) (a 3-D bias gains its batch dim of 1).
at::Tensor shared_bias(const at::Tensor& bias, int64_t hs) {
  if (!bias.defined()) return bias;
  return (bias.dim() == 3 ? bias.unsqueeze(0) : bias).narrow(1, 0, hs);
}

// ---- the sparse path's pairs -----------------------------------------------------------------------------------

// One bucket of routed pairs as rows of the (B·h·N)-row tensors (q, o, lse) and of the other operands.
struct BucketRows {
  int64_t groups = 0, rows = 0;  // Gb, M
  at::Tensor pair;               // (Gb·M) row (b·h + head)·N + n of each slot (padding repeats its group's last)
  at::Tensor slot;               // (Gb·M) pair, or B·h·N (the scratch row) for padding slots
  at::Tensor kv;                 // (Gb) row b·h_kv + head_kv of k and v seen as (B·h_kv, N, d)
  at::Tensor bias;               // (Gb·M) row of the bias seen as (rows, N), or undefined
  at::Tensor live;               // (Gb, M, 1) 1 for a pair, 0 for padding, in the compute type
};

std::vector<BucketRows> routed_buckets(const HeadMixInputs& in, at::ScalarType ct) {
  const int64_t B = in.q.size(0), h = in.q.size(1), N = in.q.size(2), hkv = in.k.size(1);
  const bool bias_per_batch = in.bias.defined() && in.bias.dim() == 4 && in.bias.size(0) == B && B > 1;
  std::vector<BucketRows> out;
  for (const PairBucket& bk : bucket_pairs(in.routed, B, N, h, in.shared, false)) {
    BucketRows r;
    r.groups = bk.groups, r.rows = bk.rows;
    const at::Tensor gh = (bk.batch * h + bk.head).view({bk.groups, 1});          // (Gb, 1)
    const at::Tensor pair = gh * N + bk.token, live = bk.out_row == bk.gate_row;  // (Gb, M)
    r.pair = pair.reshape({-1});
    r.slot = at::where(live, pair, at::full_like(pair, B * h * N)).reshape({-1});
    r.kv = hkv == h ? bk.batch * h + bk.head : bk.batch;
    if (in.bias.defined())
      r.bias = bias_per_batch ? r.pair : (bk.head.view({bk.groups, 1}) * N + bk.token).reshape({-1});
    r.live = live.to(ct).view({bk.groups, bk.rows, 1});
    out.push_back(std::move(r));
  }
  return out;
}

// The bias as rows of N scores: (h·N, N), or (B·h·N, N) when it differs per batch element.
at::Tensor bias_rows(const at::Tensor& bias, int64_t N) {
  return bias.reshape({-1, N});
}

// One bucket's operands: q rows (Gb, M, d), k and v (Gb, N, d), bias rows (Gb, M, N) or undefined.
struct BucketOperands {
  at::Tensor q, k, v, bias;
};

BucketOperands gather(const HeadMixInputs& in, const BucketRows& r) {
  const int64_t B = in.q.size(0), h = in.q.size(1), N = in.q.size(2), d = in.q.size(3), hkv = in.k.size(1);
  BucketOperands b;
  b.q = in.q.reshape({B * h * N, d}).index_select(0, r.pair).view({r.groups, r.rows, d});
  b.k = in.k.reshape({B * hkv, N, d}).index_select(0, r.kv);
  b.v = in.v.reshape({B * hkv, N, d}).index_select(0, r.kv);
  if (in.bias.defined()) b.bias = bias_rows(in.bias, N).index_select(0, r.bias).view({r.groups, r.rows, N});
  return b;
}

HeadMixForward sparse_forward(const HeadMixInputs& in) {
  const int64_t B = in.q.size(0), h = in.q.size(1), N = in.q.size(2), d = in.q.size(3), hs = in.shared;
  const at::ScalarType ct = compute_type(in.q);
  // One scratch row past the end absorbs the padding slots (their values are discarded).
  at::Tensor o = at::zeros({B * h * N + 1, d}, in.q.options());
  at::Tensor lse = at::zeros({B * h * N + 1}, in.q.options().dtype(ct));
  at::Tensor o4 = o.narrow(0, 0, B * h * N).view({B, h, N, d}), l3 = lse.narrow(0, 0, B * h * N).view({B, h, N});
  if (hs > 0) {
    const at::Tensor q = in.q.narrow(1, 0, hs), k = expand_heads(in.k, h).narrow(1, 0, hs),
                     v = expand_heads(in.v, h).narrow(1, 0, hs), bias = shared_bias(in.bias, hs);
    const Core c = core_forward(resolve_core(in.core, q, k, v, bias), q, k, v, bias, in.scale);
    o4.narrow(1, 0, hs).copy_(c.o);
    l3.narrow(1, 0, hs).copy_(c.lse);
  }
  for (const BucketRows& r : routed_buckets(in, ct)) {
    const BucketOperands b = gather(in, r);
    const Core c = core_forward(resolve_core(in.core, b.q, b.k, b.v, b.bias), b.q, b.k, b.v, b.bias, in.scale);
    o.index_copy_(0, r.slot, c.o.reshape({-1, d}));
    lse.index_copy_(0, r.slot, c.lse.reshape({-1}).to(ct));
  }
  const at::Tensor o_out = o4.contiguous(), lse_out = l3.contiguous();
  return {gate(o_out, in.gates), o_out, lse_out};
}

HeadMixGrads sparse_backward(const at::Tensor& d_o, const HeadMixInputs& in, const HeadMixForward& fwd) {
  const int64_t B = in.q.size(0), h = in.q.size(1), N = in.q.size(2), d = in.q.size(3), hs = in.shared;
  const int64_t hkv = in.k.size(1);
  const at::ScalarType ct = compute_type(in.q);
  // Gradients summed in the compute type, rounded to the operands' types once.
  at::Tensor dq = at::zeros({B * h * N, d}, in.q.options().dtype(ct));
  at::Tensor dk = at::zeros({B * hkv, N, d}, dq.options()), dv = at::zeros_like(dk);
  at::Tensor dbias = in.bias.defined() ? at::zeros({bias_rows(in.bias, N).size(0), N}, dq.options()) : at::Tensor();
  if (hs > 0) {
    const at::Tensor q = in.q.narrow(1, 0, hs), k = expand_heads(in.k, h).narrow(1, 0, hs),
                     v = expand_heads(in.v, h).narrow(1, 0, hs), bias = shared_bias(in.bias, hs);
    const auto g = core_backward(resolve_core(in.core, q, k, v, bias), d_o.narrow(1, 0, hs), q, k, v, bias,
                                 fwd.o.narrow(1, 0, hs), fwd.lse.narrow(1, 0, hs), in.scale);
    dq.view({B, h, N, d}).narrow(1, 0, hs).copy_(g[0]);
    if (hkv == h) {
      dk.view({B, h, N, d}).narrow(1, 0, hs).copy_(g[1]);
      dv.view({B, h, N, d}).narrow(1, 0, hs).copy_(g[2]);
    } else {
      dk.add_(g[1].sum(1)), dv.add_(g[2].sum(1));
    }
    if (g[3].defined()) {  // (B, hs, N, N) → the bias's rows of heads [0, hs)
      const at::Tensor ds = in.bias.dim() == 4 && in.bias.size(0) == B && B > 1 ? g[3] : g[3].sum(0, true);
      dbias.view({ds.size(0), -1, N, N}).narrow(1, 0, hs).copy_(ds);
    }
  }
  for (const BucketRows& r : routed_buckets(in, ct)) {
    const BucketOperands b = gather(in, r);
    // Padding slots get a zero output gradient: their rows then add exact zeros below.
    const at::Tensor dob =
        (d_o.reshape({B * h * N, d}).index_select(0, r.pair).view({r.groups, r.rows, d}).to(ct) * r.live)
            .to(in.q.scalar_type());
    const at::Tensor ob = fwd.o.reshape({B * h * N, d}).index_select(0, r.pair).view({r.groups, r.rows, d});
    const at::Tensor lb = fwd.lse.reshape({B * h * N}).index_select(0, r.pair).view({r.groups, r.rows});
    const auto g =
        core_backward(resolve_core(in.core, b.q, b.k, b.v, b.bias), dob, b.q, b.k, b.v, b.bias, ob, lb, in.scale);
    dq.index_add_(0, r.pair, g[0].reshape({-1, d}).to(ct));
    dk.index_add_(0, r.kv, g[1].to(ct));
    dv.index_add_(0, r.kv, g[2].to(ct));
    if (g[3].defined()) dbias.index_add_(0, r.bias, g[3].reshape({-1, N}).to(ct));
  }
  HeadMixGrads out;
  out.q = dq.view({B, h, N, d}).to(in.q.scalar_type());
  out.k = dk.view({B, hkv, N, d}).to(in.k.scalar_type());
  out.v = dv.view({B, hkv, N, d}).to(in.v.scalar_type());
  if (dbias.defined()) out.bias = dbias.view(in.bias.sizes()).to(in.bias.scalar_type());
  return out;
}

}  // namespace

AttentionPath head_mix_path(AttentionPath requested, const HeadMixInputs& in) {
  if (!in.routed.defined() || !in.gates.defined() || requested == AttentionPath::dense) return AttentionPath::dense;
  const double active = static_cast<double>(in.shared + in.routed.size(1)) / static_cast<double>(in.q.size(1));
  return choose_attention_path(requested, active, in.q.size(2), in.q.device());
}

HeadMixForward head_mix_forward(const HeadMixInputs& in) {
  TORCH_CHECK(in.path != AttentionPath::automatic, "head_mix_forward: resolve the path first (head_mix_path)");
  if (in.path == AttentionPath::sparse && in.routed.defined() && in.gates.defined()) return sparse_forward(in);
  const int64_t h = in.q.size(1);
  const at::Tensor k = expand_heads(in.k, h), v = expand_heads(in.v, h);
  const Core c = core_forward(resolve_core(in.core, in.q, k, v, in.bias), in.q, k, v, in.bias, in.scale);
  return {gate(c.o, in.gates), c.o, c.lse};
}

HeadMixGrads head_mix_backward(const at::Tensor& dout, const HeadMixInputs& in, const HeadMixForward& fwd) {
  const auto [d_o, dgates] = gate_backward(dout, fwd.o, in.gates);
  if (in.path == AttentionPath::sparse && in.routed.defined() && in.gates.defined()) {
    HeadMixGrads g = sparse_backward(d_o, in, fwd);
    g.gates = dgates;
    return g;
  }
  const int64_t h = in.q.size(1);
  const at::Tensor k = expand_heads(in.k, h), v = expand_heads(in.v, h);
  const auto g =
      core_backward(resolve_core(in.core, in.q, k, v, in.bias), d_o, in.q, k, v, in.bias, fwd.o, fwd.lse, in.scale);
  HeadMixGrads out;
  out.q = g[0];
  out.k = in.k.size(1) == h ? g[1] : g[1].sum(1, true);
  out.v = in.v.size(1) == h ? g[2] : g[2].sum(1, true);
  out.gates = dgates;
  if (g[3].defined()) out.bias = at::sum_to(g[3], in.bias.sizes()).to(in.bias.scalar_type());
  return out;
}

}  // namespace moh::nn
