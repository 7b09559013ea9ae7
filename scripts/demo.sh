#!/usr/bin/env bash
# The README's demo command: setup + build, then what the toolkit can do so far on this machine.
# (Grows as the pipelines land: classifier training, DiT sampling and FID reports will be added here.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MOH=build/moh
echo "== moh --version"; $MOH --version
echo "== registered model variants"; $MOH info --list
echo "== MoH-DiT-XL/2-90 as published"; $MOH info --model MoH-DiT-XL/2-90
echo "== the embedded default experiment, resolved"; $MOH config configs/fashion_mnist/moh_vit_nano.yaml
echo "== a quick MoH attention benchmark (seq 256, dim 384/6 heads)"
$MOH bench attention --seqs 256 --dims 384:6 --runs 5 --warmup 1
