#!/usr/bin/env python3
"""Markdown tables of studies/continue_tuning/run.sh's rows.jsonl: per part (cls, dit), per model (dense,
scratch, router/shared-choice) and extra steps, the mean ± std over seeds of each metric and of its difference to the
same seed's dense model (each seed converts its own dense model), with the seed count.

    python3 studies/continue_tuning/table.py docs/results/continue_tuning/rows.jsonl
"""
import json
import statistics
import sys
from collections import OrderedDict

METRICS = {"cls": [("top1", "top-1 %")], "dit": [("fid", "FID"), ("sample_acc", "sample acc. %"),
                                                  ("final_loss", "final loss")]}
TITLES = {"cls": "Classifier: ViT-Nano → MoH-ViT-Nano-75", "dit": "Diffusion: DiT-Pixel/4 → MoH-DiT-Pixel/4-75"}


def cell(values):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def delta(row, dense, key):
    base = dense.get(row["seed"], {}).get(key)
    return None if base is None or row.get(key) is None or row["what"] == "dense" else row[key] - base


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for part in ("cls", "dit"):
        groups = OrderedDict()
        for r in rows:
            if r["part"] == part:
                groups.setdefault((r["what"], r["extra_steps"]), []).append(r)
        if not groups:
            continue
        dense = {r["seed"]: r for r in rows if r["part"] == part and r["what"] == "dense"}
        names = [label for _, label in METRICS[part]]
        names += ["Δ " + label + " vs dense" for _, label in METRICS[part]]
        print(f"### {TITLES[part]}\n")
        print("| model | extra steps | " + " | ".join(names) + " | seeds |")
        print("|---|---:|" + "---:|" * len(names) + "---:|")
        order = sorted(groups, key=lambda k: (k[0] not in ("dense", "scratch"), k[0], k[1]))
        for what, steps in order:
            g = groups[(what, steps)]
            cells = [cell([r.get(key) for r in g]) for key, _ in METRICS[part]]
            cells += [cell([delta(r, dense, key) for r in g]) for key, _ in METRICS[part]]
            print(f"| {what} | {steps} | " + " | ".join(cells) + f" | {len(g)} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
