#!/usr/bin/env bash
# Routing analytics of the demo's two MoH models on Fashion-MNIST (docs/results/routing/README.md):
#  1. MoH-ViT-Nano, the demo's 200 steps, split into 5 epochs of 5,120 images so the trainer logs the head load 5 times;
#     `moh eval` then writes its head load per class;
#  2. MoH-DiT-Pixel/4-75, 2,400 steps (the demo's until 2026-11-29), in 8 epochs of 19,200 images (8 head-load lines);
#     `moh sample --head-load` (the demo's CFG 4, DDIM 50, 10 per class) writes the head load by timestep and class;
#  3. `moh plot` of both runs (loss, lr, top-1 and the head load at each evaluation).
# fp32 throughout: bf16 autocast is several times slower on CPUs without native bf16 and differs between machines.
# usage: studies/routing/run.sh [OUT_DIR=runs/routing]   (MOH=build/moh or build-torch2/moh)
set -euo pipefail
cd "$(dirname "$0")/../.."
MOH=${MOH:-build/moh}
OUT=${1:-runs/routing}
if [ -e "$OUT" ]; then echo "error: $OUT exists (remove it or name another directory)" >&2; exit 2; fi
mkdir -p "$OUT"
start=$(date +%s)
echo "== $($MOH --version | head -1)"
echo "== 1/3 classifier: MoH-ViT-Nano, 200 steps in 5 epochs"
$MOH train configs/fashion_mnist/moh_vit_nano.yaml --run-dir "$OUT/classifier" --set data.limit_train=5120 \
  --set train.precision=fp32 --set train.epochs=5 --set schedule.warmup_epochs=0.5 --set train.log_every_steps=20
$MOH eval configs/fashion_mnist/moh_vit_nano.yaml --checkpoint "$OUT/classifier" --out "$OUT/classifier/eval"
echo "== 2/3 diffusion: MoH-DiT-Pixel/4-75, 2,400 steps in 8 epochs, then CFG samples with --head-load"
$MOH train configs/fashion_mnist/moh_dit_pixel.yaml --run-dir "$OUT/dit" --set data.limit_train=19200 \
  --set train.precision=fp32 --set train.epochs=8 --set train.max_steps=2400
$MOH sample --checkpoint "$OUT/dit" --cfg-scale 4 --steps ddim50 --set sampling.per_class=10 --head-load \
  --out "$OUT/samples"
echo "== 3/3 curves"
$MOH plot "$OUT/classifier" "$OUT/dit" --out "$OUT/plots"
echo "== done in $(( $(date +%s) - start )) s"
