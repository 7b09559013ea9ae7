#!/usr/bin/env python3
# The official MoH-DiT training step in plain PyTorch, for `bench/compare_python.sh`: the official module structure
# and parameter names (MoH-DiT/models.py: qkv, proj, wg, wg_0, wg_1, adaLN_modulation, ...), every head computed and
# then weighted by its gate (the official code masks, it does not skip), F.scaled_dot_product_attention where torch
# has it (timm's use_fused_attn, as the official MoHAttention), guided-diffusion's hybrid loss (MSE on ε + the
# variational bound of the learned σ, linear β schedule of 1000 steps) + 0.01 · mean over routed layers of the
# load-balance loss, AdamW (lr 1e-4, no weight decay), zero_grad / backward / step. Same shapes as
# `moh bench train --model MoH-DiT-S/2-90 --batch 8 --img-size 32`: latents 32×32×4, 1000 classes. On a GPU
# (--device cuda; XL variants as `moh bench train --model DiT-XL/2 --ema 0.9999`) it is the step of DiT's train.py:
# AdamW with PyTorch's default multi-tensor implementation, update_ema over named parameters after each step.
# With --chain ddimN it times DiT's sample.py chain instead (eval mode, no grad): forward_with_cfg (one forward of the
# doubled batch [cond | null], guidance scale 4 on the first 3 ε channels), guided-diffusion's DDIM (η = 0) over the
# respaced timesteps, as `moh bench sample --chain ddimN --cfg-scale 4`.
# usage: .venv/bin/python bench/pytorch_moh_dit_step.py [--model MoH-DiT-S/2-90|DiT-S/2|DiT-XL/2|MoH-DiT-XL/2-90|
#        DiT-Pixel/2|MoH-DiT-Pixel/2-75|MoH-DiT-Pixel/2-90] [--batch 8] [--steps 3] [--warmup 1] [--threads N]
#        [--precision fp32|bf16] [--loss hybrid|square] [--chain ddim50] [--device cpu|cuda] [--ema 0.9999] [--compile]
#        prints one JSON line {"step_s": ...}
import argparse, json, math, os, sys, time
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gen"))
from make_torch import DiT, moh_balance_loss  # noqa: E402  (the reference modules of the parity fixtures, official names)

VARIANTS = {  # S/2: 12 layers, 384 wide, 6 heads of 64; MoH-DiT-S/2-90: 3 shared + top-2 of 3 in 8 layers, 6 shared in 4
    "MoH-DiT-S/2-90": dict(dim=384, depth=12, head_dim=64, heads=[6] * 12, shared=[3] * 8 + [6] * 4,
                           topk=[2] * 8 + [0] * 4),
    "DiT-S/2": dict(dim=384, depth=12, head_dim=64, heads=[6] * 12, shared=None, topk=None),
    # XL/2: 28 layers, 1152 wide; DiT 16 heads of 72; MoH-DiT-XL/2-90 (MoH-DiT/models.py): 8, 16, 24 heads of 72 over
    # 9 + 10 + 9 layers, every head shared in the first 19, 16 shared + top-3 of 8 in the last 9
    "DiT-XL/2": dict(dim=1152, depth=28, head_dim=72, heads=[16] * 28, shared=None, topk=None),
    "MoH-DiT-XL/2-90": dict(dim=1152, depth=28, head_dim=72, heads=[8] * 9 + [16] * 10 + [24] * 9,
                            shared=[8] * 9 + [16] * 19, topk=[0] * 19 + [3] * 9),
    # the pixel models of the embedded dataset (diffusion/dit.cpp): 28×28×1 images, 10 classes, 6 layers 64 wide, 4
    # heads of 16 in patches of 2; MoH-75: 2 shared + top-1 of 2 everywhere; MoH-90: that in the first 3 layers, then
    # every head shared
    "DiT-Pixel/2": dict(dim=64, depth=6, head_dim=16, heads=[4] * 6, shared=None, topk=None, pixel=True),
    "MoH-DiT-Pixel/2-75": dict(dim=64, depth=6, head_dim=16, heads=[4] * 6, shared=[2] * 6, topk=[1] * 6, pixel=True),
    "MoH-DiT-Pixel/2-90": dict(dim=64, depth=6, head_dim=16, heads=[4] * 6, shared=[2] * 3 + [4] * 3,
                               topk=[1] * 3 + [0] * 3, pixel=True),
}

