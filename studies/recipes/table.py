#!/usr/bin/env python3
"""Markdown tables of studies/recipes/run.sh's rows.jsonl: FID against optimizer steps per recipe and model,
MoH against dense per recipe after the last step (paired by seed, with a 95 % t-interval over seeds and the goal's
verdict: within 5 % of dense FID is met when the interval's upper end is <= +5 %, not met when its lower end is > +5 %,
otherwise undecided), the fewest measured steps at which each recipe reaches the DDPM run's final FID (same model,
same seed), and, given the CFG_SWEEP rows (OUT/cfg_rows.jsonl), FID and sample accuracy against the guidance scale at
the last step (means over the seeds measured at every scale; the sweep's samples share each seed's noise). Rows
measured with different feature networks, reference statistics, machines or LibTorch builds are never compared: one
set of tables per such group, headed by its provenance.

    python3 studies/recipes/table.py ROWS.jsonl [CFG_ROWS.jsonl ...]
"""
import json
import os
import re
import statistics
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from provenance import mixed_devices_warning  # noqa: E402
from stats import interval  # noqa: E402
from stats import verdict as goal_verdict  # noqa: E402

GOAL = 5.0  # per cent: "MoH within 5 % of dense", the continue-tuning study's goal


def verdict(m, h):
    return goal_verdict(m, h, GOAL)

RECIPES = ["ddpm", "ddpm_ld", "flow", "flow_ld", "flow_repa", "flow_repa_ld"]
TITLES = {"ddpm": "DDPM", "ddpm_ld": "DDPM + LD block", "flow": "flow", "flow_ld": "flow + LD block",
          "flow_repa": "flow + REPA", "flow_repa_ld": "flow + REPA + LD block"}
MODELS = {"dit": "DiT", "moh": "MoH"}


def load(paths):
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in open(path) if line.strip()]
    return rows


def groups(rows):
    """rows grouped by what makes two FIDs comparable"""
    out = OrderedDict()
    for r in rows:
        key = (r["machine"], r["libtorch"], r["feature_sha256"], r["reference_sha256"], r["samples"])
        out.setdefault(key, []).append(r)
    return out


