#!/usr/bin/env bash
# The shape of the ImageNet path, scaled down (issue: ImageNet-ordered latents, several ranks, many samples):
#   an ImageFolder tree of 1,000 class folders sorted on disk (2 tiny images each) → `moh extract-latents` (a random
#   SD-VAE with sd-vae-ft-ema's layout at a quarter of its widths, written by diffusers) in class-sorted shards of 64
#   → `moh train` of a latent MoH-DiT-S/2-75 → `moh sample` of 2,000 images → `moh fid`. It asserts:
#   - batch class mixing: a global batch of 256 holds ≈ 226 of the 1,000 classes (DiT's DistributedSampler); a loader
#     that pooled a few sorted shards at a time would give ≤ 128;
#   - exact resume after kill -9 on 2 processes: the final checkpoint files equal an uninterrupted 2-process run's;
#   - per-rank sample parts merged exactly: 2 processes, one of them killed half-way and the run resumed from its parts,
#     write the samples.npz one process writes, byte for byte;
#   - bounded memory: peak RSS of each sampling process and of the extraction stays under MAX_RSS_MB.
# usage: tests/scale_check.sh path/to/moh path/to/python (with diffusers; the project venv)    [ctest: scale_check]
set -u
MOH=$(readlink -f "$1") PY=$2
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 pass=0
MAX_RSS_MB=${MAX_RSS_MB:-1500}
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The memory check before training and sampling (tests/memory_check_test.sh tests it) runs once, in the 2-process
# training of the real run's shape (where, beside ctest's other tests, it once estimated 32.8 GiB for 2 × 128 latents:
# probe batches measured at different calls of their step, since fixed); the other runs skip it to keep this test short.
export MOH_MEMORY_CHECK=${MOH_MEMORY_CHECK:-0}
peak_mb() { grep -o 'maxrss_kb=[0-9]*' "$1" | tail -1 | cut -d= -f2 | awk '{ print int($1 / 1024) }'; }
timed() {  # timed LOG CMD...: runs CMD, appends its peak RSS to LOG
  /usr/bin/time -f 'maxrss_kb=%M' -a -o "$1" "${@:2}"
}

# --- data: 1,000 sorted class folders, extracted in class-sorted shards -------------------------------------------
"$PY" - "$tmp" <<'EOF' || exit 1
import sys, numpy as np
rng = np.random.default_rng(0)
np.savez(sys.argv[1] + "/images.npz", arr_0=rng.integers(0, 256, size=(2000, 16, 16, 3), dtype=np.uint8),
         arr_1=np.repeat(np.arange(1000), 2))
EOF
# The SD VAE's layout at a quarter of its widths (diffusers writes it; the toolkit reads the widths from the file): the
# pipeline's shape, not the SD VAE's encode and decode cost (on 2 CPU cores 3 of this check's 5 minutes at full width).
"$PY" tests/diffusion/ref_sd_vae.py "$tmp/vae" --widths 32,64,128,128 >/dev/null || exit 1
"$MOH" export-images --images "$tmp/images.npz" --out "$tmp/tree/train" >/dev/null || exit 1
"$MOH" export-images --images "$tmp/images.npz" --out "$tmp/tree/val" >/dev/null || exit 1  # the feature classifier's
CFG=configs/imagenet/moh_dit_s_2_75.yaml
COMMON=(--set model.img_size=16 --set diffusion.vae_weights="$tmp/vae/vae.safetensors")
timed "$tmp/extract.rss" "$MOH" extract-latents $CFG "${COMMON[@]}" --set data.dataset=image_folder \
  --set data.root="$tmp/tree" --shard-size 64 --out "$tmp/lat" >/dev/null 2>"$tmp/extract.log" ||
  { cat "$tmp/extract.log"; exit 1; }
[ "$(peak_mb "$tmp/extract.rss")" -lt "$MAX_RSS_MB" ] && ok "extract-latents peak RSS $(peak_mb "$tmp/extract.rss") MB" ||
  bad "extract-latents peak RSS $(peak_mb "$tmp/extract.rss") MB >= $MAX_RSS_MB"

# --- training: class mixing of every batch, 2 ranks, kill -9 and resume -------------------------------------------
TRAIN=("${COMMON[@]}" --set data.root="$tmp/lat" --set data.batch_size=256 --set train.epochs=3 --set train.max_steps=0
       --set train.log_every_steps=1 --set train.ckpt_every_epochs=1 --set sampling.batch_size=100
       --set sampling.steps=ddim2 --set sampling.per_class=2)
"$MOH" train $CFG "${TRAIN[@]}" --set train.epochs=1 --run-dir "$tmp/mix" >/dev/null 2>&1 || bad "1-process training"
classes=$(grep -o '"classes_per_batch":[0-9.]*' "$tmp/mix/metrics.jsonl" | cut -d: -f2 | sort -n | head -1)
awk -v c="${classes:-0}" 'BEGIN { exit !(c >= 200) }' && ok "fewest classes in a batch of 256: $classes of 1000 (DiT: ~226)" ||
  bad "a batch of 256 held only ${classes:-?} classes (class-sorted stream?)"