p = argparse.ArgumentParser()
p.add_argument("--model", default="MoH-DiT-S/2-90", choices=sorted(VARIANTS))
p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--threads", type=int, default=0,
               help="intra-op threads (0: torch's own default, as the official code runs; Debian's 1.13 says 1 and runs "
                    "its products on OpenBLAS's own pool; setting 2 there made this script 1.7x slower)")
p.add_argument("--loss", default="hybrid", choices=["hybrid", "square"],
               help="hybrid: guided-diffusion's mse + vb (what moh bench train runs); square: out.square().mean(), the "
                    "loss of the official-code timing protocol")
p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
p.add_argument("--chain", default="", help="ddimN: time a CFG sampling chain instead of a training step")
p.add_argument("--cfg-scale", type=float, default=4.0)
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
p.add_argument("--ema", type=float, default=0.0, help="DiT's update_ema after every step with this decay (0 = none)")
p.add_argument("--compile", action="store_true",
               help="model = torch.compile(model) (inductor, its defaults): what a PyTorch user gets for one line")
a = p.parse_args()
DEV = torch.device(a.device)
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)

AUX = []  # the official code's class-level LOAD_BALANCING_LOSSES list
FUSED = hasattr(F, "scaled_dot_product_attention")


def attention_forward(self, x):  # MoH-DiT MoHAttention.forward: all heads, then the gates
    B, N, C = x.shape
    q, k, v = self.qkv(x).reshape(B, N, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
    if FUSED:
        o = F.scaled_dot_product_attention(q, k, v)
    else:
        o = torch.softmax(q * self.hd ** -0.5 @ k.transpose(-2, -1), -1) @ v
    o = o.transpose(1, 2)  # (B, N, h, d)
    if self.moh:
        xt = x.reshape(B * N, C)
        o = o * self.gates(xt).reshape(B, N, self.h, 1)
        if self.k > 0 and self.training:
            AUX.append(moh_balance_loss(self, xt))
    return self.proj(o.reshape(B, N, self.h * self.hd))


v = VARIANTS[a.model]
SIZE, CIN, CLASSES = (28, 1, 10) if v.get("pixel") else (32, 4, 1000)
model = DiT(SIZE, 2, CIN, v["dim"], v["depth"], CLASSES, v["heads"], v["head_dim"], v["shared"], v["topk"])
for m in model.modules():
    if type(m).__name__ == "Attention":
        m.forward = attention_forward.__get__(m)
model.to(DEV).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
ema = None
if a.ema > 0:
    import copy
    ema = copy.deepcopy(model).requires_grad_(False)
trained = model  # the module whose parameters the optimizer and the EMA hold
if a.compile:
    model = torch.compile(model)


@torch.no_grad()
def update_ema():  # DiT train.py's update_ema
    ema_params, model_params = OrderedDict(ema.named_parameters()), OrderedDict(trained.named_parameters())
    for name, param in model_params.items():
        ema_params[name].mul_(a.ema).add_(param.data, alpha=1 - a.ema)


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()

# guided-diffusion, linear schedule, learned range σ, hybrid loss
T = 1000
betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
ac = torch.cumprod(1 - betas, 0)
ac_prev = torch.cat([torch.ones(1, dtype=torch.float64), ac[:-1]])
post_var = betas * (1 - ac_prev) / (1 - ac)
post_logvar = torch.log(torch.cat([post_var[1:2], post_var[1:]]))
coef1 = betas * ac_prev.sqrt() / (1 - ac)
coef2 = (1 - ac_prev) * (1 - betas).sqrt() / (1 - ac)


def at(arr, t, x):
    return arr.to(t.device)[t].float().view(-1, *([1] * (x.dim() - 1)))


def normal_kl(m1, lv1, m2, lv2):
    return 0.5 * (-1.0 + lv2 - lv1 + torch.exp(lv1 - lv2) + (m1 - m2) ** 2 * torch.exp(-lv2))


def approx_cdf(x):
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def discretized_ll(x, means, log_scales):
    cx, inv = x - means, torch.exp(-log_scales)
    cdf_plus, cdf_min = approx_cdf(inv * (cx + 1 / 255)), approx_cdf(inv * (cx - 1 / 255))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_1m_cdf_min = torch.log((1 - cdf_min).clamp(min=1e-12))
    delta = cdf_plus - cdf_min
    return torch.where(x < -0.999, log_cdf_plus,
                       torch.where(x > 0.999, log_1m_cdf_min, torch.log(delta.clamp(min=1e-12))))


def training_loss(x0, y):
    if a.loss == "square":
        AUX.clear()
        return model(x0, torch.randint(0, T, (x0.shape[0],), device=DEV), y).square().mean()
    t = torch.randint(0, T, (x0.shape[0],), device=DEV)
    noise = torch.randn_like(x0)
    xt = at(ac.sqrt(), t, x0) * x0 + at((1 - ac).sqrt(), t, x0) * noise
    AUX.clear()
    with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        out = model(xt, t, y)
    out = out.float()
    eps, var = out.split(CIN, dim=1)
    mse = ((noise - eps) ** 2).mean(dim=(1, 2, 3))
    min_log, max_log = at(post_logvar, t, xt), at(torch.log(betas), t, xt)
    frac = (var + 1) / 2
    model_logvar = frac * max_log + (1 - frac) * min_log
    e = eps.detach()  # the bound trains σ only
    x0_pred = (xt - at((1 - ac).sqrt(), t, xt) * e) / at(ac.sqrt(), t, xt)
    model_mean = at(coef1, t, xt) * x0_pred + at(coef2, t, xt) * xt
    true_mean = at(coef1, t, xt) * x0 + at(coef2, t, xt) * xt
    kl = normal_kl(true_mean, at(post_logvar, t, xt), model_mean, model_logvar).mean(dim=(1, 2, 3)) / math.log(2.0)
    nll = -discretized_ll(x0, model_mean, 0.5 * model_logvar).mean(dim=(1, 2, 3)) / math.log(2.0)
    vb = torch.where(t == 0, nll, kl)
    loss = (mse + vb).mean()
    if AUX:
        loss = loss + 0.01 * sum(AUX) / len(AUX)
    return loss


x0 = torch.randn(a.batch, CIN, SIZE, SIZE, device=DEV)
y = torch.randint(0, CLASSES, (a.batch,), device=DEV)


@torch.no_grad()
def sample_chain():  # DiT sample.py: z doubled, y_null = 1000, forward_with_cfg, DDIM η = 0 (respaced)
    n = int(a.chain[4:])
    use = list(range(0, T, T // n))[:n]  # space_timesteps(1000, "ddimN"): stride T / N
    acs = ac[use]
    acs_prev = torch.cat([torch.ones(1, dtype=torch.float64), acs[:-1]])
    z = torch.randn(a.batch, 4, 32, 32, device=DEV)
    yy = torch.cat([y, torch.full_like(y, 1000)])
    for i in reversed(range(n)):
        zz = torch.cat([z, z])
        tt = torch.full((2 * a.batch,), use[i], dtype=torch.long, device=DEV)
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            out = model(zz, tt, yy).float()
        eps, rest = out[:, :3], out[:, 3:]
        cond, uncond = eps.split(a.batch)
        half = uncond + a.cfg_scale * (cond - uncond)
        eps = torch.cat([torch.cat([half, half]), rest], 1)[: a.batch, :4]
        x0p = (z - (1 - acs[i]).sqrt().float() * eps) / acs[i].sqrt().float()
        z = acs_prev[i].sqrt().float() * x0p + (1 - acs_prev[i]).sqrt().float() * eps
    return z


if a.chain:
    model.eval()
    times = []
    for i in range(a.warmup + a.steps):
        sync()
        s = time.perf_counter()
        sample_chain()
        sync()
        if i >= a.warmup:
            times.append(time.perf_counter() - s)
    times.sort()
    print(json.dumps({"model": a.model, "batch": a.batch, "chain": a.chain, "step_s": times[len(times) // 2],
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "fused_attention": FUSED}))
    sys.exit(0)
times = []
for i in range(a.warmup + a.steps):
    sync()
    s = time.perf_counter()
    loss = training_loss(x0, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if ema is not None:
        update_ema()
    sync()
    if i >= a.warmup:
        times.append(time.perf_counter() - s)
times.sort()
print(json.dumps({"model": a.model, "batch": a.batch, "precision": a.precision, "step_s": times[len(times) // 2],
                  "img_per_s": a.batch / times[len(times) // 2], "device": a.device, "ema": a.ema,
                  "compiled": a.compile,
                  "torch": torch.__version__, "threads": torch.get_num_threads(), "fused_attention": FUSED,
                  "loss": float(loss.detach())}))
