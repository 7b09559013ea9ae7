#!/usr/bin/env python3
# usage: /usr/bin/python3 bench/pytorch_dit_step.py   (Debian python3-torch; not needed by the build or CI)
# PyTorch 1.13 (Debian) timing of a DiT-S/2 training step (batch 8, 32x32x4), same machine: forward + MSE on the
# 8-channel output + backward + AdamW, median of 3 after 1 warm-up. Reference implementation from make_torch.py.
import sys, time, torch
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "tests", "fixtures", "gen"))
from make_torch import DiT
torch.set_num_threads(2)
torch.manual_seed(0)
m = DiT(32, 2, 4, 384, 12, 1000, [6] * 12, 64)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0)
x = torch.randn(8, 4, 32, 32); t = torch.randint(0, 1000, (8,)); y = torch.randint(0, 1000, (8,))
ts = []
for i in range(4):
    s = time.perf_counter()
    out = m(x, t, y)
    loss = (out[:, :4] - x).square().mean() + out[:, 4:].square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    ts.append(time.perf_counter() - s)
print("torch", torch.__version__, "threads", torch.get_num_threads(), "DiT-S/2 step s", sorted(ts[1:])[1])