MOH_MEMORY_CHECK=verbose "$MOH" launch --nproc 2 -- train $CFG "${TRAIN[@]}" --run-dir "$tmp/full" >/dev/null \
  2>"$tmp/full.log" || { bad "2-process training: $(grep -m1 "memory check:" "$tmp/full.log") $(tail -2 "$tmp/full.log")"; }
"$MOH" launch --nproc 2 -- train $CFG "${TRAIN[@]}" --run-dir "$tmp/kill" >/dev/null 2>&1 &
victim=$!
for _ in $(seq 1 6000); do [ -e "$tmp/kill/checkpoints/latest" ] && break; sleep 0.02; done
kill -9 $victim 2>/dev/null
wait $victim 2>/dev/null
sleep 1  # the ranks die with the launcher
"$MOH" launch --nproc 2 -- train $CFG "${TRAIN[@]}" --run-dir "$tmp/kill" --resume auto >/dev/null 2>"$tmp/resume.log" ||
  bad "resume: $(tail -2 "$tmp/resume.log")"
last=$(cat "$tmp/full/checkpoints/latest" 2>/dev/null)
same=1
for f in model.safetensors ema.safetensors optimizer.safetensors rng.safetensors; do
  cmp -s "$tmp/full/checkpoints/$last/$f" "$tmp/kill/checkpoints/$last/$f" || same=0
done
[ -n "$last" ] && [ $same = 1 ] && ok "kill -9 + --resume auto on 2 ranks: checkpoint $last byte-identical" ||
  bad "kill -9 + --resume auto on 2 ranks: checkpoint ${last:-?} differs"

# --- sampling: 2,000 images, per-rank parts, a killed rank, resume, merge ------------------------------------------
SAMPLE=(--checkpoint "$tmp/full" --num-samples 2000 --labels random)
timed "$tmp/one.rss" "$MOH" sample "${SAMPLE[@]}" --out "$tmp/s1" >/dev/null 2>"$tmp/s1.log" || bad "1-process sampling: $(tail -1 "$tmp/s1.log")"
"$MOH" launch --nproc 2 -- sample "${SAMPLE[@]}" --out "$tmp/s2" >/dev/null 2>&1 &
victim=$!
for _ in $(seq 1 6000); do [ "$(ls "$tmp/s2/parts" 2>/dev/null | grep -c batch_)" -ge 8 ] && break; sleep 0.02; done
kill -9 $victim 2>/dev/null
wait $victim 2>/dev/null
sleep 1
parts=$(ls "$tmp/s2/parts" 2>/dev/null | grep -c batch_)
: > "$tmp/two.rss"
OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 20000)) WORLD_SIZE=2 \
  bash -c 'for r in 0 1; do RANK=$r LOCAL_RANK=$r /usr/bin/time -f "maxrss_kb=%M" -a -o "$1.$r" "${@:2}" >/dev/null 2>&1 & done; wait' \
  _ "$tmp/two.rss" "$MOH" sample "${SAMPLE[@]}" --out "$tmp/s2"
cmp -s "$tmp/s1/samples.npz" "$tmp/s2/samples.npz" && ok "2 ranks, killed after $parts of 20 parts and resumed: samples.npz byte-identical" ||
  bad "2-rank resumed samples.npz differs from one process's"
[ ! -e "$tmp/s2/parts" ] && ok "parts removed after the merge" || bad "parts left behind"
for f in "$tmp/one.rss" "$tmp/two.rss.0" "$tmp/two.rss.1"; do
  mb=$(peak_mb "$f")
  [ -n "$mb" ] && [ "$mb" -lt "$MAX_RSS_MB" ] && ok "sampling peak RSS $mb MB ($(basename "$f"))" || bad "sampling peak RSS ${mb:-?} MB ($(basename "$f"))"
done
"$PY" -c "import numpy as np, sys; d = np.load(sys.argv[1]); assert d['arr_0'].shape == (2000, 16, 16, 3) and d['arr_0'].dtype == np.uint8; assert d['arr_1'].max() < 1000" \
  "$tmp/s2/samples.npz" && ok "numpy reads samples.npz: (2000, 16, 16, 3) uint8" || bad "numpy cannot read samples.npz"

# --- FID of the samples against the tree's images (a classifier's features: the plumbing, not image quality) ------
"$MOH" train configs/fashion_mnist/mha_vit_nano.yaml --set data.dataset=image_folder --set data.root="$tmp/tree" \
  --set model.num_classes=1000 --set train.max_steps=1 --set data.limit_val=200 --run-dir "$tmp/cls" >/dev/null 2>&1 ||
  bad "feature classifier"
"$MOH" fid --samples "$tmp/s2/samples.npz" --ref "$tmp/images.npz" --features "classifier:$tmp/cls" --out "$tmp/fid" \
  >"$tmp/fid.log" 2>&1 && grep -q '"fid"' "$tmp/fid/report.json" && ok "moh fid: $(grep -m1 -o 'FID [^,]*' "$tmp/fid.log")" ||
  bad "moh fid: $(tail -2 "$tmp/fid.log")"

echo "scale_check: $pass passed, $fails failed"
[ $fails = 0 ]
