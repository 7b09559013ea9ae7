"""torch.ops.moh the ways PyTorch users call it beyond the happy path: the backward ops called directly with wrong
arguments (a named Python exception, never an out-of-bounds read), double backward (a RuntimeError naming the op),
empty batches, inputs of which some or none require a gradient, non-contiguous inputs, fp16, autocast with the mixed
q/k/v types of qk_norm, torch.export of a swapped MoH-DiT block, and the metric ops under FakeTensor and compile.

    .venv/bin/python -m unittest discover -s python/tests -p 'test_usage.py'      (after pip install ./python)
"""
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import moh_torch  # noqa: F401
from moh_torch import functional as mf
from moh_torch import nn as mnn
from test_ops import (AttentionCase, BF16_TOL, FP32_TOL, grads, plain_attention, plain_route, randn, rel_err,
                      router_logits)

ops = torch.ops.moh
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# fp16: one rounding of the fp32 result to fp16 (11 bits) and one of an input gradient: two fp16 steps.
FP16_TOL = 2.0 ** -10


def block_inputs(seed, dtype=torch.float32, B=2, N=37, D=48):
    x = randn(B, N, D, seed=seed, dtype=dtype).requires_grad_()
    shift = randn(B, D, seed=seed + 1, dtype=dtype, scale=0.5).requires_grad_()
    scale = randn(B, D, seed=seed + 2, dtype=dtype, scale=0.5).requires_grad_()
    z = randn(B, N, 2 * D, seed=seed + 3, dtype=dtype).requires_grad_()
    bias = randn(2 * D, seed=seed + 4, dtype=dtype).requires_grad_()
    return x, shift, scale, z, bias


