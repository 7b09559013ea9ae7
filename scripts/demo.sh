#!/usr/bin/env bash
# The README's demo: setup + build, then the three journeys on the embedded dataset (Fashion-MNIST):
#   1. train a MoH-ViT classifier from YAML and evaluate it (top-1, head-load heat map),
#   2. train a pixel-space MoH-DiT from YAML (flow matching) and sample 10 images per class with classifier-free
#      guidance,
#   3. compute the FID report of those samples with the trained classifier as the feature network.
# Full run: 8 to 17 min on a fresh 2-core machine by its CPU kind (its first line says how long here, its last how long
# it took; docs/results/demo/README.md).
# DEMO_QUICK=1: the same with few steps (a few minutes; used by a test). DEMO_ESTIMATE_ONLY=1: print the first line.
# Environment: DEMO_OUT (default runs/demo), DEMO_SKIP_SETUP=1 + MOH=path/to/moh to use an existing build,
#   MOH_LIBTORCH=pip to build and run against the pinned pip LibTorch 2.x (build-torch2/) instead of Debian's 1.13.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [ "${MOH_LIBTORCH:-debian}" = pip ]; then MOH=${MOH:-build-torch2/moh}; else MOH=${MOH:-build/moh}; fi
OUT=${DEMO_OUT:-runs/demo}
if [ "${DEMO_QUICK:-0}" = 1 ]; then
  CLS_STEPS=40 VAL=1000 DIT_STEPS=120 PER_CLASS=2 STEPS=3 REF=fashion_mnist:test:1000
else
  CLS_STEPS=150 VAL=0 DIT_STEPS=750 PER_CLASS=10 STEPS=6 REF=fashion_mnist:test
fi

# The whole demo's ETA, first, from the timed runs of this CPU kind (docs/results/demo/README.md); after each stage
# the rest is rescaled by how fast the stages so far ran.
cpu_kind() {  # amd-avx512-bf16 | amd-avx2 | intel-amx | other, from the CPU's vendor and flags (DEMO_CPUINFO: a test's)
  local info=${DEMO_CPUINFO:-/proc/cpuinfo}
  if grep -q '^vendor_id.*AuthenticAMD' "$info" && grep -qw avx512_bf16 "$info"; then echo amd-avx512-bf16
  elif grep -q '^vendor_id.*AuthenticAMD' "$info" && grep -qw avx2 "$info" && ! grep -qw avx512f "$info"; then
    echo amd-avx2
  elif grep -q '^vendor_id.*GenuineIntel' "$info" && grep -qw amx_bf16 "$info"; then echo intel-amx
  else echo other; fi
}
cpu_name() {  # "AMD EPYC, AVX2 only"
  local info=${DEMO_CPUINFO:-/proc/cpuinfo} vec="no AVX2"
  if grep -qw avx512f "$info"; then vec="AVX-512"; elif grep -qw avx2 "$info"; then vec="AVX2 only"; fi
  echo "$(sed -n 's/^model name[[:space:]]*: //p' "$info" | head -n1), $vec"
}
KIND=$(cpu_kind)
if [ "${DEMO_SKIP_SETUP:-0}" = 1 ]; then est_setup=0; elif [ -x "$MOH" ]; then est_setup=20; fi
est_eval=$((VAL == 0 ? 38 : 6))  # stage 1's evaluation includes the FID reference statistics computed beside it
case $KIND in
  amd-avx512-bf16)  # timed: demo_amd512_bf16kernel_2026-12-04.log (classifier 59 + 21 s, DiT 196 s in bf16)
    est_setup=${est_setup:-220} est_eval=$((VAL == 0 ? 21 : 4))
    est_cls=$((5 + CLS_STEPS * 36 / 100 + est_eval)) est_dit=$((10 + DIT_STEPS * 25 / 100))
    basis="timed on this CPU kind (AMD EPYC with AVX-512 + bf16)" ;;
  intel-amx)  # timed: demo_xeon_2026-12-05.log (classifier 83 + 51 s, DiT 216 s; `auto` took bf16 for both)
    est_setup=${est_setup:-300} est_eval=$((VAL == 0 ? 51 : 8))
    est_cls=$((5 + CLS_STEPS * 52 / 100 + est_eval)) est_dit=$((10 + DIT_STEPS * 28 / 100))
    basis="timed on this CPU kind (Intel Xeon with AVX-512 + AMX)" ;;
  amd-avx2)  # timed: demo_amd_avx2_2026-12-07.log (classifier 122 + 29 s, DiT 458 s in fp32: no bf16 here); setup +
    # build not timed there (DEMO_SKIP_SETUP=1): the earlier estimate
    est_setup=${est_setup:-370} est_eval=$((VAL == 0 ? 29 : 5))
    est_cls=$((5 + CLS_STEPS * 78 / 100 + est_eval)) est_dit=$((10 + DIT_STEPS * 60 / 100))
    basis="timed on this CPU kind (AMD EPYC with AVX2 only)" ;;
  *)
    est_setup=${est_setup:-350} est_cls=$((15 + CLS_STEPS * 3 / 4 + est_eval)) est_dit=$((10 + DIT_STEPS * 53 / 100))
    basis="no timed run on this CPU kind ($(cpu_name)): an estimate for fp32 steps" ;;
esac
est_rest=$((12 + PER_CLASS * 4 / 10))
echo "== demo: about $(((est_setup + est_cls + est_dit + est_rest + 30) / 60)) min in all (setup + build ${est_setup} s," \
  "classifier ${est_cls} s, diffusion ${est_dit} s, samples + FID ${est_rest} s; $basis)"
