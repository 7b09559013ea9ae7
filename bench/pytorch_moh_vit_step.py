#!/usr/bin/env python3
# The official MoH-ViT / TransNeXt training step in plain PyTorch, for `bench/compare_python.sh`: the reference model
# of tests/fixtures/gen/transnext_torch.py (official module structure and names, native unfold aggregated attention,
# every head computed and then weighted by its gate; checked against `moh forward` by the pyref_forward test), the
# MoH-ViT engine.py loss (cross-entropy, here with label smoothing 0.1 on hard labels, + 0.01 · mean over routed
# layers of the load-balance loss), AdamW (lr 1e-3, weight decay 0.05), grad-norm clip 1.0,
# zero_grad / backward / clip / step. Same work as `moh bench train --model MoH-ViT-S-75 --batch 4 --img-size 224`.
# usage: .venv/bin/python bench/pytorch_moh_vit_step.py [--model MoH-ViT-S-75] [--batch 4] [--img-size 224]
#        [--steps 3] [--warmup 1] [--threads N] [--precision fp32|bf16] [--compile]
#        prints one JSON line {"step_s": ...}
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gen"))
import transnext_torch as ref  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", default="MoH-ViT-S-75", choices=sorted(ref.VARIANTS))
p.add_argument("--batch", type=int, default=4)
p.add_argument("--img-size", type=int, default=0, help="0 = the variant's own (224; 32 for the Nano models)")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--threads", type=int, default=0,
               help="intra-op threads (0: torch's own default, as the official code runs; see pytorch_moh_dit_step.py)")
p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
p.add_argument("--compile", action="store_true",
               help="model = torch.compile(model) (inductor, its defaults): what a PyTorch user gets for one line")
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)

v = ref.VARIANTS[a.model]
size = a.img_size or v["img_size"]
model = ref.TransNeXt(v, img_size=size).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
params = list(model.parameters())
if a.compile:
    model = torch.compile(model)
x = torch.randn(a.batch, v["in_chans"], size, size)
y = torch.randint(0, v["num_classes"], (a.batch,))


def step():
    ref.AUX.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y, label_smoothing=0.1)
    if ref.AUX:
        loss = loss + 0.01 * sum(ref.AUX) / len(ref.AUX)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss


times = []
for i in range(a.warmup + a.steps):
    s = time.perf_counter()
    loss = step()
    if i >= a.warmup:
        times.append(time.perf_counter() - s)
times.sort()
print(json.dumps({"model": a.model, "batch": a.batch, "img_size": size, "precision": a.precision, "compiled": a.compile,
                  "step_s": times[len(times) // 2], "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "loss": float(loss.detach())}))
