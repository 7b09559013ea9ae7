#!/usr/bin/env python3
"""The GPU call in one page: reads the rows scripts/gpu_call.sh wrote (rows.jsonl) and prints Markdown — the parity
tests, torch.ops.moh, the command line end to end, the step's device time by op class with the fused block off and
on, MoH against DiT, the best batch, ours against the official-structure step, the classifier, then every other
step's rows — and the targets, met or not, each with the rows it comes from. Standard library only (the GPU
machine's python3 is enough).
  usage: bench/gpu_summary.py rows.jsonl > summary.md"""
import json
import statistics
import sys

CLASSES = ["gemm", "attention", "elementwise", "copies", "router", "optimizer", "ema"]


def rows_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def part(rows, name):
    return [r for r in rows if r.get("part") == name]


def fmt(v, digits=3):
    return "–" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def verdict(value, goal, higher=True):
    if value is None:
        return "not measured"
    return "met" if (value >= goal if higher else value <= goal) else "not met"


def profile_table(rows):
    out = ["| model | fused | img/s | MFU | " + " · ".join(CLASSES) + " (ms) | (elementwise + copies) / GEMM |",
           "|---|---|---|---|---|---|"]
    ratios = {}
    for r in rows:
        ms = r.get("profile", {}).get("classes_ms", {})
        gemm = ms.get("gemm") or None
        ratio = (ms.get("elementwise", 0) + ms.get("copies", 0)) / gemm if gemm else None
        ratios[(r["model"], r["fused"])] = ratio
        cells = " · ".join(fmt(ms.get(c), 3) for c in CLASSES)
        out.append(f"| {r['model']} | {r['fused']} | {fmt(r['img_per_s'], 4)} | {fmt(r.get('mfu'), 3)} | {cells} | "
                   f"{fmt(ratio, 3)} |")
    return out, ratios


def moh_ratios(rows):
    """Per round: images/s of each model, and each MoH model / the dense one of the same round."""
    rounds, models = {}, []
    for r in rows:
        rounds.setdefault(r["label"].rsplit("_r", 1)[1], {})[r["model"]] = r["img_per_s"]
        if r["model"] not in models:
            models.append(r["model"])
    dense = next((m for m in models if not m.startswith("MoH")), None)
    out = ["| round | " + " | ".join(models) + " | MoH / dense |", "|---|" + "---|" * (len(models) + 1)]
    ratios = {}
    for k, row in sorted(rounds.items()):
        rel = {m: v / row[dense] for m, v in row.items() if m != dense and dense in row}
        for m, v in rel.items():
            ratios.setdefault(m, []).append(v)
        out.append(f"| {k} | " + " | ".join(fmt(row.get(m), 4) for m in models) + " | " +
                   ", ".join(f"{m}: {v:.3f}" for m, v in rel.items()) + " |")
    return out, ratios


def official_ratios(rows):
    ours = {r["label"].split("_r")[1]: r["img_per_s"] for r in rows if r["label"].startswith("ours")}
    theirs = {r["label"].split("_r")[1]: r["img_per_s"] for r in rows if r["label"].startswith("pytorch")}
    return [ours[k] / theirs[k] for k in sorted(ours) if k in theirs]


def ops_lines(rows):
    """torch.ops.moh on the device: the package's tests, and each case's median ms per candidate."""
    tests = [r for r in rows if r.get("what") == "ops_tests"]
    bench = [r for r in rows if r.get("what") == "ops_bench"]
    if not tests and not bench:
        return []
    out = ["## torch.ops.moh (moh_torch) on the device", ""]
    for t in tests:
        out += [f"python/tests/test_ops.py on {t['device']}: {t['ran']} tests, exit {t['exit']}"
                + (", failed: " + ", ".join(t["failed"]) if t["failed"] else "") + ".", ""]
    if bench:
        out += ["| case | candidate | median ms |", "|---|---|---|"]
        out += [f"| {r['case']} | {r['candidate']} | {fmt(r['median_ms'], 4)} |" for r in bench] + [""]
    return out