[ "${DEMO_ESTIMATE_ONLY:-0}" = 1 ] && exit 0
if [ "${DEMO_SKIP_SETUP:-0}" != 1 ]; then MOH_BUILD_TARGETS=${MOH_BUILD_TARGETS:-moh} bash scripts/setup.sh; fi
echo "== setup + build: $(( $(date +%s) - start )) s"
if [ -e "$OUT" ]; then echo "== removing the previous demo output $OUT"; rm -rf "$OUT"; fi
mkdir -p "$OUT"

echo "== $($MOH --version | tr '\n' ' ')"
lap_start=$(date +%s)
work_start=$lap_start est_done=$est_setup
lap() {  # a stage's seconds and the demo's time left (docs/results/demo/README.md reads the seconds from the log)
  local now left
  now=$(date +%s)
  est_done=$((est_done + $2))
  left=$(((est_setup + est_cls + est_dit + est_rest - est_done) * (now - work_start) / (est_done - est_setup + 1)))
  if [ "$left" -ge 90 ]; then left="about $(((left + 30) / 60)) min"; else left="about $left s"; fi
  [ "$est_done" -lt $((est_setup + est_cls + est_dit + est_rest)) ] && left=" (the demo: $left left)" || left=""
  echo "== $1: $((now - lap_start)) s$left"
  lap_start=$now
}
echo "== 1/3 classifier: MoH-ViT-Nano on Fashion-MNIST ($CLS_STEPS steps)"
# One epoch over a seeded subset of CLS_STEPS batches of 128, so that the cosine schedule ends at the last step (it
# reached a higher top-1 in 150 steps than 200 steps cut off mid-schedule did); the run's own validation on 1,000
# test images, `moh eval` below on all of them.
$MOH train configs/fashion_mnist/moh_vit_nano.yaml --run-dir "$OUT/classifier" --set train.epochs=1 \
  --set data.limit_train=$((CLS_STEPS * 128)) --set schedule.warmup_epochs=0.1 --set data.limit_val=1000 \
  --set train.log_every_steps=20
lap "classifier training" $((est_cls - est_eval))
# The FID reference statistics (stage 3) need only this classifier: computed beside its evaluation, each in one
# 1-thread process (this small model's forward gains nothing from a second intra-op thread: both in 29 s where one
# after the other took 45 s on an AMD EPYC, docs/results/demo/README.md); the statistics' own lines go to a log.
OMP_NUM_THREADS=1 $MOH ref-stats --images $REF --features "classifier:$OUT/classifier" \
  --out "$OUT/fm_test_stats.npz" > "$OUT/ref_stats.log" 2>&1 &
ref_pid=$!
trap 'kill "$ref_pid" 2> /dev/null || true' EXIT
OMP_NUM_THREADS=1 $MOH eval configs/fashion_mnist/moh_vit_nano.yaml --checkpoint "$OUT/classifier" \
  --set data.limit_val=$VAL --out "$OUT/classifier/eval"
if ! wait "$ref_pid"; then cat "$OUT/ref_stats.log" >&2; exit 1; fi
trap - EXIT
grep -v '^features' "$OUT/ref_stats.log" || true
lap "classifier evaluation + head load + FID reference statistics" $est_eval

# The precision `auto` picks for the DiT here, for the stage's first line (measured once, as moh train measures it, and
# cached for it).
DIT_PRECISION=$($MOH config configs/fashion_mnist/moh_sit_pixel_demo.yaml --precision)
echo "== 2/3 diffusion: MoH-DiT-Pixel/2-75 trained by flow matching on Fashion-MNIST ($DIT_STEPS steps in" \
  "${DIT_PRECISION%% *}), then CFG samples"
# SiT's recipe (linear path, velocity; configs/fashion_mnist/moh_sit_pixel.yaml): in the recipe study (docs/results/recipes/README.md)
# comparison it reached a far lower FID than DiT's DDPM recipe in this budget (flow + REPA lower still, but REPA needs
# a second trained classifier as its encoder). moh_sit_pixel_demo.yaml: the 2×2-pixel-patch model (the 4×4 one left
# visible patch seams), 750 steps on a cosine at a high lr, in two 1-thread processes (docs/results/demo/README.md).
$MOH train configs/fashion_mnist/moh_sit_pixel_demo.yaml --run-dir "$OUT/dit" --set data.limit_train=$((DIT_STEPS * 64))
lap "diffusion training" $est_dit
# Heun, CFG 4 only in the cleaner half of the noise range (6 steps: 17 network evaluations per image).
$MOH sample --checkpoint "$OUT/dit" --sampler heun --steps $STEPS --cfg-scale 4 --cfg-interval 0,0.5 \
  --set sampling.per_class=$PER_CLASS --out "$OUT/samples"
lap "sampling" 8

echo "== 3/3 FID report (classifier features; reference = Fashion-MNIST test set, its statistics from stage 1)"
$MOH fid --samples "$OUT/samples/samples.npz" --ref "$OUT/fm_test_stats.npz" --features "classifier:$OUT/classifier" \
  --out "$OUT/fid"
lap "FID report" $((est_rest - 8))

echo
echo "Artefacts:"
echo "  sample grid:     $OUT/samples/grid.png"
echo "  head-load plot:  $OUT/classifier/eval/head_load.png"
echo "  FID report:      $OUT/fid/report.md"
took=$(( $(date +%s) - start ))
echo "demo finished in $((took / 60)) min $((took % 60)) s ($took s; the first line estimated" \
  "$(((est_setup + est_cls + est_dit + est_rest + 30) / 60)) min)"
