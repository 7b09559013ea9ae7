#!/usr/bin/env bash
# usage: tests/nocv_test.sh MOH: what a build without OpenCV (-DMOH_WITH_OPENCV=OFF, the GPU machines' build) still
# does end to end on the embedded Fashion-MNIST — train a classifier and a DiT, evaluate, sample to .npz (no grid.png),
# FID from .npz with the trained classifier as feature network — and what it refuses with one line and exit 2 before
# any work: image folders, image files, PNG/JPEG export, the input-pipeline benchmark.
set -uo pipefail
MOH=$(realpath "$1")
R=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
pass=0 fails=0
# expect CODE PATTERN -- ARGS...: moh ARGS exits CODE and its stderr (exit 2: exactly one line) matches PATTERN.
expect() {
  local code=$1 pat=$2 rc
  shift 3
  "$MOH" "$@" >out 2>err
  rc=$?
  if [ $rc != "$code" ] || ! grep -q -- "$pat" err out || { [ "$code" = 2 ] && [ "$(wc -l <err)" != 1 ]; }; then
    echo "FAIL (exit $rc, want $code /$pat/): moh $*"; sed 's/^/  | /' err | tail -n 3; fails=$((fails + 1))
  else pass=$((pass + 1)); fi
}
if "$MOH" --version | grep -q "OpenCV: yes"; then echo "nocv_test: $MOH has OpenCV: nothing to check here"; exit 0; fi
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  echo "nocv_test: skipped: dataset-fashion-mnist not installed"; exit 0; fi

small=(--set data.limit_train=256 --set train.epochs=1 --set train.processes=1 --set train.device=cpu)
expect 0 '"steps":4' -- train "$R/configs/fashion_mnist/moh_vit_nano.yaml" "${small[@]}" --set data.batch_size=64 \
  --set data.limit_val=128 --run-dir cls
expect 0 '"steps":4' -- train "$R/configs/fashion_mnist/moh_dit_pixel.yaml" "${small[@]}" --set data.batch_size=64 --run-dir dit
expect 0 'top1' -- eval --checkpoint cls --device cpu --json
expect 0 'samples.npz' -- sample --checkpoint dit --num-samples 40 --steps 5 --cfg-scale 1.5 --seed 1 --out s1 --device cpu
expect 0 'samples.npz' -- sample --checkpoint dit --num-samples 40 --steps 5 --cfg-scale 1.5 --seed 2 --out s2 --device cpu
[ -f s1/samples.npz ] && [ ! -e s1/grid.png ] || { echo "FAIL: s1: want samples.npz and no grid.png"; fails=$((fails + 1)); }
expect 0 '"fid"' -- fid s1/samples.npz s2/samples.npz --features classifier:cls --metrics fid,is --device cpu --json
# Curves as SVG (no PNG without OpenCV); a classifier and a DiT get separate loss panels.
expect 0 'no PNG: built without OpenCV' -- plot cls dit --out plots
for want in 'Training curves: cls and dit' 'training loss of the classifier runs' 'training loss of the dit runs'; do
  grep -q "$want" plots/curves.svg && pass=$((pass + 1)) || { echo "FAIL: plots/curves.svg lacks '$want'"; fails=$((fails + 1)); }
done

# Refused before any work, nothing written.
mkdir -p tree/train/a && printf 'x' >tree/train/a/1.png
expect 2 'needs OpenCV' -- train "$R/configs/fashion_mnist/moh_vit_nano.yaml" --set data.dataset=image_folder \
  --set data.root=tree --run-dir never
[ ! -e never ] || { echo "FAIL: a refused run created its run directory"; fails=$((fails + 1)); }
expect 2 'OpenCV' -- export-images --images fashion_mnist:train:10 --out png_out
expect 2 'OpenCV' -- bench data --images 8
expect 2 'OpenCV' -- fid tree/train s1/samples.npz --features classifier:cls --metrics fid
echo "nocv_test: $pass passed, $fails failed"
exit $((fails > 0))
