"""swap_attention inside the official training loops, on the reference models of tests/fixtures/gen, whose loss lists
are wired as the official classes' are (MoH-DiT: MoHAttention.LOAD_BALANCING_LOSSES; MoH-ViT: both attention kinds
append to attention.Attention's list, the aggregated one from another class, as attention_native.py:107 does):

- MoH-ViT engine.py's loop (clear Attention.LOAD_BALANCING_LOSSES, forward, loss + 0.01 · their mean, backward, step)
  with the optimizer and a timm-style EMA built before the swap, one attention parameter frozen;
- MoH-DiT train.py's loop (the same with MoHAttention's list, DiT's update_ema over named parameters) under a 2-process
  Gloo DistributedDataParallel built before the swap.

Each runs ten steps on the unswapped model and on the swapped one: every routed layer's loss lands in the list the loop
sums (stages 1-4), no list grows across steps, the optimizer's parameters are the model's, requires_grad stays, and
the trajectories agree: losses and parameters no further from the unswapped model's than fp32 rounding allows (the
parameters' difference under a thousandth of what ten steps moved them; a lost loss or an untrained parameter moves
them by the whole step).

    .venv/bin/python -m unittest discover -s python/tests -p 'test_train_loop.py'
"""
import copy
import os
import sys
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import moh_torch  # noqa: F401
from moh_torch import nn as mnn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "gen"))
import make_torch  # noqa: E402
import transnext_torch  # noqa: E402

STEPS = 10
# fp32 rounding, amplified by ten AdamW steps (Adam turns the rounding noise of gradients that are zero by the math, as
# the CPB bias's under a softmax, into whole steps of either sign: the official code's own fp32 run ends 2e-3 of its
# travel from its fp64 run): the swapped model must end as close to the fp64 run of the unswapped one as the unswapped
# fp32 run does (within twice its distance, or FLOOR of the distance travelled), losses and parameters alike. A loss
# left out of the loop's list ends 27x further than that (tried: swap_attention(model, losses=[])); parameters copied
# instead of shared fail the optimizer's identity check first.
FLOOR = 1e-5
# Nano with a routed layer in every stage and every top-K >= 2 (heads 2, 4, 8, 8: top-2 of 2, 1 + top-2 of 3, 4 + top-2
# of 4 twice); a top-1 gate is K · p / p, whose gradient is rounding noise that AdamW would turn into steps.
NANO_ROUTED = dict(transnext_torch.VARIANTS["ViT-Nano"], shared=[0, 1, 4, 4], topk=[2, 2, 2, 2], drop_path=0.0)


def norm(tensors):
    return sum(t.double().square().sum() for t in tensors).sqrt().item()


class Run:
    """What one training run leaves: parameters at the start and end (fp64 copies, by name), the EMA's, per-step loss
    values and how many losses each step's list held."""

    def __init__(self, model, ema):
        self.model, self.ema = model, ema
        self.start = self.snapshot(model)
        self.seen, self.values = [], []

    @staticmethod
    def snapshot(module):
        return {n: p.detach().double().clone() for n, p in module.named_parameters()}

    def finish(self):
        self.end, self.ema_end = self.snapshot(self.model), self.snapshot(self.ema)
        return self


def assert_tracks(case, ours, ref, exact):
    """ours (swapped, fp32) ends as close to exact (unswapped, fp64) as ref (unswapped, fp32) does: parameters, EMA and
    the per-step losses, each norm-wise relative to how far the exact run travelled."""
    def gap(a, b):
        return norm([a[n] - b[n] for n in b])
    for what in ("end", "ema_end"):
        travelled = gap(getattr(exact, what), exact.start)
        truth = getattr(exact, what)
        ours_err, ref_err = gap(getattr(ours, what), truth), gap(getattr(ref, what), truth)
        case.assertLessEqual(ours_err / travelled, max(2 * ref_err / travelled, FLOOR), what)
    losses = [torch.tensor([v[0] for v in run.values], dtype=torch.float64) for run in (ours, ref, exact)]
    ours_err, ref_err = (losses[0] - losses[2]).norm(), (losses[1] - losses[2]).norm()
    case.assertLessEqual(ours_err.item(), max(2 * ref_err.item(), FLOOR * losses[2].norm().item()), "losses")


class Loop:
    """The official loops' step: clear the class-level list, forward, loss + coeff · mean of the list, backward, step,
    EMA update; records into a Run."""

    def __init__(self, losses, run, coeff=0.01):
        self.losses, self.run, self.coeff = losses, run, coeff

    def step(self, model, opt, loss_fn, ema_update):
        self.losses.clear()
        loss = loss_fn(model)
        moh = self.coeff * sum(self.losses) / max(len(self.losses), 1)
        self.run.seen.append(len(self.losses))
        self.run.values.append((float(loss + moh), float(moh)))
        opt.zero_grad()
        (loss + moh).backward()
        opt.step()
        ema_update(self.run.ema, self.run.model)


def timm_ema_update(ema, model, decay=0.99):
    """timm ModelEmaV2.update: the state_dicts' values zipped in order."""
    with torch.no_grad():
        for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
            e.copy_(decay * e + (1 - decay) * m)


