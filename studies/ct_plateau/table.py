#!/usr/bin/env python3
"""Markdown tables of studies/ct_plateau/run.sh's OUT: the dense models' plateau checks, and each continue-tuned
(or from-scratch) MoH-DiT against its own seed's dense parent as paired relative differences with a 95 % t-interval
over seeds, with the goal's verdict (within 5 % of dense FID: met when the interval's upper end is <= +5 %, not met
when its lower end is > +5 %, otherwise undecided), and continue-tuning against MoH from scratch at the same total
steps. Rows of different labels (machines) are never mixed: one set of tables per label.

    .venv/bin/python studies/ct_plateau/table.py OUT     (the tables: scipy, studies/stats.py)
    python3 studies/ct_plateau/table.py --decide OUT SEED MAX_EPOCHS   (the stop rule: go, plateau or max_epochs)
"""
import json
import math
import os
import statistics
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from provenance import mixed_devices_warning  # noqa: E402
from stats import fmt, interval  # noqa: E402
from stats import verdict as goal_verdict  # noqa: E402

GOAL = 5.0  # per cent above dense FID


def load(path):
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except FileNotFoundError:
        return []


def verdict(m, h):
    """the study's goal: within GOAL per cent of the dense parent's FID"""
    return goal_verdict(m, h, GOAL)


def decide(checks, max_epochs):
    """The dense run's stop rule from its checks (FID on two sample sets after each segment): plateau when the last
    improvement of the two-set mean is below 2 sigma, sigma pooled from the two-set spreads of every check (the
    difference of two such means has the spread of one set); max_epochs at the cap; otherwise go."""
    checks = sorted(checks, key=lambda r: r["epoch"])
    if len(checks) >= 2:
        sigma = math.sqrt(sum((r["fid_a"] - r["fid_b"]) ** 2 / 2 for r in checks) / len(checks))
        prev, now = [(r["fid_a"] + r["fid_b"]) / 2 for r in checks[-2:]]
        if prev - now < 2 * sigma:
            return "plateau"
    return "max_epochs" if checks and checks[-1]["epoch"] >= max_epochs else "go"


def checks_table(checks):
    print("| seed | epoch | step | FID set a | FID set b | mean |\n|---:|---:|---:|---:|---:|---:|")
    for r in sorted(checks, key=lambda r: (r["seed"], r["epoch"])):
        print(f"| {r['seed']} | {r['epoch']} | {r['step']} | {r['fid_a']:.2f} | {r['fid_b']:.2f} "
              f"| {(r['fid_a'] + r['fid_b']) / 2:.2f} |")
    print()


def setting(r):
    return ("scratch", "", r["pct"]) if r["what"] == "scratch" else (r["router"], r["choice"], r["pct"])


def paired_table(rows):
    dense = {r["seed"]: r for r in rows if r["what"] == "dense"}
    print("| seed | dense steps | stopped by | dense FID |\n|---:|---:|---|---:|")
    for s, r in sorted(dense.items()):
        print(f"| {s} | {r['dense_steps']} | {r['dense_stop']} | {r['fid']:.2f} |")
    print()
    early = sorted(s for s, r in dense.items() if r["dense_stop"] != "plateau")
    if early:
        print(f"**Seeds {', '.join(map(str, early))}: the dense parent stopped before its plateau** (by "
              f"{', '.join(sorted({dense[s]['dense_stop'] for s in early}))}): the verdicts below compare with a dense "
              "model that was still improving, not with a converged one.\n")
    groups = OrderedDict()
    for r in sorted((r for r in rows if r["what"] != "dense" and r["seed"] in dense), key=setting):
        groups.setdefault(setting(r), []).append(r)
    print("| model | steps (% of dense) | mean FID | Δ FID vs own dense, 95 % interval | Δ % vs own dense, 95 % "
          "interval | within 5 % of dense | seeds |\n|---|---:|---:|---:|---:|---|---:|")
    for (router, choice, pct), g in groups.items():
        name = "MoH from scratch" if router == "scratch" else f"converted: {router} / {choice}"
        total = pct if router == "scratch" else 100 + pct
        d_abs = [r["fid"] - dense[r["seed"]]["fid"] for r in g]
        d_rel = [100 * (r["fid"] / dense[r["seed"]]["fid"] - 1) for r in g]
        m, h = interval(d_rel)
        print(f"| {name} | {total} | {statistics.mean(r['fid'] for r in g):.2f} | {fmt(*interval(d_abs))} "
              f"| {fmt(m, h, ' %')} | {verdict(m, h)} | {len(g)} |")
    print()
    scratch = {(r["seed"], r["pct"] - 100): r for r in rows if r["what"] == "scratch"}
    print("| converted model | extra steps | Δ FID vs MoH from scratch at the same total steps, 95 % interval | seeds |"
          "\n|---|---:|---:|---:|")
    for (router, choice, pct), g in groups.items():
        if router == "scratch":
            continue
        d = [r["fid"] - scratch[(r["seed"], pct)]["fid"] for r in g if (r["seed"], pct) in scratch]
        if d:
            print(f"| {router} / {choice} | {pct} % | {fmt(*interval(d))} | {len(d)} |")
    print()


def main(out):
    rows, checks = load(out + "/rows.jsonl"), load(out + "/checks.jsonl")
    for label in sorted({r["label"] for r in rows + checks}):
        mine = [r for r in rows if r["label"] == label]
        first = (mine or checks)[0]
        print(f"### {label}: {first['machine']}, {first['libtorch']}; sampler {first['sampler']}; "
              f"feature network {first['feature_sha256'][:12]}…, reference {first['reference_sha256'][:12]}…\n")
        warning = mixed_devices_warning(mine + [r for r in checks if r["label"] == label])
        if warning:
            print(warning)
        print("Plateau checks of the dense parents (FID on two sample sets each):\n")
        checks_table([r for r in checks if r["label"] == label])
        if mine:
            paired_table(mine)


if __name__ == "__main__":
    if sys.argv[1] == "--decide":
        seed = int(sys.argv[3])
        print(decide([r for r in load(sys.argv[2] + "/checks.jsonl") if r["seed"] == seed], int(sys.argv[4])))
    else:
        main(sys.argv[1])