def block_pairs(x, shift, scale, z, bias):
    """(name, ours, the plain composition, inputs) of each block op."""
    D = x.shape[-1]
    return [
        ("ln_modulate", lambda: mf.ln_modulate(x, shift, scale),
         lambda: F.layer_norm(x, (D,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None], (x, shift, scale)),
        ("gate_residual", lambda: mf.gate_residual(x, shift, z[..., :D]), lambda: x + shift[:, None] * z[..., :D],
         (x, shift, z)),
        ("bias_gelu", lambda: mf.bias_gelu(z, bias), lambda: F.gelu(z + bias, approximate="tanh"), (z, bias)),
    ]


class BackwardOpArguments(unittest.TestCase):
    """The backward ops are public: each argument checked, by name."""

    def expect(self, kind, words, fn):
        with self.assertRaises(kind) as e:
            fn()
        for w in words:
            self.assertIn(w, str(e.exception))
        self.assertNotIn("Exception raised from", str(e.exception))

    def test_block_backward_ops(self):
        x, shift, scale, z, bias = (t.detach() for t in block_inputs(1))
        out, mean, rstd = ops.ln_modulate(x, shift, scale, 1e-6)
        self.expect(ValueError, ["ln_modulate_backward: mean must be (B*N)"],
                    lambda: ops.ln_modulate_backward(out, x, shift, scale, mean[:5], rstd))
        self.expect(TypeError, ["ln_modulate_backward: rstd must be Float"],
                    lambda: ops.ln_modulate_backward(out, x, shift, scale, mean, rstd.double()))
        self.expect(ValueError, ["ln_modulate_backward: grad must be x's shape"],
                    lambda: ops.ln_modulate_backward(out[:1], x, shift, scale, mean, rstd))
        self.expect(ValueError, ["gate_residual_backward: gate must be (B, D)"],
                    lambda: ops.gate_residual_backward(x, shift[:1], x))
        self.expect(TypeError, ["gate_residual_backward: gate must be"],
                    lambda: ops.gate_residual_backward(x, shift.bfloat16(), x))
        self.expect(ValueError, ["bias_gelu_backward: grad must be z's shape"],
                    lambda: ops.bias_gelu_backward(z[:1], z, bias))
        o = randn(2, 4, 5, 8, seed=2)
        self.expect(ValueError, ["gate_heads_backward: grad must be (B, N, h*d)"],
                    lambda: ops.gate_heads_backward(torch.zeros(2, 5, 31), o, torch.ones(10, 4)))

    def test_route_backward(self):
        logits = router_logits(20, 6, 2, 3)
        gates, routed, picks, aux = ops.route(logits, 6, 2, 2, True)
        g, a = torch.ones_like(gates), torch.ones_like(aux)
        self.expect(ValueError, ["route_backward: routed must hold indices in [0, 4), got values in [0, 9]"],
                    lambda: ops.route_backward(logits, routed.clamp(max=0) + 9 * (routed == routed.max()), picks, g, a,
                                               6, 2, 2, True))
        self.expect(ValueError, ["route_backward: routed must be (T, topk)"],
                    lambda: ops.route_backward(logits, routed[:, :1], picks, g, a, 6, 2, 2, True))
        self.expect(TypeError, ["route_backward: routed must be Long"],
                    lambda: ops.route_backward(logits, routed.int(), picks, g, a, 6, 2, 2, True))
        self.expect(ValueError, ["route_backward: picks must be (heads - shared)"],
                    lambda: ops.route_backward(logits, routed, picks[:3], g, a, 6, 2, 2, True))
        self.expect(ValueError, ["route_backward: grad_aux must be a 0-dim tensor"],
                    lambda: ops.route_backward(logits, routed, picks, g, a.reshape(1), 6, 2, 2, True))
        self.expect(ValueError, ["route_backward: grad_gates must be (T, heads)"],
                    lambda: ops.route_backward(logits, routed, picks, g[:, :5], a, 6, 2, 2, True))

    def test_attention_indices_and_saved_results(self):
        c = AttentionCase(4)
        bad = c.routed.clone()
        bad[3, 1] = 4  # h - shared = 4 routed heads: index 4 is past the pool
        self.expect(ValueError, ["attention: routed must hold indices in [0, 4), got values in [0, 4]"],
                    lambda: ops.attention(c.q, c.k, c.v, c.gates, bad, None, c.shared, c.scale, "sparse"))
        out, o, lse = ops.attention(*c.args("sparse"))
        self.expect(ValueError, ["attention_backward: lse must be (B, h, N)"],
                    lambda: ops.attention_backward(out, c.q, c.k, c.v, c.gates, c.routed, None, o, lse[:1], c.shared,
                                                   c.scale, "sparse"))
        self.expect(TypeError, ["attention_backward: lse must be Float"],
                    lambda: ops.attention_backward(out, c.q, c.k, c.v, c.gates, c.routed, None, o, lse.double(),
                                                   c.shared, c.scale, "sparse"))
        self.expect(ValueError, ["attention_backward: o must be q's shape"],
                    lambda: ops.attention_backward(out, c.q, c.k, c.v, c.gates, c.routed, None, o[:, :2], lse,
                                                   c.shared, c.scale, "sparse"))


class DoubleBackward(unittest.TestCase):
    """create_graph gives the first derivatives unchanged; differentiating them again raises, naming the op."""

    def check(self, name, out, inputs):
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
        plain = torch.autograd.grad((out * w).sum(), inputs, retain_graph=True)
        first = torch.autograd.grad((out * w).sum(), inputs, create_graph=True)
        for a, b in zip(first, plain):
            self.assertTrue(torch.equal(a, b), name)
        with self.assertRaisesRegex(RuntimeError, f"moh::{name}: double backward is not supported"):
            torch.autograd.grad(sum(g.square().sum() for g in first), inputs)

    def test_every_differentiable_op(self):
        x, shift, scale, z, bias = block_inputs(6)
        self.check("ln_modulate", mf.ln_modulate(x, shift, scale), [x, shift, scale])
        self.check("gate_residual", mf.gate_residual(x, shift, z[..., :48]), [shift, z])
        self.check("bias_gelu", mf.bias_gelu(z, bias), [z, bias])
        logits = router_logits(30, 6, 2, 7).requires_grad_()
        self.check("route", ops.route(logits, 6, 2, 2, True)[0], [logits])
        o = randn(2, 4, 5, 8, seed=8).requires_grad_()
        gates = torch.rand(10, 4, generator=torch.Generator().manual_seed(9)).requires_grad_()
        self.check("gate_heads", ops.gate_heads(o, gates), [o, gates])
        c = AttentionCase(10)
        self.check("attention", ops.attention(*c.args("dense"))[0], [c.q, c.k, c.v, c.gates])


class EmptyAndPartial(unittest.TestCase):
    """Empty batches give empty results and gradients; inputs of which some or none require a gradient."""

    def test_empty_batches(self):
        x, shift, scale, z, bias = block_inputs(11, B=0)
        for name, ours, _, inputs in block_pairs(x, shift, scale, z, bias):
            with self.subTest(op=name):
                out = ours()
                self.assertEqual(out.shape[0], 0)
                got = torch.autograd.grad(out.sum(), inputs)
                for g, t in zip(got, inputs):
                    self.assertEqual(g.shape, t.shape)
                    self.assertEqual(g.abs().sum().item(), 0.0)
        q = torch.zeros(0, 6, 37, 16, requires_grad=True)
        logits = torch.zeros(0, 8, requires_grad=True)
        for path in ("dense", "sparse"):
            out, aux, picks, routed = ops.moh_attention(q, q, q, logits, 2, 2, 0.25, path)
            self.assertEqual((out.shape, routed.shape, picks.tolist()), ((0, 37, 96), (0, 2), [0, 0, 0, 0]))
            gq, gl = torch.autograd.grad(out.sum(), [q, logits])
            self.assertEqual((gq.shape, gl.shape), (q.shape, logits.shape))

    def test_some_or_no_inputs_require_grad(self):
        base = [t.detach() for t in block_inputs(12)]
        for name_i in range(3):
            for mask in ((True, False, True, True, False), (False,) * 5):
                inputs = [t.clone().requires_grad_(m) for t, m in zip(base, mask)]
                name, ours, theirs, used = block_pairs(*inputs)[name_i]
                with self.subTest(op=name, requires_grad=mask):
                    a, b = ours(), theirs()
                    self.assertEqual(a.requires_grad, b.requires_grad)
                    wanted = [t for t in used if t.requires_grad]
                    if wanted:
                        for ga, gb in zip(grads(a, wanted, 13), grads(b, wanted, 13)):
                            self.assertLessEqual(rel_err(ga, gb), FP32_TOL)
        c = AttentionCase(14)
        c.k.requires_grad_(False)
        c.gates.requires_grad_(False)
        out = ops.attention(*c.args("sparse"))[0]
        ref = plain_attention(c.q, c.k, c.v, c.gates, None, c.scale)
        for ga, gb in zip(grads(out, [c.q, c.v], 15), grads(ref, [c.q, c.v], 15)):
            self.assertLessEqual(rel_err(ga, gb), FP32_TOL)


class LayoutsAndTypes(unittest.TestCase):
    def test_non_contiguous_inputs(self):
        """Transposed and strided views give the contiguous copies' values and gradients."""
        x, shift, scale, z, bias = block_inputs(16)
        xt = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # (B, N, D) over (N, B, D)
        zs = torch.stack([z.detach(), z.detach()], -1)[..., 0].requires_grad_()  # z's values, column stride 2
        for (name, ours, _, inputs), (_, view, _, view_inputs) in zip(block_pairs(x, shift, scale, z, bias),
                                                                      block_pairs(xt, shift, scale, zs, bias)):
            with self.subTest(op=name):
                self.assertFalse(all(t.is_contiguous() for t in view_inputs))
                a, b = ours(), view()
                self.assertTrue(torch.equal(a, b), name)
                for ga, gb in zip(grads(a, inputs, 17), grads(b, view_inputs, 17)):
                    self.assertTrue(torch.equal(ga, gb), name)
        c = AttentionCase(18)
        qkv = torch.stack([c.q.detach(), c.k.detach(), c.v.detach()], 3).requires_grad_()  # (B, h, N, 3, d)
        q, k, v = qkv.unbind(3)
        out = ops.attention(q, k, v, c.gates, c.routed, None, c.shared, c.scale, "sparse")[0]
        ref = ops.attention(*c.args("sparse"))[0]
        self.assertLessEqual(rel_err(out, ref), FP32_TOL)

    def test_fp16(self):
        inputs = block_inputs(19, dtype=torch.float16)
        wide = [t.detach().float().requires_grad_() for t in inputs]
        for (name, ours, _, used), (_, _, theirs, used32) in zip(block_pairs(*inputs), block_pairs(*wide)):
            with self.subTest(op=name):
                a, b = ours(), theirs()
                self.assertEqual(a.dtype, torch.float16)
                self.assertLessEqual(rel_err(a, b), FP16_TOL)
                for ga, gb in zip(grads(a, used, 20), grads(b, used32, 20)):
                    self.assertLessEqual(rel_err(ga, gb), FP16_TOL)
        logits = router_logits(40, 6, 2, 21).half().requires_grad_()
        gates, aux = ops.route(logits, 6, 2, 2, True)[::3]
        want, want_aux = plain_route(logits.float(), 6, 2, 2)
        self.assertLessEqual(rel_err(gates, want), FP32_TOL)  # the router computes in fp32 from fp16 logits
        self.assertLessEqual(rel_err(aux, want_aux), FP32_TOL)


class UpcastLayerNorm(nn.LayerNorm):
    """LayerNorm as CUDA autocast runs it (fp32 out of a bf16 input), for a CPU test of qk_norm's mixed types."""

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


class Autocast(unittest.TestCase):
    def test_qk_norm_mixed_types(self):
        """q, k fp32 from the norms and v bf16 under bf16 autocast: the module attends in bf16, as the official
        scaled_dot_product_attention does under autocast."""
        torch.manual_seed(22)
        m = mnn.MoHAttention(64, 4, qkv_bias=True, qk_norm=True, norm_layer=UpcastLayerNorm, shared_head=2,
                             routed_head=1).eval()
        x = randn(2, 10, 64, seed=23)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
            B, N, _ = x.shape
            q, k, v = m.qkv(x).reshape(B, N, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
            q, k = m.q_norm(q), m.k_norm(k)
            self.assertEqual((q.dtype, v.dtype), (torch.float32, torch.bfloat16))
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)  # autocast: all three in bf16
            gates = ops.route(m.router_logits(x.reshape(B * N, 64)), 4, 2, 1, True)[0]
            ref = m.proj((o * gates.reshape(B, N, 4, 1).to(o.dtype)).reshape(B, N, 64))
        self.assertEqual(out.dtype, ref.dtype)
        self.assertLessEqual(rel_err(out, ref), 2 * BF16_TOL)


class OfficialOptions(unittest.TestCase):
    def test_fixed_pool_size_on_a_non_square_map(self):
        """MoH-ViT's fixed_pool_size (a pool of that side whatever the map): the swapped aggregated attention pools the
        same and gives the reference's output."""
        fixtures = os.path.join(ROOT, "tests", "fixtures", "gen")
        sys.path.insert(0, fixtures)
        import transnext_torch
        torch.manual_seed(31)
        ref = transnext_torch.AggregatedAttention(32, (8, 12), 2, 2, shared=1, topk=1, fixed_pool_size=3).eval()
        table, index = transnext_torch.relative_position_cpb((8, 12), (3, 3), (8, 12))
        swapped = mnn.from_module(ref)
        self.assertEqual((swapped.pool_H, swapped.pool_W), (3, 3))
        x = randn(2, 96, 32, seed=32)
        self.assertLessEqual(rel_err(swapped(x, 8, 12, index, table), ref(x, 8, 12, index, table)), 1e-5)

    def test_attention_dropout_swaps_for_eval_only(self):
        official = mnn.MoHAttention(64, 4, shared_head=2, routed_head=1)
        official.attn_drop = nn.Dropout(0.1)
        swapped = mnn.from_module(official.eval())
        swapped(randn(2, 5, 64, seed=33))  # eval: dropout is the identity, nothing to refuse
        with self.assertRaisesRegex(ValueError, "dropout p=0.1: the ops have no attention dropout"):
            swapped.train()(randn(2, 5, 64, seed=33))


class Export(unittest.TestCase):
    def test_export_swapped_dit_block(self):
        """torch.export of a MoH-DiT block made of the ops: the exported program runs and equals eager."""
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                                        "gen"))
        import make_torch
        torch.manual_seed(24)
        ref = make_torch.Block(96, make_torch.Attention(96, 6, 16, shared=2, topk=2, moh=True))
        block = mnn.DiTBlock.from_module(make_torch.randomize(ref, 24, router_std=1.0)).eval()
        x, c = randn(2, 64, 96, seed=25), randn(2, 96, seed=26)
        program = torch.export.export(block, (x, c))
        targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        self.assertTrue({"moh.ln_modulate.default", "moh.gate_residual.default", "moh.bias_gelu.default",
                         "moh.moh_attention.default"} <= targets, sorted(targets))
        x2, c2 = randn(2, 64, 96, seed=27), randn(2, 96, seed=28)
        self.assertTrue(torch.equal(program.module()(x2, c2), block(x2, c2)))


