#!/usr/bin/env bash
# Runs `DEMO_QUICK=1 scripts/demo.sh` with an existing build and checks that its artefacts exist and the reported
# numbers are finite. usage: demo_test.sh path/to/moh repo_root
set -euo pipefail
MOH=$(realpath "$1")
cd "$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
DEMO_QUICK=1 DEMO_SKIP_SETUP=1 MOH="$MOH" DEMO_OUT="$out/demo" bash scripts/demo.sh > "$out/log" 2>&1 || { tail -30 "$out/log"; exit 1; }
for f in samples/grid.png samples/samples.npz classifier/eval/head_load.png classifier/eval/report.json fid/report.md fid/report.json; do
  [ -s "$out/demo/$f" ] || { echo "FAIL: missing $f"; exit 1; }
done
grep -q "FID report:" "$out/log" || { echo "FAIL: demo did not print the artefact paths"; exit 1; }
# The whole demo's ETA is the first line, and every stage's seconds follow (the README's times come from them).
head -n1 "$out/log" | grep -Eq '^== demo: about [0-9]+ min in all \(setup \+ build 0 s, classifier [0-9]+ s' ||
  { echo "FAIL: first line is not the ETA: $(head -n1 "$out/log")"; exit 1; }
for stage in "setup + build" "classifier training" "classifier evaluation + head load + FID reference statistics" \
  "diffusion training" "sampling" "FID report"; do
  grep -Eq "^== ${stage//+/\\+}: [0-9]+ s" "$out/log" || { echo "FAIL: no seconds for $stage"; exit 1; }
done
# Every metric in the FID report is a finite number (JSON has no NaN/Infinity literals; nlohmann writes null for them).
if grep -A8 '"metrics"' "$out/demo/fid/report.json" | grep -q 'null'; then echo "FAIL: non-finite metric"; exit 1; fi
for key in fid sfid inception_score precision recall; do
  grep -q "\"$key\": [-0-9]" "$out/demo/fid/report.json" || { echo "FAIL: $key missing"; exit 1; }
done
echo "demo quick: ok"
