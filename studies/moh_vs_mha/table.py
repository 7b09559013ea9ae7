"""The tables and verdicts of the MoH-versus-MHA study from its rows (studies/moh_vs_mha/run.sh): per variant the mean
with its 95 % t-interval, and per MoH variant the paired differences from MHA (same seed) judged by studies/stats.py
against the margins fixed before the runs (docs/results/moh_vs_mha/README.md):
  classifier  top-1 on the whole test set, margin ±0.5 points;
  DiT         FID (relative to DiT-Pixel/2's of the same seed), margin ±5 %; class accuracy, margin ±2 points.
Speed: each variant's training steps/s and sampling images/s over MHA's of the same seed (ratios, paired); for the
classifier also from the speed rounds (run.sh PARTS=speed, an otherwise idle machine), paired by round. The DiT's
spread over training seeds and over sample sets of one run are given apart.

    python3 studies/moh_vs_mha/table.py OUT      writes OUT/tables.md from OUT/rows.jsonl
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import stats  # noqa: E402

CLS_REF, DIT_REF = "ViT-Nano", "DiT-Pixel/2"
TOP1_MARGIN, FID_MARGIN_PCT, ACC_MARGIN = 0.5, 5.0, 2.0


def ci(values, digits=2):
    if not values:
        return "–"
    m, h = stats.interval(values)
    return f"{m:.{digits}f}" if h is None else f"{m:.{digits}f} ± {h:.{digits}f}"


def by_seed(rows, variant, key):
    return {r["seed"]: r[key] for r in rows if r["variant"] == variant and r.get(key) is not None}


def paired(rows, variant, ref, key, relative=False):
    a, b = by_seed(rows, variant, key), by_seed(rows, ref, key)
    seeds = sorted(set(a) & set(b))
    if relative:
        return stats.paired_relative([a[s] for s in seeds], [b[s] for s in seeds]), seeds
    return [a[s] - b[s] for s in seeds], seeds


def ratios(rows, variant, ref, key):
    a, b = by_seed(rows, variant, key), by_seed(rows, ref, key)
    return [a[s] / b[s] for s in sorted(set(a) & set(b)) if b[s]]


def classifier_table(rows):
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    out = ["## Classifier: MoH-ViT-Nano family, top-1 on the Fashion-MNIST test set (10,000 images)", "",
           "| variant | seeds | top-1 % (mean ± 95 % CI) | MoH − MHA, paired (points) | verdict (margin ±0.5) | why | "
           "training steps/s over MHA's |", "|---|---|---|---|---|---|---|"]
    for v in variants:
        top1 = list(by_seed(rows, v, "top1").values())
        if v == CLS_REF:
            out.append(f"| {v} (MHA) | {len(top1)} | {ci(top1)} | – | – | – | 1 |")
            continue
        d, seeds = paired(rows, v, CLS_REF, "top1")
        verdict, why = stats.compare(d, TOP1_MARGIN)
        out.append(f"| {v} | {len(seeds)} | {ci(top1)} | {ci(d)} | **{verdict}** | {why} | "
                   f"{ci(ratios(rows, v, CLS_REF, 'train_steps_per_s'), 3)} |")
    return out


def speed_table(rows):
    """The classifier's training steps/s from the speed rounds (an otherwise idle machine), paired by round."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    out = ["## Classifier speed: training steps/s, interleaved rounds on an otherwise idle machine", "",
           "| variant | rounds | steps/s (mean ± 95 % CI) | over MHA's, paired | 95 % interval holds 1 |",
           "|---|---|---|---|---|"]
    for v in variants:
        sps = list(by_seed(rows, v, "train_steps_per_s").values())
        if v == CLS_REF:
            out.append(f"| {v} (MHA) | {len(sps)} | {ci(sps, 3)} | 1 | – |")
            continue
        r = ratios(rows, v, CLS_REF, "train_steps_per_s")
        holds = "–"
        if len(r) > 1:
            m, h = stats.interval(r)
            holds = "yes" if m - h <= 1 <= m + h else ("no: faster" if m - h > 1 else "no: slower")
        out.append(f"| {v} | {len(r)} | {ci(sps, 3)} | {ci(r, 3)} | {holds} |")
    return out


def spread(rows, variant):
    """(sd over training seeds of set 1's FID, sd over the two sample sets of one run, from the seeds with both)."""
    first = {r["seed"]: r["fid"] for r in rows if r["variant"] == variant and r["id"].endswith("/set1")}
    second = {r["seed"]: r["fid"] for r in rows if r["variant"] == variant and r["id"].endswith("/set2")}
    both = sorted(set(first) & set(second))
    seed_sd = statistics.stdev(first.values()) if len(first) > 1 else None
    set_sd = math.sqrt(sum((first[s] - second[s]) ** 2 for s in both) / (2 * len(both))) if both else None
    return seed_sd, set_sd, len(both)


