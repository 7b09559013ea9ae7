#!/usr/bin/env python3
"""The CPU training steps against the machine's roofline and against the official PyTorch code, eager and compiled.

For each row (model, batch, input size): the step of `moh bench train --json --profile` on the Debian build
(`build/moh`, LibTorch 1.13) and on the pip build (`build-torch2/moh`, LibTorch 2.14.1) — its time, its FLOPs (ATen's
RecordFunction hooks, the attention core counted as its model products on every path, so both builds count alike),
the share of the measured fp32 GEMM peak and its time by class — beside the official-structure PyTorch step
(bench/pytorch_moh_dit_step.py, bench/pytorch_moh_vit_step.py, the venv's torch) eager and under torch.compile, all
interleaved: every round runs every case of every row once. The machine's ceilings come first (`moh bench kernels
--ops peak`: a 2048³ product in fp32 / bf16, a 256 MiB copy). One JSON line per measurement to --out; a Markdown table
of medians to stdout.

    .venv/bin/python bench/roofline.py [--rounds 3] [--rows REGEX] [--threads 0] [--out FILE] [--no-compile]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ROWS = [  # (model, batch, input size for moh (0: the variant's), the official script)
    ("DiT-S/2", 8, 32, "dit"),
    ("MoH-DiT-S/2-90", 8, 32, "dit"),
    ("MoH-ViT-S-75", 4, 224, "vit"),
    ("DiT-Pixel/2", 32, 0, "dit"),
    ("MoH-DiT-Pixel/2-75", 32, 0, "dit"),
    ("MoH-ViT-Nano", 64, 0, "vit"),
]
BUILDS = [("1.13", "build/moh"), ("2.14.1", "build-torch2/moh")]


def run_json(cmd, env=None):
    """The last line of a command's stdout that parses as JSON (a list or an object)."""
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    for line in reversed(out.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    text = out.strip()
    return json.loads(text[text.index("["):]) if "[" in text else None


def moh_step(binary, model, batch, size, threads):
    cmd = [binary, "bench", "train", "--model", model, "--batch", str(batch), "--precision", "fp32", "--steps", "3",
           "--warmup", "1", "--profile", "12", "--json"]
    if size:
        cmd += ["--img-size", str(size)]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    r = run_json(cmd, env)
    return r[0] if isinstance(r, list) else r


def official_step(script, model, batch, size, threads, compiled):
    path = "bench/pytorch_moh_dit_step.py" if script == "dit" else "bench/pytorch_moh_vit_step.py"
    cmd = [sys.executable, path, "--model", model, "--batch", str(batch), "--steps", "3", "--warmup", "2" if compiled
           else "1"]
    if script == "vit" and size:
        cmd += ["--img-size", str(size)]
    if threads:
        cmd += ["--threads", str(threads)]
    if compiled:
        cmd.append("--compile")
    return run_json(cmd)


def peaks(binary, threads):
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [binary, "bench", "kernels", "--ops", "peak", "--dtypes", "fp32,bf16", "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    return run_json(cmd, env)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", default=".", help="regex over the model names")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads of every side (0: each one's default)")
    p.add_argument("--out", default="")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases")
    a = p.parse_args()
    date = datetime.date.today().isoformat()
    out = open(a.out or os.path.join(ROOT, "docs/results/roofline", f"rows_{date}.jsonl"), "a")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    builds = [(lib, b) for lib, b in BUILDS if os.access(os.path.join(ROOT, b), os.X_OK)]

    def emit(rec):
        rec.update(date=date, cpu=cpu, threads=a.threads)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        return rec

    ceilings = {lib: [emit({"kind": "peak", "libtorch": lib, **r}) for r in peaks(b, a.threads)] for lib, b in builds}
    rows = [r for r in ROWS if re.search(a.rows, r[0])]
    got = {}
    for rnd in range(1, a.rounds + 1):
        for model, batch, size, script in rows:
            cases = [(lib, lambda b=b: moh_step(b, model, batch, size, a.threads)) for lib, b in builds]
            cases.append(("eager", lambda: official_step(script, model, batch, size, a.threads, False)))
            if not a.no_compile:
                cases.append(("compiled", lambda: official_step(script, model, batch, size, a.threads, True)))
            for side, fn in cases:
                r = emit({"kind": "step", "model": model, "batch": batch, "size": size, "side": side, "round": rnd,
                          **fn()})
                got.setdefault((model, side), []).append(r)
                print(f"round {rnd} {model} {side}: {r['step_s']:.3f} s", file=sys.stderr, flush=True)
    table(rows, builds, ceilings, got)


def table(rows, builds, ceilings, got):
    for lib, cs in ceilings.items():
        print(f"LibTorch {lib}: " + ", ".join(f"{c['shape']} {c['dtype']} {c['rate']:.1f} {c['unit']}" for c in cs))
    print("\n| model, batch | side | step s (rounds) | GFLOP / step | share of the fp32 GEMM peak | time by class "
          "| official eager / moh | compiled / moh |")
    print("|---|---|---|---|---|---|---|---|")
    for model, batch, _, _ in rows:
        eager = statistics.median(r["step_s"] for r in got.get((model, "eager"), [{"step_s": float("nan")}]))
        comp = got.get((model, "compiled"))
        comp = statistics.median(r["step_s"] for r in comp) if comp else float("nan")
        for lib, _ in builds:
            rs = got.get((model, lib), [])
            if not rs:
                continue
            step = statistics.median(r["step_s"] for r in rs)
            flops = rs[0]["fwd_gflops_per_img"] * 3 * batch  # forward + backward
            mfu = statistics.median(r["mfu"] for r in rs)
            prof = rs[-1].get("profile", {}).get("classes_ms", {})
            total = sum(prof.values()) or 1
            classes = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in sorted(prof.items(), key=lambda kv: -kv[1])
                                if v / total >= 0.03)
            rounds = " / ".join(f"{r['step_s']:.3f}" for r in rs)
            print(f"| {model}, {batch} | moh {lib} | {rounds} | {flops:.2f} | {100 * mfu:.0f} % | {classes} "
                  f"| {eager / step:.2f} | {comp / step:.2f} |")
        print(f"| {model}, {batch} | official eager / compiled | {eager:.3f} / {comp:.3f} | | | | | |")


if __name__ == "__main__":
    main()