class MetricsTracing(unittest.TestCase):
    def test_fake_tensors_and_compile(self):
        """gaussian_stats under FakeTensorMode gives fake results of the right shapes (no host copy of a fake
        tensor); frechet_distance inside a compiled function runs eagerly and gives eager's number."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            mu, sigma = ops.gaussian_stats(torch.empty(100, 7))
        self.assertEqual((tuple(mu.shape), tuple(sigma.shape), mu.dtype), ((7,), (7, 7), torch.float64))
        a, b = randn(50, 7, seed=29), randn(60, 7, seed=30) + 0.5

        def fid(a, b):
            return ops.frechet_distance(*ops.gaussian_stats(a), *ops.gaussian_stats(b))
        torch._dynamo.reset()
        self.assertEqual(torch.compile(fid)(a, b), fid(a, b))


class Versions(unittest.TestCase):
    """The package records the torch it was built for; another torch is refused on import in one line, and the build
    without torch (pip's isolated build environment) says which command to run."""

    def last_line(self, args, env=None):
        r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stderr.strip().splitlines()[-1]

    def test_built_for_this_torch(self):
        from moh_torch import _build_info
        self.assertEqual(_build_info.TORCH_VERSION, torch.__version__)
        line = self.last_line([sys.executable, "-c", "import torch; torch.__version__ = '2.99.0'; import moh_torch"])
        self.assertEqual(line, f"ImportError: moh_torch: its ops were built for torch {torch.__version__} (CUDA "
                               f"{torch.version.cuda}), this is torch 2.99.0: rebuild it: `pip install ./python "
                               "--no-build-isolation` from the toolkit's checkout, in this environment")

    def test_build_without_torch(self):
        with tempfile.TemporaryDirectory() as stub:
            with open(os.path.join(stub, "torch.py"), "w") as f:
                f.write("raise ImportError('No module named torch')\n")
            env = dict(os.environ, PYTHONPATH=stub)
            line = self.last_line([sys.executable, "python/setup.py", "--version"], env)
        self.assertIn("error: moh_torch build: torch is not importable here", line)
        self.assertIn("`pip install ./python --no-build-isolation`", line)


if __name__ == "__main__":
    unittest.main()