def fid_table(rows):
    """FID per (step, seed) row and (recipe, model) column"""
    cols = [(rc, m) for rc in RECIPES for m in MODELS if any(r["recipe"] == rc and r["model"] == m for r in rows)]
    fid = {(r["recipe"], r["model"], r["seed"], r["step"]): r["fid"] for r in rows}
    print("| optimizer steps | seed | " + " | ".join(f"{TITLES[rc]}: {MODELS[m]}" for rc, m in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for step, seed in sorted({(r["step"], r["seed"]) for r in rows}):
        cells = [fid.get((rc, m, seed, step)) for rc, m in cols]
        if all(c is None for c in cells):
            continue
        print(f"| {step} | {seed} | " + " | ".join("not run" if c is None else f"{c:.2f}" for c in cells) + " |")


def final_fids(rows, recipe, model):
    """{seed: FID at the recipe's last measured step} for runs that reached it"""
    mine = [r for r in rows if r["recipe"] == recipe and r["model"] == model]
    if not mine:
        return {}, None
    last = max(r["step"] for r in mine)
    return {r["seed"]: r["fid"] for r in mine if r["step"] == last}, last


def moh_vs_dense(rows):
    print("| recipe | step | seeds | DiT FID (mean) | MoH FID (mean) | MoH vs DiT per seed | mean [95 % interval] | "
          "within 5 % |")
    print("|---|---|---|---|---|---|---|---|")
    for rc in RECIPES:
        fid = {(r["model"], r["seed"], r["step"]): r["fid"] for r in rows if r["recipe"] == rc}
        both = [(st, sd) for m, sd, st in fid if m == "dit" and ("moh", sd, st) in fid]
        if not both:
            continue
        step = max(st for st, _ in both)  # the last step measured for both models
        seeds = sorted(sd for st, sd in both if st == step)
        dit = {sd: fid[("dit", sd, step)] for sd in seeds}
        moh = {sd: fid[("moh", sd, step)] for sd in seeds}
        rel = [100 * (moh[s] / dit[s] - 1) for s in seeds]
        m, h = interval(rel)
        spread = "n/a" if h is None else f"[{m - h:+.1f}, {m + h:+.1f}]"
        print(f"| {TITLES[rc]} | {step} | {', '.join(map(str, seeds))} | "
              f"{statistics.mean(dit[s] for s in seeds):.2f} | {statistics.mean(moh[s] for s in seeds):.2f} | "
              f"{', '.join(f'{x:+.1f} %' for x in rel)} | {m:+.1f} % {spread} | {verdict(m, h)} |")


def steps_to_ddpm(rows):
    """the first measured step at which a recipe's FID is at or below the DDPM run's final FID (same model, seed)"""
    lines = []
    for m in MODELS:
        ddpm, last = final_fids(rows, "ddpm", m)
        for rc in RECIPES[1:]:
            for seed in sorted(ddpm):
                mine = sorted((r["step"], r["fid"]) for r in rows
                              if r["recipe"] == rc and r["model"] == m and r["seed"] == seed)
                if not mine:
                    continue
                hit = next(((s, f) for s, f in mine if f <= ddpm[seed]), None)
                where = ("not reached by step %d" % mine[-1][0], "", "") if hit is None else \
                    (str(hit[0]), f"{hit[1]:.2f}", f"{hit[0] / last:.2f}")
                lines.append(f"| {TITLES[rc]} | {MODELS[m]} | {seed} | {ddpm[seed]:.2f} ({last}) | " +
                             " | ".join(where) + " |")
    if lines:
        print("| recipe | model | seed | DDPM final FID (step) | first step at or below it | its FID | "
              "fraction of DDPM steps |\n|---|---|---|---|---|---|---|")
        print("\n".join(lines) + "\n")


def is_sweep(r):
    """a CFG_SWEEP row (its id ends in _cfg<scale>), kept out of the FID-versus-steps tables"""
    return re.search(r"_cfg[0-9.]+$", r["id"]) is not None


def guidance(r):
    """the row's guidance scale: its cfg field, or the --cfg-scale of its sampler (rows written before the field)"""
    if "cfg" in r:
        return float(r["cfg"])
    return float(re.search(r"--cfg-scale ([0-9.]+)", r["sampler"]).group(1))


def cfg_table(rows):
    """FID / sample accuracy per guidance scale at the swept step; means over the seeds measured at every scale"""
    swept = sorted({(r["recipe"], r["model"], r["step"]) for r in rows if is_sweep(r)},
                   key=lambda k: (RECIPES.index(k[0]), list(MODELS).index(k[1])))
    if not swept:
        return
    scales = sorted({guidance(r) for r in rows if is_sweep(r)} | {4.0})
    print("| recipe | model | step | seeds | " + " | ".join(f"CFG {g:g}: FID / acc %" for g in scales) +
          " | lowest FID at |\n|---|---|---|---|" + "---|" * (len(scales) + 1))
    for rc, m, step in swept:
        mine = [r for r in rows if (r["recipe"], r["model"], r["step"]) == (rc, m, step)]
        at = {(r["seed"], guidance(r)): r for r in mine}
        seeds = sorted(sd for sd in {r["seed"] for r in mine} if all((sd, g) in at for g in scales))
        if not seeds:
            continue
        fid = {g: statistics.mean(at[(sd, g)]["fid"] for sd in seeds) for g in scales}
        acc = {g: statistics.mean(at[(sd, g)]["sample_acc"] for sd in seeds) for g in scales}
        print(f"| {TITLES[rc]} | {MODELS[m]} | {step} | {', '.join(map(str, seeds))} | " +
              " | ".join(f"{fid[g]:.2f} / {acc[g]:.1f}" for g in scales) + f" | {min(scales, key=fid.get):g} |")
    print()


def main(paths):
    for (machine, libtorch, features, reference, samples), rows in groups(load(paths)).items():
        print(f"### {machine}, {libtorch}; feature network {features[:8]}…, reference {reference[:8]}…, "
              f"{samples} samples\n")
        warning = mixed_devices_warning(rows)
        if warning:
            print(warning)
        steps = [r for r in rows if not is_sweep(r)]
        fid_table(steps)
        print()
        moh_vs_dense(steps)
        print()
        steps_to_ddpm(steps)
        cfg_table(rows)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: studies/recipes/table.py ROWS.jsonl [ROWS.jsonl ...]")
    main(sys.argv[1:])