def dit_update_ema(ema, model, decay=0.9):
    """DiT train.py update_ema: named parameters."""
    ema_params = dict(ema.named_parameters())
    with torch.no_grad():
        for name, param in model.named_parameters():
            ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def small_moh_dit(seed, dtype):
    """A MoH-DiT of the official structure, 8 x 8 x 4 latents: 4 layers of 4 heads of 16, 2 shared + top-2 of 2 in the
    first three, every head shared in the last (no loss there)."""
    torch.manual_seed(seed)
    model = make_torch.DiT(8, 2, 4, 64, 4, 10, [4] * 4, 16, [2, 2, 2, 4], [2, 2, 2, 0])
    for block in model.blocks:
        block.attn.fused_attn = True
    return make_torch.randomize(model, seed, router_std=1.0).to(dtype)


def dit_loss(step, rank, dtype):
    g = torch.Generator().manual_seed(step + 1000 * rank)
    x = torch.randn(4, 4, 8, 8, generator=g).to(dtype)
    t, y = torch.randint(0, 1000, (4,), generator=g), torch.randint(0, 10, (4,), generator=g)
    return lambda model: (model(x, t, y)[:, :4] - x).square().mean()


class EngineLoop(unittest.TestCase):
    """MoH-ViT engine.py with AdamW and a timm EMA built before the swap, one attention parameter frozen."""

    def train(self, swap, dtype=torch.float32):
        model = transnext_torch.randomize(transnext_torch.TransNeXt(NANO_ROUTED), 11).train().to(dtype)
        frozen = model.block1[0].attn.q.weight
        frozen.requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        run = Run(model, copy.deepcopy(model))
        if swap:
            self.assertEqual(mnn.swap_attention(model), 7)
            self.assertIs(model.block1[0].attn.q.weight, frozen)
            self.assertFalse(frozen.requires_grad)
        ids = {id(p) for g in opt.param_groups for p in g["params"]}
        self.assertEqual({id(p) for p in model.parameters()}, ids, "the optimizer holds the model's parameters")
        g = torch.Generator().manual_seed(12)
        x, y = torch.randn(4, 1, 32, 32, generator=g).to(dtype), torch.randint(0, 10, (4,), generator=g)
        loop = Loop(transnext_torch.Attention.LOAD_BALANCING_LOSSES, run)
        for _ in range(STEPS):
            loop.step(model, opt, lambda m: F.cross_entropy(m(x), y), timm_ema_update)
        self.assertTrue(torch.equal(frozen.double(), run.start["block1.0.attn.q.weight"]), "a frozen parameter moved")
        return run.finish()

    def test_swapped_model_trains_as_the_official_one(self):
        mnn._Routed.LOAD_BALANCING_LOSSES.clear()
        ref, exact, ours = self.train(False), self.train(False, torch.float64), self.train(True)
        self.assertEqual(ours.seen, [7] * STEPS, "each step sums one loss per routed layer, stages 1-4")
        self.assertEqual(ref.seen, [7] * STEPS)
        self.assertEqual(mnn._Routed.LOAD_BALANCING_LOSSES, [], "nothing goes to moh_torch's own list")
        self.assertEqual(len(transnext_torch.Attention.LOAD_BALANCING_LOSSES), 7, "the list does not grow")
        kinds = {type(m.attn).__name__ for m in ours.model.modules() if hasattr(m, "attn")}
        self.assertEqual(kinds, {"AggregatedAttention", "TransNeXtAttention"})
        assert_tracks(self, ours, ref, exact)


def _ddp_train(rank, swap, dtype):
    """DiT train.py's loop on one rank: EMA, DDP and AdamW built first, then (swap) swap_attention(ddp.module)."""
    model = small_moh_dit(21, dtype).train()
    ema = copy.deepcopy(model).requires_grad_(False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, weight_decay=0)
    run = Run(model, ema)
    if swap:
        assert mnn.swap_attention(ddp.module) == 4
    loop = Loop(make_torch.Attention.LOAD_BALANCING_LOSSES, run)
    for step in range(STEPS):
        loop.step(ddp, opt, dit_loss(step, rank, dtype), dit_update_ema)
    run.finish()
    return dict(start=run.start, end=run.end, ema_end=run.ema_end, seen=run.seen, values=run.values,
                left=len(make_torch.Attention.LOAD_BALANCING_LOSSES), own=len(mnn._Routed.LOAD_BALANCING_LOSSES),
                kinds=sorted({type(b.attn).__name__ for b in model.blocks}))


def _ddp_rank(rank, world, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {"ref": _ddp_train(rank, False, torch.float32), "exact": _ddp_train(rank, False, torch.float64),
               "ours": _ddp_train(rank, True, torch.float32)}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


class DdpLoop(unittest.TestCase):
    """MoH-DiT train.py under 2-process Gloo DDP, with DiT's EMA, all built before the swap."""

    def test_ddp_built_before_the_swap_trains_the_swapped_model(self):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_ddp_rank, args=(2, os.path.join(tmp, "rdzv"), tmp), nprocs=2, join=True)
            ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
        for r in ranks:
            self.assertEqual(r["ours"]["kinds"], ["MoHAttention"])
            self.assertEqual(r["ours"]["seen"], [3] * STEPS, "one loss per routed layer each step")
            self.assertEqual(r["ours"]["left"], 3, "the list does not grow")
            self.assertEqual(r["ours"]["own"], 0, "nothing goes to moh_torch's own list")
        for name, p in ranks[0]["ours"]["end"].items():  # DDP kept the ranks in step
            self.assertTrue(torch.equal(p, ranks[1]["ours"]["end"][name]), name)
        runs = {}
        for key in ("ours", "ref", "exact"):
            runs[key] = type("R", (), ranks[0][key])
        assert_tracks(self, runs["ours"], runs["ref"], runs["exact"])


if __name__ == "__main__":
    unittest.main()
