"""By hand, beside a checkout of the official code: SkyworkAI/MoH's own models (MoH-DiT models.py, MoH-ViT
transnext.py, as of 2cefd57) with their attention swapped by moh_torch.nn.swap_attention, against the unswapped model
and against its fp64 copy (outputs, and the gradients of every parameter and the input). Not run in CI (it needs the
official files, which are never committed here); docs/results/moh_torch/README.md has its figures.

    PYTHONPATH=STUBS .venv/bin/python python/tests/check_official.py OFFICIAL_CHECKOUT
(transnext.py imports pkg_resources, which setuptools >= 81 no longer ships: STUBS may hold a pkg_resources.py whose
get_distribution raises DistributionNotFound, so that the native aggregated attention is taken.)"""
import copy, sys, torch
OFFICIAL = sys.argv[1]
sys.path.insert(0, OFFICIAL + "/MoH-DiT")
import models as dit_models
sys.path.insert(0, OFFICIAL + "/MoH-ViT")
import transnext as vit
from moh_torch import nn as mnn

def rel(a, b): return ((a.double()-b.double()).abs().max()/b.double().abs().max()).item()
def fro(a, b): return ((a.double()-b.double()).norm()/b.double().norm()).item()

def run(model, args, gin):
    out = model(*args)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(99)).to(out.dtype)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    g = torch.autograd.grad((out*w).sum(), [p for _, p in named] + gin)
    return out, dict(zip([n for n, _ in named] + ["input"], g))

def compare(name, ref, args, xi):
    sw = copy.deepcopy(ref); n = mnn.swap_attention(sw)
    ex = copy.deepcopy(ref).double()
    x64 = xi.detach().double().requires_grad_()
    a64 = [x64 if a is xi else (a.double() if a.is_floating_point() else a) for a in args]
    o_r, g_r = run(ref, args, [xi]); o_s, g_s = run(sw, args, [xi]); o_d, g_d = run(ex, a64, [x64])
    gr = lambda g: torch.cat([g[k].double().flatten() for k in sorted(g_d)])
    print(f"{name}: {n} attention modules swapped; output ours/official max-rel {rel(o_s, o_r):.2e}, "
          f"vs fp64: ours {rel(o_s, o_d):.2e} official {rel(o_r, o_d):.2e}; gradients (norm-wise, all params + input) "
          f"ours/official {fro(gr(g_s), gr(g_r)):.2e}, vs fp64: ours {fro(gr(g_s), gr(g_d)):.2e} official {fro(gr(g_r), gr(g_d)):.2e}")

def _t_embed(self, t):  # the official forward, its sinusoid cast to the MLP's type (for the fp64 copy)
    return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size).to(self.mlp[0].weight.dtype))
dit_models.TimestepEmbedder.forward = _t_embed

torch.manual_seed(0)
dit = dit_models.DiT_models["MoH-DiT-S/2-90"](input_size=32).train()
with torch.no_grad():  # far from DiT's zero-init adaLN, so that every attention matters; routers wide (no near ties)
    g = torch.Generator().manual_seed(1)
    for n, p in dit.named_parameters():
        if "pos_embed" in n: continue
        std = 1.0 if ".wg" in n else (p[0].numel() ** -0.5 if p.dim() > 1 else 0.05)
        p.copy_(torch.randn(p.shape, generator=g) * std)
x = torch.randn(2, 4, 32, 32, generator=torch.Generator().manual_seed(2), requires_grad=True)
compare("MoH-DiT-S/2-90 (official models.py)", dit, (x, torch.tensor([3, 700]), torch.tensor([5, 1000])), x)

torch.manual_seed(3)
v = vit.moh_transnext_small_75(img_size=64, pretrain_size=64, drop_path_rate=0.0).train()
with torch.no_grad():
    g = torch.Generator().manual_seed(4)
    for n, p in v.named_parameters():
        if ".wg" in n: p.copy_(torch.randn(p.shape, generator=g))
xv = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5), requires_grad=True)
compare("MoH-ViT-S-75 (official transnext.py, 64 px)", v, (xv,), xv)

# The training scripts' wiring (MoH-DiT train.py, MoH-ViT engine.py): an optimizer built before the swap holds every
# trainable parameter of the swapped model, a frozen parameter stays frozen, and a training forward appends to the
# official lists as many losses as the unswapped model does (the aggregated attention to attention.Attention's).
import attention as vit_attention
from models import MoHAttention as DitAttention
for name, model, args, lst in (("MoH-DiT-S/2-90", dit, (x, torch.tensor([3, 700]), torch.tensor([5, 1000])),
                                DitAttention.LOAD_BALANCING_LOSSES),
                               ("MoH-ViT-S-75", v, (xv,), vit_attention.Attention.LOAD_BALANCING_LOSSES)):
    m = copy.deepcopy(model)
    frozen_name = next(n for n, _ in m.named_parameters() if n.endswith(("attn.qkv.weight", "attn.q.weight")))
    m.get_parameter(frozen_name).requires_grad_(False)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    lst.clear(); m(*args); before = len(lst)
    mnn.swap_attention(m)
    held = {id(p) for g_ in opt.param_groups for p in g_["params"]}
    missing = [n for n, p in m.named_parameters() if p.requires_grad and id(p) not in held]
    lst.clear(); m(*args); after = len(lst)
    print(f"{name} training wiring: trainable parameters missing from an AdamW built before the swap: {len(missing)}; "
          f"{frozen_name} requires_grad after the swap: {m.get_parameter(frozen_name).requires_grad}; losses appended "
          f"to the official list per training forward: unswapped {before}, swapped {after}")
