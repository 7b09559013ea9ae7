"""torch.ops.moh against PyTorch's own checks and the plain composition of each op: torch.library.opcheck (schema,
autograd registration, fake tensors, AOT dispatch with dynamic shapes) on every op in fp32 and bf16 on the CPU (CUDA
cases skipped without a GPU), gradcheck in fp64 where the op computes in fp64 (attention), forward and backward
parity with the official op sequences, and the argument errors.

    .venv/bin/python -m unittest discover -s python/tests -p 'test_ops.py'      (after pip install ./python)
"""
import itertools
import unittest

import torch
import torch.nn.functional as F

import moh_torch  # noqa: F401
from moh_torch import functional as mf

ops = torch.ops.moh
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# fp32: sums of up to ~64 products in another order than PyTorch's kernels, 64 ulps of the largest value.
FP32_TOL = 64 * 2.0 ** -24
# bf16: the same arithmetic in fp32 with its result rounded to bf16 once (and an input gradient rounded once): two
# bf16 steps of the largest value. The attention's key and value gradients go through LibTorch's fused bf16 kernel,
# which also stores the probabilities and the score gradients in bf16 before its products: two steps more.
BF16_TOL = 2.0 ** -7
BF16_ATTENTION_GRAD_TOL = 2.0 ** -5


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=gen(seed)) * scale).to(dtype=dtype, device=device)


def router_logits(T, heads, shared, seed, device="cpu"):
    width = (heads - shared) + (shared if shared > 1 else 0) + (2 if shared > 0 else 0)
    return randn(T, width, seed=seed, device=device, scale=2.0)


def plain_route(logits, heads, shared, topk, scale_by_k=True):
    """The official MoH router (MoH-DiT models.py / MoH-ViT attention.py) on the stacked logits: gates (T, h) and the
    load-balance loss."""
    E = heads - shared
    p = torch.softmax(logits[:, :E].float(), -1)
    mask = torch.zeros_like(p).scatter(1, p.topk(topk, -1).indices, 1.0)
    routed = p * mask
    routed = routed / routed.sum(-1, keepdim=True).clamp(min=torch.finfo(p.dtype).eps) * (topk if scale_by_k else 1)
    aux = (p.mean(0) * mask.mean(0)).mean() * E * E
    if shared == 0:
        return routed, aux
    s = torch.softmax(logits[:, E:E + shared].float(), -1) * shared if shared > 1 else torch.ones_like(p[:, :1])
    a = torch.softmax(logits[:, -2:].float(), -1) * 2
    return torch.cat([a[:, :1] * s, a[:, 1:] * routed], -1), aux


def plain_attention(q, k, v, gates, bias, scale):
    B, h, N, d = q.shape
    s = (q * scale) @ k.expand(B, h, N, d).transpose(-2, -1)
    if bias is not None:
        s = s + bias
    o = (torch.softmax(s, -1) @ v.expand(B, h, N, d)).transpose(1, 2)
    if gates is not None:
        o = o * gates.reshape(B, N, h, 1).to(o.dtype)
    return o.reshape(B, N, h * d)


def grads(out, inputs, seed):
    w = randn(*out.shape, seed=seed, device=out.device).to(out.dtype)
    return torch.autograd.grad((out.float() * w.float()).sum(), [t for t in inputs if t is not None])


class AttentionCase:
    """q, k, v (and gates, routed, bias) of one MoH layer: B 2, h 6, N 37 (no multiple of a kernel's block)."""

    def __init__(self, seed, dtype=torch.float32, device="cpu", shared=2, topk=2, hkv=6, bias=False, gated=True,
                 d=16, N=37):
        B, h = 2, 6
        self.q = randn(B, h, N, d, seed=seed, dtype=dtype, device=device).requires_grad_()
        self.k = randn(B, hkv, N, d, seed=seed + 1, dtype=dtype, device=device).requires_grad_()
        self.v = randn(B, hkv, N, d, seed=seed + 2, dtype=dtype, device=device).requires_grad_()
        self.bias = randn(h, N, N, seed=seed + 3, dtype=dtype, device=device).requires_grad_() if bias else None
        self.shared, self.scale = shared, d ** -0.5
        self.gates = self.routed = None
        if gated:
            logits = router_logits(B * N, h, shared, seed + 4, device)
            gates, routed, _, _ = ops.route(logits, h, shared, topk, True)
            self.gates, self.routed = gates.detach().requires_grad_(), routed

    def args(self, path):
        return (self.q, self.k, self.v, self.gates, self.routed, self.bias, self.shared, self.scale, path)


