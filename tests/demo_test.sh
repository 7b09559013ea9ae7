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
tail -n1 "$out/log" | grep -Eq '^demo finished in [0-9]+ min [0-9]+ s \([0-9]+ s; the first line estimated [0-9]+ min\)$' ||
  { echo "FAIL: last line is not the demo's time: $(tail -n1 "$out/log")"; exit 1; }
# The estimate follows the CPU kind: timed kinds by their own figures, others say they have none.
kind() {  # kind VENDOR FLAGS EXPECTED
  printf 'vendor_id\t: %s\nmodel name\t: Test CPU\nflags\t\t: fpu %s\n' "$1" "$2" >"$out/cpuinfo"
  line=$(DEMO_CPUINFO="$out/cpuinfo" DEMO_ESTIMATE_ONLY=1 MOH=/nonexistent bash scripts/demo.sh)
  grep -qF -- "$3" <<<"$line" || { echo "FAIL: $1 [$2]: expected '$3' in: $line"; exit 1; }
}
kind AuthenticAMD "avx2 avx512f avx512_bf16" "about 9 min in all (setup + build 220 s"
kind AuthenticAMD "avx2 avx512f avx512_bf16" "timed on this CPU kind (AMD EPYC with AVX-512 + bf16)"
kind GenuineIntel "avx2 avx512f amx_tile amx_bf16" "about 11 min in all (setup + build 300 s"
kind GenuineIntel "avx2 avx512f amx_tile amx_bf16" "timed on this CPU kind (Intel Xeon with AVX-512 + AMX)"
kind AuthenticAMD "avx avx2" "about 17 min in all (setup + build 370 s"
kind AuthenticAMD "avx avx2" "timed on this CPU kind (AMD EPYC with AVX2 only)"
kind GenuineIntel "avx avx2 avx512f" "no timed run on this CPU kind (Test CPU, AVX-512): an estimate for fp32 steps"
kind GenuineIntel "avx avx2 avx512f" "about 16 min in all (setup + build 350 s"
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