def dit_table(rows):
    first = [r for r in rows if r["id"].endswith("/set1")]
    variants = list(dict.fromkeys(r["variant"] for r in first))
    out = ["## DiT: the demo's flow recipe, FID and class accuracy of its samples (classifier features)", "",
           "| variant | seeds | FID (mean ± 95 % CI) | FID vs dense, paired (%) | verdict (margin ±5 %) | why | "
           "class accuracy % | accuracy vs dense (points) | verdict (margin ±2) | training steps/s over dense's | "
           "sampling images/s over dense's |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in variants:
        fid = list(by_seed(first, v, "fid").values())
        acc = list(by_seed(first, v, "class_accuracy").values())
        if v == DIT_REF:
            out.append(f"| {v} (dense) | {len(fid)} | {ci(fid)} | – | – | – | {ci(acc, 1)} | – | – | 1 | 1 |")
            continue
        d, seeds = paired(first, v, DIT_REF, "fid", relative=True)
        verdict, why = stats.compare(d, FID_MARGIN_PCT, higher_is_better=False)
        da, _ = paired(first, v, DIT_REF, "class_accuracy")
        va, _ = stats.compare(da, ACC_MARGIN)
        out.append(f"| {v} | {len(seeds)} | {ci(fid)} | {ci(d, 1)} | **{verdict}** | {why} | {ci(acc, 1)} | "
                   f"{ci(da, 1)} | {va} | {ci(ratios(first, v, DIT_REF, 'train_steps_per_s'), 3)} | "
                   f"{ci(ratios(first, v, DIT_REF, 'sample_images_per_s'), 3)} |")
    out += ["", "| variant | FID sd over training seeds (set 1) | FID sd over two sample sets of one run | runs with two "
            "sets |", "|---|---|---|---|"]
    for v in variants:
        seed_sd, set_sd, n = spread(rows, v)
        f = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
        out.append(f"| {v} | {f(seed_sd)} | {f(set_sd)} | {n} |")
    return out


def dit_by_instrument(rows):
    """The DiT comparison apart for each machine kind and feature network (a group of seeds measured with one of each),
    where the rows hold more than one: the pooled verdict above mixes them."""
    first = [r for r in rows if r["id"].endswith("/set1")]
    groups = list(dict.fromkeys((r["cpu"], r["feature_sha256"]) for r in first))
    if len(groups) < 2:
        return []
    variants = list(dict.fromkeys(r["variant"] for r in first if r["variant"] != DIT_REF))
    out = ["## DiT by machine and feature network", "",
           "| machine | feature network | seeds | dense FID | variant | FID vs dense, paired (%) | verdict (±5 %) | "
           "training steps/s over dense's |", "|---|---|---|---|---|---|---|---|"]
    for cpu, feat in groups:
        group = [r for r in first if (r["cpu"], r["feature_sha256"]) == (cpu, feat)]
        seeds = ", ".join(map(str, sorted({r["seed"] for r in group})))
        dense = list(by_seed(group, DIT_REF, "fid").values())
        for v in variants:
            d, _ = paired(group, v, DIT_REF, "fid", relative=True)
            verdict, _ = stats.compare(d, FID_MARGIN_PCT, higher_is_better=False)
            out.append(f"| {cpu} | {feat} | {seeds} | {ci(dense)} | {v} | {ci(d, 1)} | {verdict} | "
                       f"{ci(ratios(group, v, DIT_REF, 'train_steps_per_s'), 3)} |")
    return out


def provenance(rows):
    keys = ("commit", "libtorch", "cpu")
    seen = sorted({tuple(r.get(k, "?") for k in keys) for r in rows})
    feats = sorted({r["feature_sha256"] for r in rows if "feature_sha256" in r})
    dates = sorted({r["date"] for r in rows})
    return ["## Provenance", "", f"{len(rows)} rows (rows.jsonl), {dates[0]} to {dates[-1]}; feature network "
            f"SHA-256 {', '.join(feats) or '–'} (prefix)."] + [f"- commit {c}, {lib}, {cpu}" for c, lib, cpu in seen]


def main():
    out_dir = sys.argv[1]
    with open(os.path.join(out_dir, "rows.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    text = ["# MoH against MHA: tables (written by studies/moh_vs_mha/table.py from rows.jsonl)", ""]
    cls = [r for r in rows if r["kind"] == "cls"]
    dit = [r for r in rows if r["kind"] == "dit"]
    if cls:
        text += classifier_table(cls) + [""]
    speed = [r for r in rows if r["kind"] == "cls_speed"]
    if speed:
        text += speed_table(speed) + [""]
    if dit:
        text += dit_table(dit) + [""]
        by_instrument = dit_by_instrument(dit)
        if by_instrument:
            text += by_instrument + [""]
    if rows:
        text += provenance(rows)
    with open(os.path.join(out_dir, "tables.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
