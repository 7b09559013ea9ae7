#!/usr/bin/env bash
# The MoH head budget at inference (issue 36 item 4): sampling time of a whole reverse chain for every K of the routed
# layers on the sparse path (only the selected heads are computed), beside the trained K on the automatic path and
# the dense model of the same size. Settings are interleaved, ROUNDS rounds, so that load on the machine falls on all
# of them alike; one JSON line per measurement in OUT (default docs/results/bench_topk_sample.jsonl), then a table of
# the median over rounds of each setting's median step time and its ratio to the trained K on the sparse path (K = 0:
# the shared heads alone).
#
# usage: bench/topk_sample.sh [OUT]
# env:   MOH (build/moh) MODEL (MoH-DiT-Pixel/4-75) DENSE (DiT-Pixel/4) KS ("0 1 2 3 4") CHAIN (ddim10)
#        BATCH (32) ROUNDS (3) STEPS (3) CFG (4)
set -euo pipefail
cd "$(dirname "$0")/.."
MOH=${MOH:-build/moh} OUT=${1:-docs/results/bench_topk_sample.jsonl}
MODEL=${MODEL:-MoH-DiT-Pixel/4-75} DENSE=${DENSE:-DiT-Pixel/4} KS=${KS:-"0 1 2 3 4"}
CHAIN=${CHAIN:-ddim10} BATCH=${BATCH:-32} ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-3} CFG=${CFG:-4}
[ -x "$MOH" ] || { echo "error: $MOH not found (run scripts/setup.sh first)" >&2; exit 2; }
: >"$OUT"
one() {  # one ROUND SETTING ARGS...: one measurement, tagged with its round and setting
  local round=$1 setting=$2
  shift 2
  "$MOH" bench sample --chain "$CHAIN" --batch "$BATCH" --steps "$STEPS" --warmup 1 --cfg-scale "$CFG" --json "$@" |
    tail -1 | sed "s/^{/{\"round\":$round,\"setting\":\"$setting\",/" >>"$OUT"
}
for round in $(seq "$ROUNDS"); do
  one "$round" "trained K, sparse" --model "$MODEL" --attention-path sparse
  for k in $KS; do one "$round" "K=$k sparse" --model "$MODEL" --topk "$k" --attention-path sparse; done
  one "$round" "trained K, auto" --model "$MODEL" --attention-path auto
  one "$round" "dense model" --model "$DENSE"
done
python3 - "$OUT" "trained K, sparse" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["setting"], []).append(r["step_s"])
ref = statistics.median(by[sys.argv[2]])
r0 = rows[0]
print(f"{r0['machine']['cpu']}, {r0['machine']['cores']} cores, LibTorch {r0['libtorch']}, {r0['precision']}; "
      f"chain {r0['chain']}, batch {r0['batch']}, CFG {r0['cfg_scale']}; {len(by[sys.argv[2]])} rounds")
print(f"| {r0['model']}: setting | s per chain (median of rounds) | ratio to the trained K, sparse |")
print("|---|---:|---:|")
for name, t in by.items():
    m = statistics.median(t)
    print(f"| {name} | {m:.3f} | {m / ref:.2f} |")
PY