class OpCheck(unittest.TestCase):
    """torch.library.opcheck on every op, on each device, fp32 and bf16."""

    def check(self, op, args):
        result = torch.library.opcheck(op, args)
        self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)

    def test_block_ops(self):
        for device, dtype in itertools.product(DEVICES, (torch.float32, torch.bfloat16)):
            with self.subTest(device=device, dtype=dtype):
                x = randn(2, 37, 48, seed=1, dtype=dtype, device=device).requires_grad_()
                mod = randn(2, 6 * 48, seed=2, dtype=dtype, device=device, scale=0.5).requires_grad_()
                shift, scale, gate = mod[:, :48], mod[:, 48:96], mod[:, 96:144]
                self.check(ops.ln_modulate, (x, shift, scale, 1e-6))
                branch = randn(2, 37, 48, seed=3, dtype=dtype, device=device).requires_grad_()
                self.check(ops.gate_residual, (x, gate, branch))
                z = randn(2, 37, 96, seed=4, dtype=dtype, device=device).requires_grad_()
                self.check(ops.bias_gelu, (z, randn(96, seed=5, dtype=dtype, device=device).requires_grad_()))
                o = randn(2, 6, 37, 8, seed=6, dtype=dtype, device=device).requires_grad_()
                g = randn(74, 6, seed=7, device=device).requires_grad_()
                self.check(ops.gate_heads, (o, g))
                # The backward ops are not differentiable themselves (no double backward): checked on plain tensors.
                x, shift, scale, gate, branch, z, o, g = (t.detach() for t in (x, shift, scale, gate, branch, z, o, g))
                out, mean, rstd = ops.ln_modulate(x, shift, scale, 1e-6)
                self.check(ops.ln_modulate_backward, (torch.ones_like(out), x, shift, scale, mean, rstd))
                self.check(ops.gate_residual_backward, (torch.ones_like(x), gate, branch))
                self.check(ops.bias_gelu_backward, (torch.ones_like(z), z, randn(96, seed=5, device=device)))
                self.check(ops.gate_heads_backward, (randn(2, 37, 48, seed=8, device=device), o, g))

    def test_route(self):
        for device, dtype, (heads, shared, topk) in itertools.product(DEVICES, (torch.float32, torch.bfloat16),
                                                                      ((6, 2, 2), (6, 1, 3), (6, 0, 2), (12, 4, 3))):
            with self.subTest(device=device, dtype=dtype, layout=(heads, shared, topk)):
                logits = router_logits(74, heads, shared, 9, device).to(dtype).requires_grad_()
                self.check(ops.route, (logits, heads, shared, topk, True))
                gates, routed, picks, aux = ops.route(logits.detach(), heads, shared, topk, True)
                self.check(ops.route_backward, (logits.detach(), routed, picks, torch.ones_like(gates),
                                                torch.ones_like(aux), heads, shared, topk, True))

    def test_attention(self):
        cases = {"moh": {}, "bias": {"bias": True}, "mha": {"gated": False}, "moa": {"hkv": 1, "shared": 0}}
        for device, dtype, (name, kw), path in itertools.product(DEVICES, (torch.float32, torch.bfloat16),
                                                                 cases.items(), ("dense", "sparse", "auto")):
            with self.subTest(device=device, dtype=dtype, case=name, path=path):
                c = AttentionCase(10, dtype, device, **kw)
                self.check(ops.attention, c.args(path))
                plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in c.args(path)]
                out, o, lse = ops.attention(*plain)
                q, k, v, gates, routed, bias, shared, scale, _ = plain
                self.check(ops.attention_backward, (torch.ones_like(out), q, k, v, gates, routed, bias, o, lse,
                                                    shared, scale, path))

    def test_moh_attention_composite(self):
        c = AttentionCase(11)
        logits = router_logits(74, 6, 2, 12).requires_grad_()
        self.check(ops.moh_attention, (c.q, c.k, c.v, logits, 2, 2, c.scale, "sparse"))


