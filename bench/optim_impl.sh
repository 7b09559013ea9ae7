#!/usr/bin/env bash
# AdamW + clipping + EMA per tensor (optim.impl for_loop, LibTorch's torch::optim::AdamW) against the multi-tensor
# (foreach) and fused implementations, in one training step of `moh bench train` with an EMA, on this machine:
# interleaved rounds (for_loop, foreach, fused, for_loop, ...) so drift hits each alike; medians of the step time and
# the ratio for_loop / impl (> 1: faster than per tensor). JSON rows to $OUT, a Markdown table to stdout.
#   usage: bash bench/optim_impl.sh [MOH_BINARY ...]       (default: build/moh build-torch2/moh, those that exist)
#   ROUNDS (3), MODELS ("MoH-DiT-Pixel/4-75:64:28 MoH-DiT-S/2-90:8:32" = model:batch:img-size)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/bench_optim_impl_cpu.jsonl}
ROUNDS=${ROUNDS:-3}
MODELS=${MODELS:-"MoH-DiT-Pixel/4-75:64:28 MoH-DiT-S/2-90:8:32"}
bins=("$@")
[ ${#bins[@]} -gt 0 ] || for b in build/moh build-torch2/moh; do [ -x "$b" ] && bins+=("$b"); done
[ ${#bins[@]} -gt 0 ] || { echo "error: no moh binary built (scripts/setup.sh)" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "| LibTorch | model, batch | for_loop s | foreach s | fused s | for_loop / foreach | for_loop / fused |"
echo "|---|---|---|---|---|---|---|"
for bin in "${bins[@]}"; do
  lt=$("$bin" --version | awk '/^LibTorch/ {print $2}')
  for spec in $MODELS; do
    IFS=: read -r model batch size <<<"$spec"
    impls=(for_loop foreach)
    "$bin" bench train --model "$model" --batch 1 --img-size "$size" --steps 1 --warmup 0 --optim-impl fused \
      >/dev/null 2>&1 && impls+=(fused)
    declare -A t=()
    for round in $(seq "$ROUNDS"); do
      for impl in "${impls[@]}"; do
        line=$("$bin" bench train --model "$model" --batch "$batch" --img-size "$size" --steps 3 --warmup 1 \
          --ema 0.9999 --optim-impl "$impl" --json)
        echo "$line" >>"$OUT"
        t[$impl]+="$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_s"])') "
      done
    done
    a=$(median ${t[for_loop]}) b=$(median ${t[foreach]}) c=-
    [ -n "${t[fused]:-}" ] && c=$(median ${t[fused]})
    ratio() { [ "$2" = - ] && echo - || awk -v x="$1" -v y="$2" 'BEGIN {printf "%.2f", x / y}'; }
    echo "| $lt | $model, $batch | $a | $b | $c | $(ratio "$a" "$b") | $(ratio "$a" "$c") |"
    unset t
  done
done
