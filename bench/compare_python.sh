#!/usr/bin/env bash
# The C++ training step against the official-structure PyTorch step (bench/pytorch_moh_dit_step.py,
# bench/pytorch_moh_vit_step.py) on the same LibTorch and machine, interleaved (moh, python, moh, python per row) so
# drift hits both alike; prints the medians and the ratio python / moh (> 1: the toolkit is faster) as a Markdown
# table, JSON rows to $OUT.
#   LibTorch 2.x : build-torch2/moh  vs .venv/bin/python (pip torch 2.14.1: the very libtorch_cpu.so moh links)
#   LibTorch 1.13: build/moh         vs /usr/bin/python3 with Debian's python3-torch (apt; the same libtorch 1.13)
# Rows: training step (batch 8, 32×32×4) of MoH-DiT-S/2-90 and DiT-S/2; training step (batch 4, 224 px) of
# MoH-ViT-S-75 ("vit"; moh with its default attention_path auto); a DDIM-50 CFG-4 sampling chain (batch 8).
# usage: [MOH_BENCH_BF16=1] bash bench/compare_python.sh [rows regex]      e.g. 'train' or 'vit.*2.x' (a pair whose side is missing
#        is skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/bench_python_cpu.jsonl}
ONLY=${1:-.}
mkdir -p "$(dirname "$OUT")"
echo "| LibTorch | row | moh s (2 rounds) | python s (2 rounds) | python / moh |"
echo "|---|---|---|---|---|"

# row KIND LABEL MOH PY MODEL PRECISION   (KIND: train / vit = one optimizer step, sample = one DDIM-50 CFG chain)
row() {
  local kind=$1 label=$2 moh=$3 py=$4 model=$5 prec=$6
  [[ "$kind $label $model $prec" =~ $ONLY ]] || return 0
  local a=() b=() margs pargs
  local script=bench/pytorch_moh_dit_step.py shape=(--batch 8)
  if [ "$kind" = train ]; then
    margs=(bench train --steps 3 --warmup 1 --img-size 32) pargs=(--steps 3 --warmup 1)
  elif [ "$kind" = vit ]; then
    script=bench/pytorch_moh_vit_step.py shape=(--batch 4 --img-size 224)
    margs=(bench train --steps 3 --warmup 1) pargs=(--steps 3 --warmup 1)
  else
    margs=(bench sample --chain ddim50 --cfg-scale 4 --steps 1 --warmup 0 --img-size 32)
    pargs=(--chain ddim50 --steps 1 --warmup 0)
  fi
  # Both sides on the same OpenBLAS kernel: the one moh runs on (it replaces a generic fallback, core/platform/blas_core.h;
  # Python's torch would keep the fallback).
  local core
  core=$("$moh" --version | awk -F': ' '/^OpenBLAS core/ {print $2}' | cut -d' ' -f1)
  for round in 1 2; do
    a+=("$("$moh" "${margs[@]}" --model "$model" "${shape[@]}" --precision "$prec" --json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["step_s"])')")
    b+=("$(env ${core:+OPENBLAS_CORETYPE=$core} "$py" "$script" "${pargs[@]}" --model "$model" "${shape[@]}" \
      --precision "$prec" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_s"])')")
  done
  python3 - "$label" "$kind $model $prec" "${a[@]}" "${b[@]}" "$OUT" "$("$moh" --version | sed -n 2p)" "${core:-MKL}" <<'PY'
import json, statistics, sys, datetime
label, row, a1, a2, b1, b2, out, lib, core = sys.argv[1:10]
a, b = statistics.median([float(a1), float(a2)]), statistics.median([float(b1), float(b2)])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
rec = {"libtorch": lib, "row": row, "moh_step_s": [float(a1), float(a2)], "python_step_s": [float(b1), float(b2)],
       "python_over_moh": b / a, "cpu": cpu, "blas_core": core,
       "time": datetime.datetime.now().isoformat(timespec="seconds")}
open(out, "a").write(json.dumps(rec) + "\n")
print(f"| {label} | {row} | {float(a1):.2f} / {float(a2):.2f} | {float(b1):.2f} / {float(b2):.2f} | **{b / a:.2f}** |")
PY
}

# bf16 rows where the CPU has native bf16 products, or on request (MOH_BENCH_BF16=1: emulated on AVX2, both sides alike)
bf16=${MOH_BENCH_BF16:-}
grep -q -E 'avx512_bf16|amx_bf16' /proc/cpuinfo && bf16=1
pairs=()
[ -x build-torch2/moh ] && [ -x .venv/bin/python ] && pairs+=("2.x build-torch2/moh .venv/bin/python")
[ -x build/moh ] && /usr/bin/python3 -c 'import torch' 2>/dev/null && pairs+=("1.13 build/moh /usr/bin/python3")
for kind in train vit sample; do
  models=(MoH-DiT-S/2-90 DiT-S/2)
  [ "$kind" = vit ] && models=(MoH-ViT-S-75)
  for pair in "${pairs[@]}"; do
    read -r label moh py <<<"$pair"
    for m in "${models[@]}"; do
      row "$kind" "$label" "$moh" "$py" "$m" fp32
      [ -z "$bf16" ] || row "$kind" "$label" "$moh" "$py" "$m" bf16
    done
  done
done
