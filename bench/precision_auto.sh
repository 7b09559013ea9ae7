#!/usr/bin/env bash
# Whether `precision: auto` picks the faster precision on this machine (core/platform/cpu_precision.h): per build, the
# calibration's block times (bf16 / fp32) against real training steps in fp32 and bf16 autocast, interleaved rounds,
# and whether the choice matches the faster one. JSON rows to $OUT, a Markdown table to stdout.
#   usage: bash bench/precision_auto.sh [MOH_BINARY ...]    (default: build/moh build-torch2/moh, those that exist)
#   ROUNDS (3), MODELS ("MoH-DiT-Pixel/4-75:64:28 MoH-ViT-Nano:128:32 MoH-DiT-S/2-90:8:32" = model:batch:img-size)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/bench_precision_auto_cpu.jsonl}
ROUNDS=${ROUNDS:-3}
MODELS=${MODELS:-"MoH-DiT-Pixel/4-75:64:28 MoH-ViT-Nano:128:32 MoH-DiT-S/2-90:8:32"}
bins=("$@")
[ ${#bins[@]} -gt 0 ] || for b in build/moh build-torch2/moh; do [ -x "$b" ] && bins+=("$b"); done
[ ${#bins[@]} -gt 0 ] || { echo "error: no moh binary built (scripts/setup.sh)" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
cache=$(mktemp -d)/cpu_precision.json
trap 'rm -rf "$(dirname "$cache")"' EXIT
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
echo "| LibTorch | CPU, BLAS core | calibration bf16 / fp32 | model, batch | step fp32 s | step bf16 s | bf16 / fp32 | auto picks | the faster |"
echo "|---|---|---|---|---|---|---|---|---|"
for bin in "${bins[@]}"; do
  lt=$("$bin" --version | awk '/^LibTorch/ {print $2}')
  core=$("$bin" --version | awk -F': ' '/^OpenBLAS core/ {print $2}' | cut -d' ' -f1)
  cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
  rm -f "$cache"
  picked=$(MOH_CPU_PRECISION_CACHE=$cache "$bin" bench train --model MoH-DiT-Pixel/4-75 --batch 2 --img-size 8 \
    --steps 1 --warmup 0 --precision auto --json | field precision)
  calib=$(python3 -c "import json; d=list(json.load(open('$cache')).values())[0]; print('%.2f' % (d['bf16_ms'] / d['fp32_ms']))" 2>/dev/null || echo "- (no native bf16)")
  for spec in $MODELS; do
    IFS=: read -r model batch size <<<"$spec"
    f=() b=()
    for round in $(seq "$ROUNDS"); do
      for p in fp32 bf16; do
        line=$("$bin" bench train --model "$model" --batch "$batch" --img-size "$size" --steps 3 --warmup 1 \
          --precision "$p" --json)
        echo "$line" >>"$OUT"
        v=$(echo "$line" | field step_s)
        if [ "$p" = fp32 ]; then f+=("$v"); else b+=("$v"); fi
      done
    done
    fm=$(median "${f[@]}") bm=$(median "${b[@]}")
    faster=$(awk -v a="$fm" -v b="$bm" 'BEGIN {print (b < a) ? "bf16" : "fp32"}')
    ratio=$(awk -v a="$fm" -v b="$bm" 'BEGIN {printf "%.2f", b / a}')
    echo "| $lt | $cpu, ${core:-MKL} | $calib | $model, $batch | $fm | $bm | $ratio | $picked | $faster |"
  done
done