class Parity(unittest.TestCase):
    """Each op against the official op sequence it replaces, forward and backward."""

    def assert_close(self, got, want, tol, what):
        self.assertEqual(got.shape, want.shape, what)
        self.assertLessEqual(rel_err(got, want), tol, what)

    def test_block_ops_fp32_and_bf16(self):
        for dtype, tol in ((torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)):
            x = randn(2, 37, 48, seed=21, dtype=dtype).requires_grad_()
            shift = randn(2, 48, seed=22, dtype=dtype, scale=0.5).requires_grad_()
            scale = randn(2, 48, seed=23, dtype=dtype, scale=0.5).requires_grad_()
            z = randn(2, 37, 96, seed=24, dtype=dtype).requires_grad_()
            bias = randn(96, seed=25, dtype=dtype).requires_grad_()
            pairs = [
                ("ln_modulate", lambda: mf.ln_modulate(x, shift, scale),
                 lambda: F.layer_norm(x, (48,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None], (x, shift, scale)),
                ("gate_residual", lambda: mf.gate_residual(x, shift, z[..., :48]),
                 lambda: x + shift[:, None] * z[..., :48], (x, shift, z)),
                ("bias_gelu", lambda: mf.bias_gelu(z, bias), lambda: F.gelu(z + bias, approximate="tanh"), (z, bias)),
            ]
            for name, ours, theirs, inputs in pairs:
                with self.subTest(op=name, dtype=dtype):
                    a, b = ours(), theirs()
                    self.assert_close(a, b, tol, f"{name} forward")
                    for ga, gb in zip(grads(a, inputs, 26), grads(b, inputs, 26)):
                        self.assert_close(ga, gb, tol, f"{name} backward")

    def test_route(self):
        for heads, shared, topk in ((6, 2, 2), (6, 1, 3), (6, 0, 2), (16, 4, 6)):
            with self.subTest(layout=(heads, shared, topk)):
                logits = router_logits(300, heads, shared, 31).requires_grad_()
                r = mf.route(logits, heads, shared, topk)
                gates, aux = plain_route(logits, heads, shared, topk)
                self.assert_close(r.gates, gates, FP32_TOL, "gates")
                self.assert_close(r.aux_loss, aux, FP32_TOL, "aux_loss")
                self.assertEqual(r.picks.sum().item(), 300 * topk)
                ga = torch.autograd.grad((r.gates * gates.detach().sin()).sum() + r.aux_loss, logits)[0]
                gb = torch.autograd.grad((gates * gates.detach().sin()).sum() + aux, logits)[0]
                self.assert_close(ga, gb, FP32_TOL, "dlogits")

    def test_attention_paths_cases_and_types(self):
        cases = {"moh": {}, "bias": {"bias": True}, "mha": {"gated": False}, "moa": {"hkv": 1, "shared": 0},
                 "dit-s head": {"d": 64, "N": 64}}
        for dtype, (name, kw), path in itertools.product((torch.float32, torch.bfloat16), cases.items(),
                                                         ("dense", "sparse")):
            with self.subTest(dtype=dtype, case=name, path=path):
                c = AttentionCase(40, dtype, **kw)
                inputs = (c.q, c.k, c.v, c.gates, c.bias)
                out = mf.attention(c.q, c.k, c.v, c.gates, c.routed, c.bias, c.shared, c.scale, path)
                ref = plain_attention(*(t.double() if t is not None else None for t in inputs), c.scale)
                tol = BF16_TOL if dtype == torch.bfloat16 else FP32_TOL
                self.assert_close(out, ref, tol, "forward")
                tol = BF16_ATTENTION_GRAD_TOL if dtype == torch.bfloat16 else FP32_TOL
                ga, gb = grads(out, inputs, 41), grads(ref, inputs, 41)
                for i, (a, b) in enumerate(zip(ga, gb)):
                    if path == "sparse" and c.gates is not None and a.shape == c.gates.shape:
                        b = b * (c.gates != 0)  # a skipped pair's gate gradient is 0 (vision/nn/head_mix.h)
                    self.assert_close(a, b, max(tol, FP32_TOL) if i == 3 else tol, f"gradient {i}")

    def test_gradcheck_fp64(self):
        for name, kw in {"moh": {}, "bias": {"bias": True}, "moa": {"hkv": 1, "shared": 0}}.items():
            for path in ("dense", "sparse"):
                with self.subTest(case=name, path=path):
                    c = AttentionCase(50, torch.float64, d=4, N=5, **kw)
                    gates = c.gates.detach().double().requires_grad_()
                    keep = (gates != 0).double()

                    def f(q, k, v, g, *bias):
                        g = g * keep  # the routed zeros stay zeros (a change would be another routing)
                        return ops.attention(q, k, v, g, c.routed, bias[0] if bias else None, c.shared, c.scale,
                                             path)[0]
                    args = [c.q, c.k, c.v, gates] + ([c.bias] if c.bias is not None else [])
                    self.assertTrue(torch.autograd.gradcheck(f, args))


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device (the GPU call runs this class: scripts/gpu_call.sh)")
class CudaParity(unittest.TestCase):
    """The CUDA kernels' values against the CPU kernels' (the CPU ones are checked against the official op sequences
    above), forward and backward, fp32 and bf16: opcheck never compares values. The CUDA kernels sum in another order
    (fp32: 64 ulps of the largest value; bf16: the bf16 tolerances above); the attention core on CUDA is the plain
    sequence, not LibTorch's fused kernel: its bf16 key and value gradients get the fused kernel's tolerance."""

    def same(self, fn, inputs, tol, what, grad_tol=None):
        cpu = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
               for t in inputs]
        gpu = [t.detach().cuda().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
               for t in inputs]
        a, b = fn(*cpu), fn(*gpu)
        self.assertEqual(b.device.type, "cuda", what)
        self.assertLessEqual(rel_err(b.cpu(), a), tol, f"{what} forward")
        wanted = [i for i, t in enumerate(cpu) if isinstance(t, torch.Tensor) and t.requires_grad]
        ga = grads(a, [cpu[i] for i in wanted], 41)
        gb = grads(b, [gpu[i] for i in wanted], 41)
        for i, x, y in zip(wanted, ga, gb):
            self.assertLessEqual(rel_err(y.cpu(), x), grad_tol or tol, f"{what} gradient of input {i}")

    def test_block_ops_and_router(self):
        for dtype, tol in ((torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)):
            with self.subTest(dtype=dtype):
                x = randn(2, 37, 48, seed=42, dtype=dtype).requires_grad_()
                shift = randn(2, 48, seed=43, dtype=dtype, scale=0.5).requires_grad_()
                scale = randn(2, 48, seed=44, dtype=dtype, scale=0.5).requires_grad_()
                z = randn(2, 37, 96, seed=45, dtype=dtype).requires_grad_()
                bias = randn(96, seed=46, dtype=dtype).requires_grad_()
                self.same(lambda *a: mf.ln_modulate(*a), (x, shift, scale), tol, "ln_modulate")
                self.same(lambda x, g, b: mf.gate_residual(x, g, b), (x, shift, z[..., :48]), tol, "gate_residual")
                self.same(lambda z, b: mf.bias_gelu(z, b), (z, bias), tol, "bias_gelu")
                o = randn(2, 6, 37, 8, seed=47, dtype=dtype).requires_grad_()
                g = randn(74, 6, seed=48).requires_grad_()
                self.same(lambda o, g: ops.gate_heads(o, g), (o, g), tol, "gate_heads")
        for heads, shared, topk in ((6, 2, 2), (6, 0, 2), (16, 4, 6)):
            logits = router_logits(300, heads, shared, 49).requires_grad_()
            self.same(lambda l: ops.route(l, heads, shared, topk, True)[0], (logits,), FP32_TOL, "route gates")
            self.same(lambda l: ops.route(l, heads, shared, topk, True)[3].reshape(1), (logits,), FP32_TOL,
                      "route aux_loss")

    def test_attention(self):
        cases = {"moh": {}, "bias": {"bias": True}, "mha": {"gated": False}, "moa": {"hkv": 1, "shared": 0},
                 "dit-s head": {"d": 64, "N": 64}}
        for dtype, tol, gtol in ((torch.float32, FP32_TOL, FP32_TOL), (torch.bfloat16, BF16_TOL,
                                                                          BF16_ATTENTION_GRAD_TOL)):
            for (name, kw), path in itertools.product(cases.items(), ("dense", "sparse")):
                with self.subTest(dtype=dtype, case=name, path=path):
                    c = AttentionCase(50, dtype, **kw)
                    routed = c.routed

                    def f(q, k, v, gates, bias, routed=routed):
                        r = None if routed is None else routed.to(q.device)
                        return ops.attention(q, k, v, gates, r, bias, c.shared, c.scale, path)[0]
                    self.same(f, (c.q, c.k, c.v, c.gates, c.bias), tol, f"attention {name} {path}", gtol)


