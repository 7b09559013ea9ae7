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
        [--sample ddim10 [--no-train]]   # the sampling chain (CFG 4) of the latent DiT rows beside, or alone
    .venv/bin/python bench/roofline.py --from RUN.jsonl [--summary SUMMARY.jsonl]   # the tables of a finished run
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


def moh_chain(binary, model, batch, chain, threads):
    """`moh bench sample`: one whole class-conditional DDIM chain with CFG 4 (each step a forward of the doubled
    batch), as DiT's sample.py runs it."""
    cmd = [binary, "bench", "sample", "--model", model, "--batch", str(batch), "--precision", "fp32", "--chain", chain,
           "--cfg-scale", "4", "--steps", "3", "--warmup", "1", "--json"]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return run_json(cmd, env)


def official_chain(model, batch, chain, threads, compiled):
    cmd = [sys.executable, "bench/pytorch_moh_dit_step.py", "--model", model, "--batch", str(batch), "--chain", chain,
           "--steps", "3", "--warmup", "2" if compiled else "1"]
    if threads:
        cmd += ["--threads", str(threads)]
    if compiled:
        cmd.append("--compile")
    return run_json(cmd)


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
    p.add_argument("--sample", default="", metavar="ddimN",
                   help="also the sampling chain (CFG 4, the doubled batch) of the latent DiT rows, e.g. ddim10")
    p.add_argument("--no-train", action="store_true", help="only the sampling chains (with --sample)")
    p.add_argument("--from", dest="from_file", default="", metavar="FILE.jsonl",
                   help="measure nothing: the tables of a finished run's records")
    p.add_argument("--summary", default="", help="with --from: write the medians and ratios the tables show here")
    a = p.parse_args()
    if a.from_file:
        return from_file(a.from_file, a.summary)
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
    got, chains = {}, {}
    for rnd in range(1, a.rounds + 1):
        for model, batch, size, script in rows:
            for kind, side, fn in cases(a, builds, model, batch, size, script):
                r = emit({"kind": kind, "model": model, "batch": batch, "size": size, "side": side, "round": rnd,
                          **fn()})
                (got if kind == "step" else chains).setdefault((model, side), []).append(r)
                print(f"round {rnd} {model} {kind} {side}: {r['step_s']:.3f} s", file=sys.stderr, flush=True)
    summary = summarise(rows, builds, ceilings, got, chains)
    if got:
        table(ceilings, summary)
    if chains:
        chain_table(summary, a.sample)


def cases(a, builds, model, batch, size, script):
    """(kind, side, run) of one row in one round: its training steps, then (--sample, latent DiT rows) its chains."""
    out = []
    if not a.no_train:
        out += [("step", lib, lambda b=b: moh_step(b, model, batch, size, a.threads)) for lib, b in builds]
        out.append(("step", "eager", lambda: official_step(script, model, batch, size, a.threads, False)))
        if not a.no_compile:
            out.append(("step", "compiled", lambda: official_step(script, model, batch, size, a.threads, True)))
    if a.sample and script == "dit" and size == 32:  # the official chain is written for 32×32×4 latents
        out += [("sample", lib, lambda b=b: moh_chain(b, model, batch, a.sample, a.threads)) for lib, b in builds]
        out.append(("sample", "eager", lambda: official_chain(model, batch, a.sample, a.threads, False)))
        if not a.no_compile:
            out.append(("sample", "compiled", lambda: official_chain(model, batch, a.sample, a.threads, True)))
    return out


def chain_table(rows, builds, chains, chain):
    print(f"\n| model, batch ({chain}, CFG 4) | side | chain s (rounds) | official eager / moh | compiled / moh |")
    print("|---|---|---|---|---|")
    for model, batch, _, _ in rows:
        if (model, "eager") not in chains:
            continue
        eager = statistics.median(r["step_s"] for r in chains[(model, "eager")])
        comp = chains.get((model, "compiled"))
        comp = statistics.median(r["step_s"] for r in comp) if comp else float("nan")
        for lib, _ in builds:
            rs = chains.get((model, lib), [])
            if rs:
                step = statistics.median(r["step_s"] for r in rs)
                rounds = " / ".join(f"{r['step_s']:.3f}" for r in rs)
                print(f"| {model}, {batch} | moh {lib} | {rounds} | {eager / step:.2f} | {comp / step:.2f} |")
        print(f"| {model}, {batch} | official eager / compiled | {eager:.3f} / {comp:.3f} | | |")


