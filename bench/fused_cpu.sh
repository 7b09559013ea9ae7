#!/usr/bin/env bash
# The fused block on a CPU (docs/BENCHMARKS.md, "Fused block"): `moh bench train` with model.fused off and on, and
# (BASE set) the step of another binary with the official sequence beside this one's, interleaved in ROUNDS rounds
# (A B A B ...: drift of the machine hits both alike) for each build given. One JSON line per measurement to OUT, a
# Markdown table (medians, ratio B / A of images/s) to stdout.
#   usage: [BUILDS="build build-torch2"] [BASE=DIR] [ROUNDS=3] [THREADS=N] [ONLY=REGEX] [OUT=FILE] bash bench/fused_cpu.sh
#     ONLY     a regular expression: only the rows whose label matches
#     THREADS  intra-op threads of each measurement (OMP_NUM_THREADS; the demo's processes run 1); unset: LibTorch's default
#     BASE  a checkout of the commit to compare with, built in the same build directories (e.g. a git worktree of the
#           previous commit): BASE/BUILD/moh runs beside BUILD/moh with the official sequence (fused off, the default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILDS=${BUILDS:-build build-torch2} ROUNDS=${ROUNDS:-3} OUT=${OUT:-docs/results/fused_cpu/steps.jsonl}
PY=${PY:-.venv/bin/python}
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
ROWS=(  # label | moh bench train arguments (the demo's two models at their per-process batch first)
  "MoH-DiT-Pixel/2-75 b32 fp32|--model MoH-DiT-Pixel/2-75 --batch 32"
  "MoH-DiT-Pixel/2-75 b32 bf16|--model MoH-DiT-Pixel/2-75 --batch 32 --precision bf16"
  "MoH-ViT-Nano 32px b64 fp32|--model MoH-ViT-Nano --img-size 32 --batch 64"
  "MoH-ViT-Nano 32px b64 bf16|--model MoH-ViT-Nano --img-size 32 --batch 64 --precision bf16"
  "MoH-DiT-S/2-90 16px b4 fp32|--model MoH-DiT-S/2-90 --img-size 16 --batch 4"
  "DiT-S/2 16px b4 fp32|--model DiT-S/2 --img-size 16 --batch 4"
)
# measure BIN LABEL SIDE ARGS...: one images/s figure (steps 5 after 2) into OUT, echoed.
measure() {
  local bin=$1 label=$2 side=$3 line
  shift 3
  line=$(${THREADS:+env OMP_NUM_THREADS=$THREADS} "$bin" bench train "$@" --steps 5 --warmup 2 --json 2>/dev/null | grep '^{' | tail -n1) ||
    { echo "error: $bin bench train $* failed (run it alone to see why)" >&2; exit 1; }
  "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); r.update(row=sys.argv[2], side=sys.argv[3], binary=sys.argv[4], threads=sys.argv[5]); print(json.dumps(r))' \
    "$line" "$label" "$side" "$bin" "${THREADS:-default}" >>"$OUT"
}
for b in $BUILDS; do
  [ -x "$b/moh" ] || { echo "error: $b/moh not built" >&2; exit 2; }
  for row in "${ROWS[@]}"; do
    label=${row%%|*} args=${row#*|}
    [[ $label =~ ${ONLY:-.} ]] || continue
    for round in $(seq "$ROUNDS"); do
      # shellcheck disable=SC2086  # args are words
      measure "$b/moh" "$label" "off" $args --fused off
      measure "$b/moh" "$label" "on" $args --fused on
      if [ -n "${BASE:-}" ]; then measure "$BASE/$b/moh" "$label" "before" $args; fi
    done
  done
done
"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["libtorch"], r["row"]), {}).setdefault(r["side"], []).append(r["img_per_s"])
base = any("before" in s for s in groups.values())  # columns of the base binary where BASE was given
print("| LibTorch | step | img/s fused off (rounds) | on | on / off |" + (" before (base binary) | after / before |" if base else ""))
print("|---|---|---|---|---|" + ("---|---|" if base else ""))
for (lib, row), s in groups.items():
    med = {k: statistics.median(v) for k, v in s.items()}
    cell = lambda k: " / ".join(f"{v:.2f}" for v in s[k]) if k in s else "–"
    before = f"{med['off'] / med['before']:.2f}" if "before" in med else "–"
    tail = f" {cell('before')} | {before} |" if base else ""
    print(f"| {lib} | {row} | {cell('off')} | {cell('on')} | {med['on'] / med['off']:.2f} |" + tail)
EOF
