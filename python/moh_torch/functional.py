"""The ops of torch.ops.moh with defaults and named results (each call is one op, or moh_attention's two)."""
from collections import namedtuple

import torch

ops = torch.ops.moh

Routing = namedtuple("Routing", "gates routed picks aux_loss")
Routing.__doc__ = """The router's output: gates (T, h) fp32 (0 for unselected routed heads), routed (T, K) int64 indices
into the routed pool (head = shared + index), picks (h - shared) int64 tokens per routed head (the head load), and
aux_loss, the load-balance loss E · Σ_i P_i f_i (0-dim fp32)."""
MoHAttentionOutput = namedtuple("MoHAttentionOutput", "out aux_loss picks routed")


def ln_modulate(x, shift, scale, eps=1e-6):
    """LayerNorm over the last dim (no affine) then DiT's modulate: x̂ (1 + scale) + shift. x (B, N, D); shift, scale
    (B, D), e.g. chunks of adaLN_modulation's output."""
    return ops.ln_modulate(x, shift, scale, eps)[0]


def gate_residual(x, gate, branch):
    """x + gate.unsqueeze(1) * branch: x, branch (B, N, D), gate (B, D)."""
    return ops.gate_residual(x, gate, branch)


def bias_gelu(z, bias):
    """GELU (tanh approximation) of z + bias: z (..., F) a product without its bias, bias (F)."""
    return ops.bias_gelu(z, bias)


def route(logits, heads, shared, topk, scale_by_k=True):
    """The MoH router after its one product: logits (T, L) with columns [routed h - shared | shared (if > 1) | α (2,
    if shared > 0)]. MoH: routed gates renormalised over the top-K and × K (scale_by_k); MoA: summing to 1."""
    return Routing(*ops.route(logits, heads, shared, topk, scale_by_k))


def gate_heads(o, gates):
    """Each head's output times its gate, in the output projection's layout: o (B, h, N, d), gates (B·N, h) fp32 →
    (B, N, h·d)."""
    return ops.gate_heads(o, gates)


def attention(q, k, v, gates=None, routed=None, bias=None, shared=0, scale=None, path="auto"):
    """softmax(q kᵀ · scale + bias) v of every head, times its gate, → (B, N, h·d). q (B, h, N, d); k, v (B, h or 1,
    N, d); gates (B·N, h) or None (MHA); routed (B·N, K) from route(), which lets the sparse path attend only for the
    selected (token, head) pairs; bias (h, N, N) or (B, h, N, N); path auto (the toolkit's rule), dense or sparse."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return ops.attention(q, k, v, gates, routed, bias, shared, scale, path)[0]


def moh_attention(q, k, v, logits=None, shared=0, topk=0, scale=None, path="auto", bias=None, scale_by_k=True):
    """MoH attention from the router logits: route() then attention(). logits None: plain MHA; topk 0: every head on,
    weighted by softmax(logits) · h (the official all-shared layers)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return MoHAttentionOutput(*ops.moh_attention(q, k, v, logits, shared, topk, scale, path, bias, scale_by_k))