def summarise(rows, builds, ceilings, got, chains):
    """One record per (row, side): the medians over the rounds and what the tables show, derived from the raw records
    (the share of the fp32 GEMM peak against the ceiling of the same LibTorch measured at the start of the run)."""
    out = []
    peak = {lib: next((c["rate"] for c in cs if c["unit"] == "GFLOP/s" and c["dtype"] == "fp32"), float("nan"))
            for lib, cs in ceilings.items()}
    for kind, recs in (("step", got), ("sample", chains)):
        for model, batch, _, _ in rows:
            ref = {side: med(recs.get((model, side))) for side in ("eager", "compiled")}
            for lib, _ in builds:
                rs = recs.get((model, lib))
                if not rs:
                    continue
                rec = {"kind": f"{kind}_summary", "model": model, "batch": batch, "side": lib, "rounds": len(rs),
                       "step_s_median": med(rs), "official_eager_s": ref["eager"],
                       "official_compiled_s": ref["compiled"], "eager_over_moh": ref["eager"] / med(rs),
                       "compiled_over_moh": ref["compiled"] / med(rs)}
                if kind == "step":
                    gflops = rs[0]["step_gflops_counted"]
                    prof = rs[-1].get("profile", {}).get("classes_ms", {})
                    total = sum(prof.values()) or 1
                    rec.update(gflop_per_step=gflops, gflop_per_s=gflops / med(rs), peak_gflop_per_s=peak.get(lib),
                               share_of_peak=gflops / med(rs) / peak.get(lib, float("nan")),
                               classes_percent={k: round(100 * v / total) for k, v in prof.items()})
                out.append(rec)
    return out


def med(recs):
    return statistics.median(r["step_s"] for r in recs) if recs else float("nan")


def table(ceilings, summary):
    for lib, cs in ceilings.items():
        print(f"LibTorch {lib}: " + ", ".join(f"{c['shape']} {c['dtype']} {c['rate']:.1f} {c['unit']}" for c in cs))
    print("\n| model, batch | LibTorch | step s | GFLOP / step | GFLOP/s | peak GFLOP/s | share of the peak "
          "| time by class | official eager / compiled s | eager / moh | compiled / moh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in (r for r in summary if r["kind"] == "step_summary"):
        classes = ", ".join(f"{k} {v} %" for k, v in sorted(r["classes_percent"].items(), key=lambda kv: -kv[1])
                            if v >= 3)
        print(f"| {r['model']}, {r['batch']} | {r['side']} | {r['step_s_median']:.3f} | {r['gflop_per_step']:.1f} "
              f"| {r['gflop_per_s']:.1f} | {r['peak_gflop_per_s']:.1f} | {r['share_of_peak']:.2f} | {classes} "
              f"| {r['official_eager_s']:.3f} / {r['official_compiled_s']:.3f} | {r['eager_over_moh']:.2f} "
              f"| {r['compiled_over_moh']:.2f} |")


def chain_table(summary, chain):
    print(f"\n| model, batch ({chain}, CFG 4) | LibTorch | chain s | official eager / compiled s | eager / moh "
          "| compiled / moh |")
    print("|---|---|---|---|---|---|")
    for r in (r for r in summary if r["kind"] == "sample_summary"):
        print(f"| {r['model']}, {r['batch']} | {r['side']} | {r['step_s_median']:.3f} "
              f"| {r['official_eager_s']:.3f} / {r['official_compiled_s']:.3f} | {r['eager_over_moh']:.2f} "
              f"| {r['compiled_over_moh']:.2f} |")


def from_file(path, summary_path):
    """The tables of a finished run (its JSONL), and its summary records to summary_path."""
    recs = [json.loads(line) for line in open(path)]
    ceilings, got, chains = {}, {}, {}
    for r in recs:
        if r["kind"] == "peak":
            ceilings.setdefault(r["libtorch"], []).append(r)
        elif r["kind"] in ("step", "sample"):
            (got if r["kind"] == "step" else chains).setdefault((r["model"], r["side"]), []).append(r)
    rows = [row for row in ROWS if any(k[0] == row[0] for k in list(got) + list(chains))]
    builds = [(lib, b) for lib, b in BUILDS]
    summary = summarise(rows, builds, ceilings, got, chains)
    if summary_path:
        with open(summary_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in summary)
    if got:
        table(ceilings, summary)
    if chains:
        chain_table(summary, next(iter(chains.values()))[0].get("chain", "chain"))


if __name__ == "__main__":
    main()
