#!/bin/bash
# usage: scripts/compare_training.sh MOH OUTDIR: trains one classifier and two DiT configs (DDPM's objective and flow
# matching) with a fixed seed (16 steps each, EMA on, Mixup on for the classifier) and prints the sha256 of every checkpoint file and of the metric lines
# (without img_per_s and the wall-clock fields). Two builds that train alike print the same lines.
# EXTRA: more overrides for both runs, e.g. EXTRA="--set train.precision=bf16" (precision: auto measures per machine
# and build, so builds compared on one machine should fix it).
set -e
EXTRA=${EXTRA:-}
MOH=$(realpath "$1"); OUT=$2; R=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p $OUT; cd $OUT; rm -rf cls dit flow
$MOH train $R/configs/fashion_mnist/moh_vit_nano.yaml --run-dir cls --set data.batch_size=32 --set data.limit_train=256 --set data.limit_val=128 --set train.epochs=2 --set train.log_every_steps=2 --set train.ema_decay=0.99 --set augment.mixup=0.8 --set train.seed=5 $EXTRA 2>cls.err >cls.out
$MOH train $R/configs/fashion_mnist/moh_dit_pixel.yaml --run-dir dit --set data.batch_size=32 --set data.limit_train=256 --set train.epochs=2 --set train.log_every_steps=2 --set train.seed=5 $EXTRA 2>dit.err >dit.out
$MOH train $R/configs/fashion_mnist/moh_sit_pixel.yaml --run-dir flow --set data.batch_size=32 --set data.limit_train=256 --set train.epochs=2 --set train.log_every_steps=2 --set train.seed=5 $EXTRA 2>flow.err >flow.out
for r in cls dit flow; do
  sha256sum $r/checkpoints/*/model.safetensors $r/checkpoints/*/ema.safetensors $r/checkpoints/*/optimizer.safetensors | sed "s|  .*/checkpoints/|  $r/|"
  python3 -c "
import json,sys
for l in open('$r/metrics.jsonl'):
    j=json.loads(l); [j.pop(k,None) for k in ('img_per_s','time','elapsed_s')]; print(json.dumps(j,sort_keys=True))" | sha256sum | sed "s/-/$r metrics/"
done
