#!/usr/bin/env bash
# Post-hoc EMA sweep of one run trained with train.phema (issue 56): for each σ_rel, `moh ema reconstruct` and the
# run's measure — FID for a DiT run (SAMPLES samples, SAMPLER, the classifier FEATURE_RUN's features against the
# Fashion-MNIST test set), top-1 for a classifier run — beside the run's own fixed-decay EMA and its raw weights.
# Rows: OUT/rows.jsonl (one per measurement, with the run, step, σ_rel, sample count and feature network); table and
# curve: OUT/sweep.md and OUT/sweep.svg by scripts/phema_sweep_table.py. Started again, measured rows are skipped.
#
# usage: scripts/phema_sweep.sh RUN OUT
# env: MOH (build/moh) SIGMAS ("0.02 0.03 0.05 0.07 0.10 0.13 0.16 0.20 0.25") FEATURE_RUN (DiT runs: the FID
#      feature network, a classifier run) SAMPLES (2000) SAMPLER ("--sampler dpm++2m --steps 12 --cfg-scale 4")
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 RUN OUT" >&2; exit 2; }
RUN=$(realpath "$1") OUT=$(realpath -m "$2")
MOH=${MOH:-build/moh} SIGMAS=${SIGMAS:-"0.02 0.03 0.05 0.07 0.10 0.13 0.16 0.20 0.25"} SAMPLES=${SAMPLES:-2000}
SAMPLER=${SAMPLER:-"--sampler dpm++2m --steps 12 --cfg-scale 4"}
"$MOH" ema list "$RUN" >/dev/null  # a run without snapshots: its one-line error, exit 2
if grep -q "name: .*DiT" "$RUN/config.resolved.yaml"; then
  KIND=dit
  [ -d "${FEATURE_RUN:-/nonexistent}/checkpoints" ] ||
    { echo "error: FEATURE_RUN: a DiT run's sweep measures FID with a classifier run's features (set FEATURE_RUN)" >&2; exit 2; }
else KIND=cls; fi
mkdir -p "$OUT"
ROWS=$OUT/rows.jsonl
touch "$ROWS"
STATS=$OUT/fm_test_stats.npz
if [ $KIND = dit ] && [ ! -f "$STATS" ]; then
  "$MOH" ref-stats --images fashion_mnist:test --features "classifier:$FEATURE_RUN" --out "$STATS" >/dev/null
fi
LIBTORCH=$("$MOH" --version | sed -n 2p)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')

# measure ID CHECKPOINT WHAT SIGMA [FLAGS]: one row (FLAGS: --raw / --ema for the run's own weights)
measure() {
  grep -qF "\"id\": \"$1\"" "$ROWS" && return 0
  local dir=$OUT/m_$1 value metric
  rm -rf "$dir"
  if [ $KIND = dit ]; then
    # shellcheck disable=SC2086  # SAMPLER and FLAGS are words
    "$MOH" sample --checkpoint "$2" --num-samples "$SAMPLES" --seed 1 $SAMPLER ${5:-} --out "$dir" >/dev/null
    "$MOH" fid --samples "$dir/samples.npz" --ref "$STATS" --features "classifier:$FEATURE_RUN" --out "$dir/fid" >/dev/null
    value=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"]["fid"])' "$dir/fid/report.json")
    metric=fid
  else
    # shellcheck disable=SC2086
    value=$("$MOH" eval --checkpoint "$2" ${5:-} --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["top1"])')
    metric=top1
  fi
  rm -rf "$dir"
  echo "{\"id\": \"$1\", \"run\": \"$RUN\", \"kind\": \"$KIND\", \"what\": \"$3\", \"sigma_rel\": $4, \"$metric\": $value, \"metric\": \"$metric\", \"samples\": $SAMPLES, \"sampler\": \"$SAMPLER\", \"cpu\": \"$CPU\", \"libtorch\": \"$LIBTORCH\", \"feature_run\": \"${FEATURE_RUN:-}\"}" >>"$ROWS"
  echo "$1: $metric $value"
}

if [ $KIND = dit ]; then measure raw "$RUN" raw null --raw; else measure raw "$RUN" raw null; fi
if [ $KIND = dit ]; then measure ema "$RUN" ema null; else measure ema "$RUN" ema null --ema; fi
for s in $SIGMAS; do
  [ -d "$OUT/sigma_$s" ] || "$MOH" ema reconstruct "$RUN" --sigma-rel "$s" --out "$OUT/sigma_$s" >/dev/null
  measure "phema_$s" "$OUT/sigma_$s" phema "$s"
  rm -rf "$OUT/sigma_$s/checkpoints"  # the reconstruction is kept as its phema_reconstruction.json
done
python3 scripts/phema_sweep_table.py "$OUT"
