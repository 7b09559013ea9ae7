"""Forward + backward time of moh_torch's MoH attention against the official module's math in plain PyTorch, eager and
compiled (torch.compile, inductor), and of the fused DiT-block ops against their compiled plain composition — on this
machine, in rounds that interleave the candidates (each round times every candidate once; the median over rounds is
reported, with each round's ratio).

    .venv/bin/python bench/moh_torch_ops.py [--rounds 3] [--iters 20] [--threads 2] [--out FILE.jsonl]
        [--official PATH]   # a checkout of SkyworkAI/MoH: its MoH-DiT MoHAttention as the official module
        [--device cuda] [--dtype bf16]   # on a GPU (the GPU call, scripts/gpu_call.sh step ops)
        [--profile FILE.txt]   # instead: where the time of moh_torch's sparse MoH-DiT layer goes (torch.profiler)

Shapes: MoH-DiT-S/2-75's layers (384 wide, 6 heads of 64, 256 tokens; 2 shared + top-1 of 4 = 50 % active, and
3 shared + top-2 of 3 = 83 %), batch 8; MoH-ViT-S-75's stage 4 (576 wide, 24 heads of 24, 49 tokens, 4 shared + top-12
of 20 = 67 %, CPB bias) and stage 3's router and head gates (288 wide, 12 heads, 196 tokens, 3 shared + top-6 of 9),
batch 8. The MoH-DiT official module: its op sequence written out below (MoH-DiT models.py: three router products,
softmax, top-K, renormalisation, scaled_dot_product_attention, einsum gates), or the official file itself with
--official; the MoH-ViT ones: tests/fixtures/gen/transnext_torch.py (the official modules' math in plain PyTorch).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import moh_torch
from moh_torch import nn as mnn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gen"))
import transnext_torch  # noqa: E402  (MoH-ViT's official module math in plain PyTorch)


class OfficialMoHAttention(nn.Module):
    """The official MoH-DiT MoHAttention's op sequence (spec §1.3), for machines without the official checkout."""

    def __init__(self, dim, num_heads, shared_head, routed_head, head_dim):
        super().__init__()
        self.num_heads, self.head_dim, self.shared_head, self.routed_head = num_heads, head_dim, shared_head, routed_head
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim)
        self.proj = nn.Linear(num_heads * head_dim, dim)
        self.q_norm = self.k_norm = nn.Identity()
        self.proj_drop = nn.Dropout(0.0)
        if routed_head > 0:
            self.wg = nn.Linear(dim, num_heads - shared_head, bias=False)
            if shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False)

    def forward(self, x):
        B, N, C = x.shape
        xt = x.reshape(B * N, C)
        p = F.softmax(self.wg(xt), dim=1)
        mask = F.one_hot(torch.topk(p, k=self.routed_head, dim=1).indices, num_classes=p.shape[1]).sum(dim=1)
        if self.training:
            self.aux = torch.mean(p.mean(0) * mask.float().mean(0)) * p.shape[1] ** 2
        routed = p * mask
        routed = (routed / routed.sum(1, keepdim=True).clamp(min=torch.finfo(p.dtype).eps)).reshape(B, N, -1)
        routed = routed * self.routed_head
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        shared = F.softmax(self.wg_1(xt), dim=1).reshape(B, N, -1) * self.shared_head
        a = F.softmax(self.wg_0(xt), dim=1).reshape(B, N, 2) * 2
        gates = torch.cat([a[:, :, :1] * shared, a[:, :, 1:] * routed], dim=2)
        o = torch.einsum("bne,bned->bned", gates, o).reshape(B, N, -1)
        return self.proj_drop(self.proj(o))


def official_dit_attention(official_path, *args):
    if official_path is None:
        return OfficialMoHAttention(*args)
    sys.path.insert(0, os.path.join(official_path, "MoH-DiT"))
    from models import MoHAttention  # noqa: PLC0415  (the official file, run beside ours, never committed)

    dim, heads, shared, routed, head_dim = args
    return MoHAttention(dim, heads, qkv_bias=True, shared_head=shared, routed_head=routed, head_dim=head_dim)


DEVICE, DTYPE = "cpu", torch.float32


def step_fn(module, x):
    def step():
        module.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast(DEVICE, dtype=DTYPE, enabled=DTYPE != torch.float32):
            loss = module(x).float().square().mean()
        loss.backward()
    return step


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_once(step, iters):
    for _ in range(3):  # warm: a compiled module compiles on its first call and may once more on the next (guards)
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return (time.perf_counter() - t0) / iters


class WithGrid(nn.Module):
    """A MoH-ViT attention called as its block calls it: (x, H, W, relative_pos_index, relative_coords_table)."""

    def __init__(self, attn, side, pool):
        super().__init__()
        self.attn, self.side = attn, side
        table, index = transnext_torch.relative_position_cpb((side, side), (pool, pool), (side, side))
        self.register_buffer("table", table)
        self.register_buffer("index", index)

    def forward(self, x):
        return self.attn(x, self.side, self.side, self.index, self.table)


