#!/usr/bin/env python3
"""Turns scripts/gpu_check.sh's results.jsonl into report.json (stage -> key -> value) and report.md (docs/GPU.md
explains each line). Standard library only: the GPU machine's python3 is enough."""
import json
import sys


def load(path):
    report = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            report.setdefault(row["stage"], {})[row["key"]] = row["value"]
    return report


def bench_rows(bench):
    rows = []
    for key, v in bench.items():
        if isinstance(v, dict):
            cells = [f"{k}={v[k]:.4g}" if isinstance(v[k], float) else f"{k}={v[k]}" for k in sorted(v)]
            rows.append(f"| {key} | {', '.join(cells)} |")
    return rows


def markdown(report):
    out = ["# GPU check report", ""]
    for stage, kv in report.items():
        out += [f"## {stage}", "", "| key | value |", "| --- | --- |"]
        for k, v in kv.items():
            if not isinstance(v, dict):
                text = ", ".join(map(str, v)) if isinstance(v, list) else str(v)
                out.append(f"| {k} | {text or '(none)'} |")
        out += bench_rows(kv) + [""]
    return "\n".join(out)


def main():
    results, out_dir = sys.argv[1], sys.argv[2]
    report = load(results)
    with open(f"{out_dir}/report.json", "w") as f:
        json.dump(report, f, indent=1, sort_keys=False)
    with open(f"{out_dir}/report.md", "w") as f:
        f.write(markdown(report))
    failed = [f"{s}/{k}" for s, kv in report.items() for k, v in kv.items() if k.endswith(".ok") and v is False]
    failed += [f"tests/{n}" for n in report.get("tests", {}).get("failed", [])]
    print(f"gpu_report: {out_dir}/report.md ({len(failed)} failures{': ' + ', '.join(failed[:8]) if failed else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
