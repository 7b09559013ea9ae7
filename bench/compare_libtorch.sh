#!/usr/bin/env bash
# LibTorch 1.13 (Debian, build/) vs 2.x (pip wheel, build-torch2/) on this machine, side by side: every row runs the
# same `moh bench` command on both builds in the order A B A B (so drift of the machine hits both alike) and reports
# each build's median and the ratio 1.13 / 2.x (> 1: 2.x faster). JSON rows go to $OUT (default
# docs/results/bench_libtorch_cpu.jsonl), a Markdown table to stdout.
#   bash bench/compare_libtorch.sh [quick]      quick: smaller/fewer rows (a few minutes; the full run ~30 min here)
#   ONLY='ViT|sample|attention' bash bench/compare_libtorch.sh   only those rows, appended to $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
A=${MOH_A:-build/moh} B=${MOH_B:-build-torch2/moh}
OUT=${OUT:-docs/results/bench_libtorch_cpu.jsonl}
PY=${PY:-.venv/bin/python}
for m in "$A" "$B"; do [ -x "$m" ] || { echo "error: $m not built (scripts/setup.sh, MOH_LIBTORCH=pip scripts/setup.sh)" >&2; exit 2; }; done
QUICK=${1:-}
mkdir -p "$(dirname "$OUT")"
# ONLY=REGEX runs the rows whose names match (and appends to $OUT instead of starting it afresh).
ONLY=${ONLY:-}
[ -n "$ONLY" ] || : > "$OUT"

# row NAME FIELD -- moh bench ARGS...: FIELD of the JSON output is the figure (lower is better).
row() {
  local name=$1 field=$2
  shift 3
  [ -z "$ONLY" ] || [[ "$name" =~ $ONLY ]] || return 0
  local vals=()
  for round in 1 2; do
    for m in "$A" "$B"; do
      local v
      v=$("$m" bench "$@" --json 2>/dev/null | "$PY" -c "import json,sys; d=json.load(sys.stdin); print(d['$field'])")
      vals+=("$v")
    done
  done
  "$PY" - "$name" "$field" "${vals[@]}" "$OUT" "$*" "$("$A" --version | sed -n 2p)" "$("$B" --version | sed -n 2p)" <<'EOF'
import json, statistics, sys, datetime
name, field, a1, b1, a2, b2, out, cmd, va, vb = sys.argv[1:11]
a = statistics.median([float(a1), float(a2)]); b = statistics.median([float(b1), float(b2)])
rec = {"row": name, "field": field, "libtorch_a": va, "libtorch_b": vb, "a": [float(a1), float(a2)],
       "b": [float(b1), float(b2)], "a_median": a, "b_median": b, "ratio_a_over_b": a / b, "command": "moh bench " + cmd,
       "time": datetime.datetime.now().isoformat(timespec="seconds")}
open(out, "a").write(json.dumps(rec) + "\n")
print(f"| {name} | {field} | {a1} / {a2} | {b1} / {b2} | {a / b:.2f} |", flush=True)
EOF
}

# attn NAME ARGS...: `moh bench attention` core scope, the row's fwd+bwd ms of MHA / dense / sparse on each build
# (plain attention on both; `--fused` rows only on 2.x, compared with 2.x's plain row measured in the same round).
attn_rows() {
  local args=("$@")
  [ -z "$ONLY" ] || [[ attention =~ $ONLY ]] || return 0
  for round in 1 2; do
    "$A" bench attention "${args[@]}" --json 2>/dev/null > "/tmp/moh_cmp_a$round.json"
    "$B" bench attention "${args[@]}" --json 2>/dev/null > "/tmp/moh_cmp_b$round.json"
    "$B" bench attention "${args[@]}" --fused --json 2>/dev/null > "/tmp/moh_cmp_f$round.json"
  done
  "$PY" - "$OUT" "${args[*]}" <<'EOF'
import json, statistics, sys, datetime
out, cmd = sys.argv[1:3]
load = lambda p: json.load(open(p))
runs = {k: [load(f"/tmp/moh_cmp_{k}{r}.json") for r in (1, 2)] for k in "abf"}
for i, row in enumerate(runs["a"][0]):
    med = {k: statistics.median(runs[k][r][i]["fwdbwd_ms"] for r in (0, 1)) for k in "abf"}
    name = f"attention {row['scope']} seq {row['seq']} {row['dim']}/{row['heads']} {row['mode']} active {row['active_actual']:.2f}"
    rec = {"row": name, "field": "fwdbwd_ms", "a_median": med["a"], "b_median": med["b"], "b_fused_median": med["f"],
           "ratio_a_over_b": med["a"] / med["b"], "ratio_b_over_b_fused": med["b"] / med["f"],
           "command": "moh bench attention " + cmd + " [--fused on 2.x]", "time": datetime.datetime.now().isoformat(timespec="seconds")}
    open(out, "a").write(json.dumps(rec) + "\n")
    print(f"| {name} | fwd+bwd ms | {med['a']:.1f} | {med['b']:.1f} (fused {med['f']:.1f}) | {med['a'] / med['b']:.2f} (plain/fused on 2.x {med['b'] / med['f']:.2f}) |", flush=True)
EOF
}

echo "| row | figure | LibTorch 1.13 (two rounds) | LibTorch 2.x (two rounds) | 1.13 / 2.x |"
echo "|---|---|---|---|---|"
if [ "$QUICK" = quick ]; then
  row "train MoH-DiT-Pixel/4-75 b8 fp32" step_s -- train --model MoH-DiT-Pixel/4-75 --batch 8 --steps 3 --warmup 1 --peak-tflops 1
  attn_rows --seqs 256 --dims 384:6 --actives 0.5 --scopes core --runs 5
  exit 0
fi
row "train MoH-DiT-S/2-90 b8 32x32x4 fp32" step_s -- train --model MoH-DiT-S/2-90 --batch 8 --img-size 32 --steps 3 --warmup 1 --peak-tflops 1
row "train MoH-DiT-S/2-90 b8 32x32x4 fp32 sparse" step_s -- train --model MoH-DiT-S/2-90 --batch 8 --img-size 32 --steps 3 --warmup 1 --peak-tflops 1 --attention-path sparse
# bf16 autocast only where the CPU has native bf16 (avx512_bf16 / amx_bf16): elsewhere one step takes minutes (97 s vs
# 11 s fp32 for this row on the AVX2-only development machine, LibTorch 1.13). MOH_BENCH_BF16=1 forces the row.
if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo || [ "${MOH_BENCH_BF16:-0}" = 1 ]; then
  row "train MoH-DiT-S/2-90 b8 32x32x4 bf16" step_s -- train --model MoH-DiT-S/2-90 --batch 8 --img-size 32 --steps 2 --warmup 1 --peak-tflops 1 --precision bf16
fi
row "train MoH-ViT-S-75 b4 224 fp32" step_s -- train --model MoH-ViT-S-75 --batch 4 --steps 3 --warmup 1 --peak-tflops 1
row "sample MoH-DiT-S/2-90 b4 ddim10 cfg4 fp32 (chain s)" step_s -- sample --model MoH-DiT-S/2-90 --batch 4 --chain ddim10 --steps 2 --warmup 1
attn_rows --seqs 256,1024 --dims 384:6,768:12 --actives 0.5 --scopes core,module --runs 5
