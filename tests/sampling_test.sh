#!/usr/bin/env bash
# The FID-versus-compute journey at toy size (docs/SAMPLING.md): a 2-step MoH-DiT-Pixel/4-75 and a 20-step ViT-Nano
# feature network, then studies/fid_curve/run.sh over two settings of the ODE samplers (DPM-Solver++ with a guidance
# interval, Heun guiding with fewer heads). Checks the counted network evaluations against the grids, one row per
# setting with finite FIDs, the plot, and that a second start skips the settings already measured.
# usage: sampling_test.sh path/to/moh repo_root
set -u
MOH=$1 ROOT=$2
cd "$ROOT" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  echo "SKIP: no Fashion-MNIST"; exit 0
fi
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
quiet() { "$@" >"$tmp/log" 2>&1 || { fail "$*"; tail -5 "$tmp/log"; exit 1; }; }
quiet "$MOH" train configs/fashion_mnist/moh_dit_pixel.yaml --set data.limit_train=64 --set data.batch_size=16 \
  --set train.max_steps=2 --set train.precision=fp32 --run-dir "$tmp/dit"
quiet "$MOH" train configs/fashion_mnist/moh_vit_nano.yaml --set data.limit_train=256 --set data.limit_val=64 \
  --set train.max_steps=2 --set train.processes=1 --set train.precision=fp32 --run-dir "$tmp/cls"
quiet "$MOH" ref-stats --images fashion_mnist:test:200 --features "classifier:$tmp/cls" --out "$tmp/ref.npz"
cat >"$tmp/settings" <<'EOF'
# name | moh sample flags
dpm4_int | --sampler dpm++2m --steps 4 --cfg-interval 0,0.5
heun3_guide1 | --sampler heun --steps 3 --guide-topk 1
EOF
run_curve() {
  SAMPLES=40 CFG=3 MOH=$MOH LABEL=toy bash studies/fid_curve/run.sh "$tmp/dit" "$tmp/curve" "$tmp/ref.npz" \
    "classifier:$tmp/cls" "$tmp/settings" >"$tmp/curve.log" 2>&1 || { fail "studies/fid_curve/run.sh"; tail -5 "$tmp/curve.log"; }
}
run_curve
# dpm++2m, 4 steps: t = 999, 749, 500, 250; u ≤ 0.5 only at 250 → 1 guided → 5. Heun, 3 steps: 5 evaluations, all
# guided (two forwards each) → 10.
python3 - "$tmp/curve/curve.jsonl" <<'EOF' || fail "curve.jsonl"
import json, math, sys
rows = {r["setting"]: r for r in map(json.loads, open(sys.argv[1]))}
assert set(rows) == {"dpm4_int", "heun3_guide1"}, rows.keys()
assert rows["dpm4_int"]["nfe"] == 5 and rows["heun3_guide1"]["nfe"] == 10, rows
for r in rows.values():
    assert r["samples"] == 40 and math.isfinite(r["fid"]) and r["seconds"] > 0, r
    assert r["sample_accuracy"] is not None and 0 <= r["precision"] <= 1, r
EOF
[ -s "$tmp/curve/curve.md" ] && grep -q "| toy | heun3_guide1 | 10 |" "$tmp/curve/curve.md" || fail "curve.md"
[ -s "$tmp/curve/plots/fid_curve.png" ] || fail "no fid_curve.png"
run_curve  # a second start: every setting is already there
[ "$(grep -c '' "$tmp/curve/curve.jsonl")" = 2 ] || fail "a second start measured again"
grep -q "^toy/" "$tmp/curve.log" && fail "a second start sampled again"
if [ $fails -gt 0 ]; then echo "sampling_test: $fails failure(s)"; exit 1; fi
echo "sampling_test: passed"