def attention_cases(official_path):
    """(name, official module, ours, input) per shape."""
    cases = []
    for name, (shared, routed) in (("MoH-DiT-S/2-75 layer, 50 % active", (2, 1)),
                                   ("MoH-DiT-S/2-75 layer, 83 % active", (3, 2))):
        torch.manual_seed(0)
        official = official_dit_attention(official_path, 384, 6, shared, routed, 64).train()
        official.to(DEVICE)
        ours = mnn.from_module(official).train()
        cases.append((name, official, ours, torch.randn(8, 256, 384, device=DEVICE, requires_grad=True)))
    torch.manual_seed(1)
    stage4 = transnext_torch.Attention(576, (7, 7), 24, shared=4, topk=12).train().to(DEVICE)
    cases.append(("MoH-ViT-S-75 stage 4 (full attention)", WithGrid(stage4, 7, 7).to(DEVICE),
                  WithGrid(mnn.from_module(stage4).train(), 7, 7).to(DEVICE),
                  torch.randn(8, 49, 576, device=DEVICE, requires_grad=True)))
    stage3 = transnext_torch.AggregatedAttention(288, (14, 14), 12, 2, shared=3, topk=6).train().to(DEVICE)
    cases.append(("MoH-ViT-S-75 stage 3 (aggregated: router, gates)", WithGrid(stage3, 14, 7).to(DEVICE),
                  WithGrid(mnn.from_module(stage3).train(), 14, 7).to(DEVICE),
                  torch.randn(8, 196, 288, device=DEVICE, requires_grad=True)))
    return cases


def block_cases():
    """(name, plain composition, fused op) for the DiT-block ops at DiT-S/2 shapes (batch 8, 256 tokens, 384)."""
    x = torch.randn(8, 256, 384, device=DEVICE, dtype=DTYPE, requires_grad=True)
    mod = torch.randn(8, 6 * 384, device=DEVICE, dtype=DTYPE, requires_grad=True)
    z = torch.randn(8, 256, 1536, device=DEVICE, dtype=DTYPE, requires_grad=True)
    b = torch.randn(1536, device=DEVICE, dtype=DTYPE, requires_grad=True)
    # gate_residual's branch: a projection's output in the block, a tensor of its own (a slice of z would time the
    # zero-filled gradient of the rest of z, which inductor fuses and an eager op cannot).
    y = torch.randn(8, 256, 384, device=DEVICE, dtype=DTYPE, requires_grad=True)
    shift, scale, gate = mod[:, :384], mod[:, 384:768], mod[:, 768:1152]
    return [
        ("ln_modulate", lambda: F.layer_norm(x, (384,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None],
         lambda: moh_torch.functional.ln_modulate(x, shift, scale), (x, mod)),
        ("gate_residual", lambda: x + gate[:, None] * y,
         lambda: moh_torch.functional.gate_residual(x, gate, y), (x, mod, y)),
        ("bias_gelu", lambda: F.gelu(z + b, approximate="tanh"), lambda: moh_torch.functional.bias_gelu(z, b), (z, b)),
    ]


def fn_step(fn, inputs):
    def step():
        for t in inputs:
            t.grad = None
        fn().float().square().mean().backward()
    return step


def profile_sparse_layer(path, iters):
    """torch.profiler's table of moh_torch's eager MoH-DiT-S/2-75 layer at 50 % active (the sparse path), forward and
    backward, by ATen operator and by share of the CPU time."""
    name, _, ours, x = attention_cases(None)[0]
    step = step_fn(ours, x)
    time_once(step, 2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    with open(path, "w") as f:
        f.write(f"# {name}, moh_torch eager, batch 8, {iters} steps, torch {torch.__version__}, "
                f"{torch.get_num_threads()} threads\n{table}\n")
    print(table)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--official", default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--profile", default="")
    ap.add_argument("--cases", default="attention,blocks",
                    help="which groups to time: attention (the MoH layers), blocks (the DiT-block ops), or both")
    a = ap.parse_args()
    global DEVICE, DTYPE
    DEVICE, DTYPE = a.device, {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    torch.set_num_threads(a.threads)
    if a.profile:
        return profile_sparse_layer(a.profile, a.iters)
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    if DEVICE == "cuda":
        cpu = torch.cuda.get_device_name()
    rows = []
    candidates = []
    groups = set(a.cases.split(","))
    for name, official, ours, x in attention_cases(a.official) if "attention" in groups else []:
        candidates += [(name, "official eager", step_fn(official, x)),
                       (name, "official compiled", step_fn(torch.compile(official), x)),
                       (name, "moh_torch eager", step_fn(ours, x)),
                       (name, "moh_torch compiled", step_fn(torch.compile(ours), x))]
    for name, plain, fused, inputs in block_cases() if "blocks" in groups else []:
        candidates += [(name, "plain compiled", fn_step(torch.compile(plain), inputs)),
                       (name, "moh_torch op", fn_step(fused, inputs))]
    times = {(n, c): [] for n, c, _ in candidates}
    for r in range(a.rounds):
        for name, cand, step in candidates:
            times[(name, cand)].append(time_once(step, a.iters) * 1e3)
            print(f"round {r + 1} {name} | {cand}: {times[(name, cand)][-1]:.2f} ms", file=sys.stderr)
    for (name, cand), ms in times.items():
        rows.append({"case": name, "candidate": cand, "ms": ms, "median_ms": statistics.median(ms), "host": cpu,
                     "device": DEVICE, "dtype": a.dtype, "threads": a.threads, "torch": torch.__version__,
                     "iters": a.iters,
                     "official": a.official or "op sequence (bench/moh_torch_ops.py)"})
        print(f"{name:38s} {cand:34s} median {statistics.median(ms):8.2f} ms  rounds {[round(m, 2) for m in ms]}")
    if a.out:
        with open(a.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
