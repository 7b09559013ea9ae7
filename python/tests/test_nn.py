"""moh_torch.nn against the reference models of tests/fixtures/gen (the official module structure and math in plain
PyTorch: MoH-DiT's MoHAttention and DiT blocks, MoH-ViT's full and aggregated attention): the swapped models give the
same outputs and gradients (fp32, ≤ 1e-5 relative), the same state_dict keys, and the official aux-loss list; the DiT
and ViT blocks built from the ops run under torch.compile(fullgraph=True) and equal eager.

    .venv/bin/python -m unittest discover -s python/tests -p 'test_nn.py'
"""
import copy
import os
import sys
import unittest

import torch

import moh_torch
from moh_torch import nn as mnn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "gen"))
import make_torch  # noqa: E402
import transnext_torch  # noqa: E402

# The bound for a whole swapped model in fp32 where the official math itself stays that close to fp64 (MoH-DiT-S/2).
MODEL_TOL = 1e-5
FP32_FLOOR = COMPILED_TOL = 64 * 2.0 ** -24


def norm_err(results, truth, names):
    """‖results − truth‖ / ‖truth‖ over the tensors `names` taken together."""
    diff = sum(((results[n].double() - truth[n].double()) ** 2).sum() for n in names)
    return (diff / sum((truth[n].double() ** 2).sum() for n in names)).sqrt().item()


def rel_err(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


def moh_dit_s2_90(seed):
    """MoH-DiT-S/2-90 (spec: shared [3 x 8, 6 x 4], top-K [2 x 8, 0 x 4]) on a 32 x 32 x 4 latent, routers wide
    enough that no top-K choice is a near tie; attention through scaled_dot_product_attention, as the official module
    runs it by default (its matmul-softmax path differs from that by 1.0e-5 of the largest output here itself)."""
    torch.manual_seed(seed)
    model = make_torch.DiT(32, 2, 4, 384, 12, 1000, [6] * 12, 64, [3] * 8 + [6] * 4, [2] * 8 + [0] * 4)
    for block in model.blocks:
        block.attn.fused_attn = True
    return make_torch.randomize(model, seed, router_std=1.0)


def dit_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, 32, 32, generator=g), torch.tensor([3, 700]), torch.tensor([5, 1000])


def outputs_and_grads(model, args, grad_inputs):
    """The output and the gradients of (output · w) for a fixed w: every named parameter's, then each input's."""
    out = model(*args)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(99)).to(out.dtype)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * w).sum(), [p for _, p in named] + grad_inputs)
    return {"output": out, **{n: g for (n, _), g in zip(named, grads)},
            **{f"input {i}": g for i, g in enumerate(grads[len(named):])}}


