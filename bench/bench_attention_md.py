#!/usr/bin/env python3
"""Turns `moh bench attention --json` rows into the Markdown tables of docs/BENCHMARKS.md (stdlib only).
usage: bench/bench_attention_md.py docs/results/bench_attention_cpu.json"""
import json
import sys

rows = json.load(open(sys.argv[1]))
for scope in ("core", "module"):
    print(f"\n**scope = {scope}** (ratios to MHA in the same run; fwd = inference, fwd+bwd = training step)\n")
    print("| seq | dim/heads | batch | MHA fwd ms | MHA fwd+bwd ms | active (h_s+K)/h | dense fwd | sparse fwd | dense fwd+bwd | sparse fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["seq"], r["dim"]) for r in rows if r["scope"] == scope})
    for seq, dim in keys:
        sel = [r for r in rows if r["scope"] == scope and r["seq"] == seq and r["dim"] == dim]
        mha = next(r for r in sel if r["mode"] == "mha")
        for active in sorted({r["active"] for r in sel if r["mode"] != "mha"}):
            d = next(r for r in sel if r["mode"] == "dense" and r["active"] == active)
            s = next(r for r in sel if r["mode"] == "sparse" and r["active"] == active)
            print(f"| {seq} | {dim}/{mha['heads']} | {mha['batch']} | {mha['fwd_ms']:.1f} | {mha['fwdbwd_ms']:.1f} | "
                  f"{active:.2f} → {s['active_actual']:.3f} ({s['shared']}+{s['topk']}) | {d['fwd_ratio']:.3f} | "
                  f"**{s['fwd_ratio']:.3f}** | {d['fwdbwd_ratio']:.3f} | **{s['fwdbwd_ratio']:.3f}** |")
