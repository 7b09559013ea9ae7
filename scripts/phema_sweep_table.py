#!/usr/bin/env python3
"""Table and curve of scripts/phema_sweep.sh's OUT/rows.jsonl: the measure (FID or top-1) of each reconstructed
post-hoc EMA against its σ_rel, beside the run's fixed-decay EMA and raw weights. Writes OUT/sweep.md and OUT/sweep.svg
(a plain SVG line chart, no plotting package needed) and prints the table.

    python3 scripts/phema_sweep_table.py OUT
"""
import json
import sys


def load(out):
    return [json.loads(line) for line in open(out + "/rows.jsonl") if line.strip()]


def table(rows):
    metric = rows[0]["metric"]
    name = "FID" if metric == "fid" else "top-1 %"
    lines = [f"| weights | σ_rel | {name} |", "|---|---:|---:|"]
    for r in rows:
        if r["what"] != "phema":
            lines.append(f"| {'fixed-decay EMA' if r['what'] == 'ema' else 'raw (no EMA)'} | – | {r[metric]:.2f} |")
    for r in sorted((r for r in rows if r["what"] == "phema"), key=lambda r: r["sigma_rel"]):
        lines.append(f"| post-hoc EMA | {r['sigma_rel']:.2f} | {r[metric]:.2f} |")
    best = (min if metric == "fid" else max)((r for r in rows if r["what"] == "phema"), key=lambda r: r[metric])
    lines.append("")
    lines.append(f"Best post-hoc EMA: σ_rel {best['sigma_rel']:.2f}, {name} {best[metric]:.2f}.")
    return "\n".join(lines) + "\n"


def svg(rows, path):
    metric = rows[0]["metric"]
    pts = sorted((r["sigma_rel"], r[metric]) for r in rows if r["what"] == "phema")
    refs = [(r["what"], r[metric]) for r in rows if r["what"] != "phema"]
    ys = [y for _, y in pts] + [y for _, y in refs]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or 1.0
    lo, hi = lo - pad, hi + pad
    x0, x1 = min(x for x, _ in pts), max(x for x, _ in pts)
    W, H, L, B = 640, 400, 70, 50
    sx = lambda x: L + (x - x0) / ((x1 - x0) or 1) * (W - L - 20)
    sy = lambda y: H - B - (y - lo) / (hi - lo) * (H - B - 30)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="30" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">sigma_rel of the reconstructed EMA</text>',
           f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">'
           f'{"FID" if metric == "fid" else "top-1 %"}</text>']
    for x, _ in pts:
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:g}</text>')
    for k in range(5):
        y = lo + (hi - lo) * k / 4
        out.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
    colours = {"ema": "#d62728", "raw": "#7f7f7f"}
    for what, y in refs:
        label = "fixed-decay EMA" if what == "ema" else "raw weights"
        out.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - 20}" y2="{sy(y):.1f}" stroke="{colours[what]}" '
                   f'stroke-dasharray="6 4"/><text x="{W - 24}" y="{sy(y) - 4:.1f}" text-anchor="end" '
                   f'fill="{colours[what]}">{label}</text>')
    path_d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(pts))
    out.append(f'<path d="{path_d}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for x, y in pts:
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="#1f77b4"/>')
    out.append(f'<text x="{L + 8}" y="22">post-hoc EMA (blue) of {rows[0]["run"].split("/")[-1]}</text></svg>')
    open(path, "w").write("\n".join(out) + "\n")


def main(out):
    rows = load(out)
    md = table(rows)
    open(out + "/sweep.md", "w").write(md)
    svg(rows, out + "/sweep.svg")
    print(md, end="")


if __name__ == "__main__":
    main(sys.argv[1])