class SwappedModels(unittest.TestCase):
    def compare(self, ref, swapped, args, grad_inputs):
        """The swapped model's output and gradients against the reference's and both against the reference in fp64:
        the swapped model's fp32 results must be as close to the exact ones as the official math's own fp32 results
        (within twice their error, norm-wise over the output and over all gradients together, or 64 fp32 ulps where
        that error is smaller). Deep MoH-ViTs amplify fp32 rounding (cosine attention at temperature · log N): the
        official math's own output differs from fp64 by ~1e-4 there, and the CPB bias's gradient, a sum that cancels
        to ~0, is rounding noise in either."""
        exact = copy.deepcopy(ref).double()
        ours = outputs_and_grads(swapped, args, grad_inputs)
        theirs = outputs_and_grads(ref, args, grad_inputs)
        exact_inputs = {id(t): t.detach().double().requires_grad_() for t in grad_inputs}
        exact_args = [exact_inputs.get(id(a), a.double() if a.is_floating_point() else a) for a in args]
        truth = outputs_and_grads(exact, exact_args, [exact_inputs[id(t)] for t in grad_inputs])
        self.assertEqual(sorted(ours), sorted(theirs))
        self.worst = {name: rel_err(ours[name], theirs[name]) for name in truth}
        grads = [name for name in truth if name != "output"]
        for what, names in (("output", ["output"]), ("gradients", grads)):
            ours_err, theirs_err = norm_err(ours, truth, names), norm_err(theirs, truth, names)
            self.assertLessEqual(ours_err, max(2 * theirs_err, FP32_FLOOR), what)
        # Each tensor on its own (a small one such as wg_0 would hide in the norm over all): within twice the official
        # math's own error on it, or 64 fp32 ulps of the largest gradient (a gradient that cancels to ~0 by the math,
        # the CPB bias's under a softmax, is rounding noise in both).
        largest = max(truth[n].double().norm().item() for n in grads)
        for name in grads:
            diff = lambda got: (got[name].double() - truth[name].double()).norm().item()  # noqa: E731
            self.assertLessEqual(diff(ours), max(2 * diff(theirs), FP32_FLOOR * largest), name)


    def test_moh_dit_s2_90(self):
        ref = moh_dit_s2_90(1).train()
        swapped = copy.deepcopy(ref)
        self.assertEqual(mnn.swap_attention(swapped), 12)
        self.assertEqual(list(swapped.state_dict()), list(ref.state_dict()))
        self.assertTrue(all(isinstance(b.attn, mnn.MoHAttention) for b in swapped.blocks))
        x, t, y = dit_inputs(2)
        x.requires_grad_()
        for path in ("dense", "sparse"):
            with self.subTest(path=path):
                for b in swapped.blocks:
                    b.attn.path = path
                self.compare(ref, swapped, (x, t, y), [x])
                self.assertLessEqual(self.worst["output"], MODEL_TOL)

    def test_moh_vit_s_75(self):
        torch.manual_seed(3)
        variant = transnext_torch.VARIANTS["MoH-ViT-S-75"]  # at 64 px (the stages' maps 16, 8, 4, 2), no drop path
        ref = transnext_torch.randomize(transnext_torch.TransNeXt(variant, img_size=64, drop_path=0.0), 3).train()
        swapped = copy.deepcopy(ref)
        self.assertEqual(mnn.swap_attention(swapped), 37)  # 5 + 5 + 22 + 5 blocks
        self.assertEqual(list(swapped.state_dict()), list(ref.state_dict()))
        kinds = {type(m).__name__ for m in swapped.modules() if isinstance(m, mnn._Routed)}
        self.assertEqual(kinds, {"AggregatedAttention", "TransNeXtAttention"})
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4)).requires_grad_()
        transnext_torch.AUX.clear()
        self.compare(ref, swapped, (x,), [x])

    def test_aux_losses_go_to_the_official_list(self):
        class Official(make_torch.Attention):
            LOAD_BALANCING_LOSSES = []
        torch.manual_seed(5)
        m = Official(64, 4, 16, shared=1, topk=2, moh=True)
        swapped = mnn.from_module(m.train())
        x = torch.randn(2, 10, 64)
        swapped(x)
        self.assertEqual(len(Official.LOAD_BALANCING_LOSSES), 1)
        want = make_torch.moh_balance_loss(m, x.reshape(20, 64))
        self.assertLessEqual(rel_err(Official.LOAD_BALANCING_LOSSES[0], want), 1e-6)
        self.assertEqual(swapped.head_load.sum().item(), 20 * 2)
        swapped.eval()(x)
        self.assertEqual(len(Official.LOAD_BALANCING_LOSSES), 1)  # training only

    def test_unknown_module_and_dropout(self):
        with self.assertRaisesRegex(TypeError, "not an attention module it knows"):
            mnn.from_module(torch.nn.Linear(3, 3))
        with self.assertRaisesRegex(ValueError, "attn_drop must be 0"):
            mnn.MoHAttention(64, 4, attn_drop=0.1)
        with self.assertRaisesRegex(ValueError, "path must be one of"):
            mnn.MoHAttention(64, 4, path="fast")


class Compiled(unittest.TestCase):
    """A MoH-DiT block and a MoH-ViT block from the ops under torch.compile(fullgraph=True): no graph break (fullgraph
    raises on one) and the same outputs and gradients as eager."""

    def run_compiled(self, block, args, backend):
        torch._dynamo.reset()
        # A compiled graph cached by an earlier run would carry that run's fake implementations' strides.
        torch._inductor.config.force_disable_caches = True
        eager = block(*args)
        compiled = torch.compile(block, fullgraph=True, backend=backend)(*args)
        # inductor fuses the modules' own element-wise ops: fp32 sums in another order (64 ulps of the largest value).
        self.assertLessEqual(rel_err(compiled, eager), COMPILED_TOL)
        ga = torch.autograd.grad(eager.square().sum(), args[0])[0]
        gb = torch.autograd.grad(compiled.square().sum(), args[0])[0]
        self.assertLessEqual(rel_err(gb, ga), COMPILED_TOL)

    def test_dit_block(self):
        torch.manual_seed(6)
        ref = make_torch.Block(96, make_torch.Attention(96, 6, 16, shared=2, topk=2, moh=True))
        block = mnn.DiTBlock.from_module(make_torch.randomize(ref, 6, router_std=1.0)).train()
        x = torch.randn(2, 64, 96, requires_grad=True)
        c = torch.randn(2, 96)
        self.assertLessEqual(rel_err(block(x, c), ref(x, c)), MODEL_TOL)
        for backend in ("aot_eager", "inductor"):
            with self.subTest(backend=backend):
                self.run_compiled(block, (x, c), backend)

    def test_vit_block(self):
        torch.manual_seed(7)
        v = transnext_torch.VARIANTS["MoH-ViT-Nano-50"]
        model = transnext_torch.randomize(transnext_torch.TransNeXt(v), 7)
        mnn.swap_attention(model)
        block = model.block3[0].train()
        index, table = model.relative_pos_index3, model.relative_coords_table3
        x = torch.randn(2, 16, 128, requires_grad=True)
        self.run_compiled(lambda t: block(t, 4, 4, index, table), (x,), "aot_eager")


if __name__ == "__main__":
    unittest.main()
