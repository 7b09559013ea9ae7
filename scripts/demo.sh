#!/usr/bin/env bash
# The README's demo command: setup + build, then what the toolkit can do so far on this machine.
# (Grows as the pipelines land: DiT sampling and FID reports will be added here.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MOH=build/moh
echo "== moh --version"; $MOH --version
echo "== registered model variants"; $MOH info --list
echo "== MoH-ViT-B-75 and MoH-DiT-XL/2-90 as published"
$MOH info --model MoH-ViT-B-75
$MOH info --model MoH-DiT-XL/2-90
echo "== the embedded default experiment, resolved"; $MOH config configs/fashion_mnist/moh_vit_nano.yaml
RUN=runs/demo_moh_vit_nano
rm -rf "$RUN"
echo "== a short MoH-ViT-Nano training on Fashion-MNIST (60 steps), then evaluation of its checkpoint"
$MOH train configs/fashion_mnist/moh_vit_nano.yaml --run-dir "$RUN" --set train.max_steps=60 \
  --set schedule.warmup_epochs=0.05 --set data.limit_val=2000 --set train.log_every_steps=20
$MOH eval configs/fashion_mnist/moh_vit_nano.yaml --checkpoint "$RUN" --set data.limit_val=2000
echo "== a quick MoH attention benchmark (seq 1024, dim 384/6 heads)"
$MOH bench attention --seqs 1024 --dims 384:6 --runs 5
echo "== artefacts: $RUN/metrics.jsonl, $RUN/checkpoints/ (full benchmark tables: docs/BENCHMARKS.md)"