class Errors(unittest.TestCase):
    """Bad arguments raise a ValueError / TypeError that names the argument and what it should be."""

    def expect(self, kind, words, fn):
        with self.assertRaises(kind) as e:
            fn()
        message = str(e.exception)
        for w in words:
            self.assertIn(w, message)
        self.assertNotIn("Exception raised from", message)  # no C++ stack trace

    def test_attention_arguments(self):
        c = AttentionCase(60)
        q, k, v, g, r = c.q, c.k, c.v, c.gates, c.routed
        self.expect(ValueError, ["q must be (B, h, N, d)"], lambda: mf.attention(q[0], k, v))
        self.expect(ValueError, ["k must have h = 6 heads or 1"], lambda: mf.attention(q, k[:, :2], v[:, :2]))
        self.expect(TypeError, ["k must have q's type"], lambda: mf.attention(q, k.double(), v))
        self.expect(ValueError, ["gates must be (B*N, h)"], lambda: mf.attention(q, k, v, g[:5], r[:5], shared=2))
        self.expect(ValueError, ["routed must be (B*N, K) with K in [0, h - shared] = [0, 4]"],
                    lambda: mf.attention(q, k, v, g, torch.zeros(74, 5, dtype=torch.int64), shared=2))
        self.expect(ValueError, ['path must be "dense", "sparse" or "auto", got "fast"'],
                    lambda: mf.attention(q, k, v, g, r, shared=2, path="fast"))
        self.expect(ValueError, ["topk in [0, h - shared] = [0, 4], got shared=2, topk=5"],
                    lambda: mf.moh_attention(q, k, v, router_logits(74, 6, 2, 1), shared=2, topk=5))

    def test_router_and_block_arguments(self):
        self.expect(ValueError, ["topk must be in [1, heads - shared] = [1, 4], got 0"],
                    lambda: mf.route(router_logits(8, 6, 2, 1), 6, 2, 0))
        self.expect(ValueError, ["logits must be (T, 8)"], lambda: mf.route(torch.zeros(8, 7), 6, 2, 2))
        x = torch.zeros(2, 5, 8)
        self.expect(ValueError, ["shift must be (B, D)"], lambda: mf.ln_modulate(x, torch.zeros(2, 7), torch.zeros(2, 8)))
        self.expect(TypeError, ["x must be float32, bfloat16 or float16"],
                    lambda: mf.ln_modulate(x.long(), torch.zeros(2, 8), torch.zeros(2, 8)))
        self.expect(ValueError, ["bias must be (F)"], lambda: mf.bias_gelu(torch.zeros(4, 6), torch.zeros(5)))
        if torch.cuda.is_available():
            self.expect(ValueError, ["must be on cpu"], lambda: mf.gate_residual(x, torch.zeros(2, 8).cuda(), x))


if __name__ == "__main__":
    unittest.main()
