#!/usr/bin/env bash
# Freed heap memory kept (keep_freed_heap, core/platform/memory_preflight.h) against glibc's own malloc settings, one binary:
# with GLIBC_TUNABLES set (here to glibc.malloc.perturb=0, which changes nothing) moh leaves malloc as glibc sets it.
# Interleaved rounds, each setting in turn: the demo DiT's fp32 training step (`moh bench train`, one thread), 100 fp32
# steps of the demo's DiT training (2 processes; wall seconds and minor page faults of the whole run) and, given a
# finished demo in DEMO_OUT, its sampling and FID report (wall seconds). One line per setting and round.
# usage: bench/freed_heap.sh [ROUNDS]   (default 3; env MOH = build/moh, DEMO_OUT = runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
MOH=${MOH:-build/moh}
DEMO=${DEMO_OUT:-runs/demo}
ROUNDS=${1:-3}
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time: not found (apt install time)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wall() {  # seconds of the command, its output to $tmp/log
  local s
  s=$(date +%s.%N)
  "$@" > "$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  echo "$(date +%s.%N) - $s" | bc
}
echo "# $("$MOH" --version | tr '\n' ' ')"
for round in $(seq "$ROUNDS"); do
  for setting in glibc kept; do
    if [ $setting = glibc ]; then export GLIBC_TUNABLES=glibc.malloc.perturb=0; else unset GLIBC_TUNABLES; fi
    step=$(OMP_NUM_THREADS=1 "$MOH" bench train --model MoH-DiT-Pixel/2-75 --img-size 28 --batch 32 --precision fp32 \
      --ema 0.9999 --steps 10 | awk '/step_s/ { print $2 }')
    rm -rf "$tmp/run"
    /usr/bin/time -f %R -o "$tmp/faults" "$MOH" train configs/fashion_mnist/moh_sit_pixel_demo.yaml --run-dir "$tmp/run" \
      --set data.limit_train=6400 --set train.precision=fp32 > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log" >&2; exit 1; }
    train=$(grep -o '"seconds":[0-9.]*' "$tmp/train.log" | cut -d: -f2)
    line="round $round $setting: bench step ${step} s, train 100 steps ${train} s ($(tail -1 "$tmp/faults") page faults)"
    if [ -f "$DEMO/dit/config.resolved.yaml" ] && [ -f "$DEMO/fm_test_stats.npz" ]; then
      rm -rf "$tmp/samples" "$tmp/fid"
      sample=$(wall "$MOH" sample --checkpoint "$DEMO/dit" --sampler heun --steps 6 --cfg-scale 4 --cfg-interval 0,0.5 \
        --set sampling.per_class=10 --out "$tmp/samples")
      fid=$(wall "$MOH" fid --samples "$tmp/samples/samples.npz" --ref "$DEMO/fm_test_stats.npz" \
        --features "classifier:$DEMO/classifier" --out "$tmp/fid")
      line="$line, sample ${sample} s, fid ${fid} s"
    fi
    echo "$line"
  done
done
