#!/usr/bin/env bash
# Peak memory of the sampling path at the sizes users run (docs/BENCHMARKS.md, "Sampling memory"):
#   samples     `moh sample` of 50,000 images of 64×64×3 on 2 ranks (an untrained DiT-Pixel/4 at 64 px, one DDPM
#               step: the model is beside the point, the parts and the merge are measured): peak RSS of each rank
#               and the size of samples.npz. Goal: ≤ 1.5 GB per process.
#   checkpoint  `moh sample --checkpoint` of a MoH-DiT-XL/2-90 run (a real training checkpoint: model, EMA, AdamW
#               state and generator states, one step on random latents of a random SD-VAE): peak RSS against the
#               EMA file's size. Goal: ≤ 1.3 × the EMA file + one batch's activations (the VAE decoder included).
# usage: bench/sample_memory.sh path/to/moh path/to/python [samples|checkpoint|all] [OUT.jsonl]
# The checkpoint case writes ~11 GB and needs ~15 GB of memory to train its one step.
set -euo pipefail
MOH=$(readlink -f "$1") PY=$2 WHAT=${3:-all} OUT=${4:-/dev/stdout}
cd "$(dirname "$0")/.."
tmp=${MOH_BENCH_TMP:-$(mktemp -d)}
trap 'rm -rf "$tmp"' EXIT
peak_mb() { grep -o 'maxrss_kb=[0-9]*' "$1" | tail -1 | cut -d= -f2 | awk '{ print int($1 / 1024) }'; }
machine=$("$MOH" --version 2>/dev/null | tr '\n' ' ' | sed 's/"/\\"/g')

if [ "$WHAT" = samples ] || [ "$WHAT" = all ]; then
  S=(configs/fashion_mnist/dit_pixel.yaml --untrained --set model.img_size=64 --num-samples 50000 --batch 250
     --steps 1 --cfg-scale 1 --labels random --out "$tmp/s")
  start=$(date +%s)
  port=$((20000 + RANDOM % 20000))
  for r in 0 1; do
    OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r \
      /usr/bin/time -f 'maxrss_kb=%M' -o "$tmp/rank$r.rss" "$MOH" sample "${S[@]}" >"$tmp/rank$r.log" 2>&1 &
  done
  wait
  secs=$(( $(date +%s) - start ))
  size=$(stat -c %s "$tmp/s/samples.npz")
  "$PY" -c "import numpy as np, sys; a = np.load(sys.argv[1], mmap_mode='r')['arr_0']; assert a.shape == (50000, 64, 64, 3), a.shape" "$tmp/s/samples.npz"
  echo "{\"what\": \"sample_50k_64px_2ranks\", \"rank0_peak_rss_mb\": $(peak_mb "$tmp/rank0.rss"), \"rank1_peak_rss_mb\": $(peak_mb "$tmp/rank1.rss"), \"samples_npz_bytes\": $size, \"seconds\": $secs, \"machine\": \"$machine\"}" >> "$OUT"
  rm -rf "$tmp/s"
fi

if [ "$WHAT" = checkpoint ] || [ "$WHAT" = all ]; then
  "$PY" tests/diffusion/ref_sd_vae.py "$tmp/vae" >/dev/null
  "$PY" - "$tmp" <<'EOF'
import sys, numpy as np
rng = np.random.default_rng(0)
np.savez(sys.argv[1] + "/images.npz", arr_0=rng.integers(0, 256, size=(64, 32, 32, 3), dtype=np.uint8),
         arr_1=np.arange(64) % 1000)
EOF
  "$MOH" export-images --images "$tmp/images.npz" --out "$tmp/tree/train" >/dev/null
  C=(configs/imagenet/moh_dit_xl_2_90.yaml --set model.img_size=32 --set diffusion.vae_weights="$tmp/vae/vae.safetensors")
  "$MOH" extract-latents "${C[@]}" --set data.dataset=image_folder --set data.root="$tmp/tree" --out "$tmp/lat" >/dev/null 2>&1
  "$MOH" train "${C[@]}" --set data.root="$tmp/lat" --set data.batch_size=2 --set train.max_steps=1 \
    --run-dir "$tmp/xl" >/dev/null 2>&1
  ckpt="$tmp/xl/checkpoints/$(cat "$tmp/xl/checkpoints/latest")"
  ema=$(stat -c %s "$ckpt/ema.safetensors")
  total=$(du -sb "$ckpt" | cut -f1)
  /usr/bin/time -f 'maxrss_kb=%M' -o "$tmp/xl.rss" "$MOH" sample --checkpoint "$tmp/xl" --num-samples 4 --batch 4 \
    --steps ddim2 --out "$tmp/xs" >/dev/null 2>&1
  peak=$(peak_mb "$tmp/xl.rss")
  echo "{\"what\": \"sample_from_moh_dit_xl_2_90_checkpoint\", \"peak_rss_mb\": $peak, \"ema_file_bytes\": $ema, \"checkpoint_bytes\": $total, \"peak_over_ema\": $(awk -v p="$peak" -v e="$ema" 'BEGIN { printf "%.3f", p * 1048576 / e }'), \"machine\": \"$machine\"}" >> "$OUT"
fi