def other_lines(rows):
    """The steps without a section of their own: one table row per measurement, its label and headline numbers."""
    keys = ["ok", "tests", "failed", "model", "batch", "precision", "img_per_s", "mfu", "step_ms", "ms_per_image"]
    out = []
    for name in ("build", "cli", "router", "sample", "precision", "attention", "tests"):
        rs = part(rows, name)
        if not rs:
            continue
        out += [f"## {name}", "", "| label | " + " | ".join(keys) + " | other keys |", "|---|" + "---|" * (len(keys) + 1)]
        for r in rs:
            rest = sorted(k for k in r if k not in keys and k not in ("part", "label"))
            out.append(f"| {r['label']} | " + " | ".join(fmt(r.get(k)) if k in r else "" for k in keys) + " | "
                       + ", ".join(rest[:8]) + " |")
        out.append("")
    return out


def main():
    rows = rows_of(sys.argv[1])
    out = ["# The GPU call", ""]
    dev = next((m.get("gpu") if isinstance(m := r.get("machine"), dict) else None) or r.get("device")
               for r in rows if r.get("device")) if any(r.get("device") for r in rows) else "?"
    lib = next((r.get("libtorch") for r in rows if r.get("libtorch")), "?")
    commit = next((r["machine"].get("commit") for r in rows if isinstance(r.get("machine"), dict)), "?")
    out += [f"Device {dev}, LibTorch {lib}, commit {commit}; rows: rows.jsonl (scripts/gpu_call.sh).", ""]
    par = part(rows, "parity")
    if par:
        p = par[-1]
        out += [f"Parity tests on {p['device']}: {p['tests']} run, {p['failures']} failed"
                + (": " + ", ".join(p["failed"]) if p["failed"] else "") + ".", ""]
    out += ops_lines(part(rows, "ops"))
    prof, ratios = profile_table(part(rows, "profile"))
    out += ["## Device time by op class (one profiled step)", ""] + prof + [""]
    moh_rows, moh = moh_ratios(part(rows, "moh"))
    out += ["## MoH-DiT against DiT (fused block on, interleaved rounds)", ""] + moh_rows + [""]
    sweep = [r for r in part(rows, "sweep") if r.get("what") == "train_batch_sweep"]
    best = sweep[-1] if sweep else {}
    off = official_ratios(part(rows, "official"))
    vit = part(rows, "vit")
    vit_on = [r["img_per_s"] for r in vit if r["fused"] == "on"]
    vit_off = [r["img_per_s"] for r in vit if r["fused"] == "off"]
    dense = next((m for (m, f) in ratios if not m.startswith("MoH")), None)
    targets = [
        ("(elementwise + copies) / GEMM, fused, dense model", ratios.get((dense, "on")), 0.5, False),
        ("MFU at the best batch (" + fmt(best.get("best_batch")) + ")", best.get("best_mfu"), 0.45, True),
        ("ours / official-structure step at that batch (mean of rounds)", statistics.mean(off) if off else None, 1.6, True),
    ] + [(f"{m} / dense (mean of rounds)", statistics.mean(v), 1.05 if m.endswith("-75") else 1.0, True)
         for m, v in moh.items()]
    out += ["## Targets", "", "| target | measured | goal | verdict |", "|---|---|---|---|"]
    for name, value, goal, higher in targets:
        out.append(f"| {name} | {fmt(value, 3)} | {'≥' if higher else '≤'} {goal} | {verdict(value, goal, higher)} |")
    if vit_on and vit_off:
        out += ["", f"Classifier ({vit[0]['model']}, batch {vit[0]['batch']}): fused on / off images/s = "
                f"{statistics.mean(vit_on) / statistics.mean(vit_off):.3f} (rounds: "
                + ", ".join(fmt(v, 4) for v in vit_off) + " off; " + ", ".join(fmt(v, 4) for v in vit_on) + " on)."]
    out += [""] + other_lines(rows)
    print("\n".join(out))


if __name__ == "__main__":
    main()
