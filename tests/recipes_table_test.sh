#!/usr/bin/env bash
# studies/recipes/table.py (issue 55) on rows whose answers are known: MoH against dense (paired by seed, the 5 %
# verdict), the first step at or below the DDPM run's final FID, and the guidance sweep's table (sweep rows kept out of
# the step tables; a seed missing a scale left out of the means). Each case would fail a rule that ignored its inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tables compute t-intervals with scipy (studies/stats.py): the project venv's Python, else python3 with scipy.
PY=${PY:-$(command -v .venv/bin/python || command -v python3)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# row ID MODEL RECIPE SEED STEP FID ACC [CFG]: one line as studies/recipes/run.sh writes it
row() {
  local cfg=${8:-4}
  echo "{\"id\": \"$1\", \"model\": \"$2\", \"recipe\": \"$3\", \"seed\": $4, \"step\": $5, \"fid\": $6," \
    "\"sample_acc\": $7, \"machine\": \"m\", \"libtorch\": \"l\", \"feature_sha256\": \"ffffffff\"," \
    "\"reference_sha256\": \"rrrrrrrr\", \"samples\": 10, \"sampler\": \"--sampler heun --cfg-scale $cfg\", \"nfe\": 17}"
}
{ for s in 1 2 3; do
    row "dit_ddpm_s$s" dit ddpm $s 200 40 30; row "moh_ddpm_s$s" moh ddpm $s 200 40.1 30   # +0.25 %: met
    row "dit_flow_s${s}_1" dit flow $s 100 39 50; row "dit_flow_s$s" dit flow $s 200 20 60
    row "moh_flow_s${s}_1" moh flow $s 100 45 50; row "moh_flow_s$s" moh flow $s 200 30 60  # +50 %: not met
  done; } >"$T/rows.jsonl"
{ for s in 1 2; do
    row "dit_flow_s${s}_200_cfg1" dit flow $s 200 25 20 1; row "dit_flow_s${s}_200_cfg2.5" dit flow $s 200 $((16 + s)) 45 2.5
  done
  row "dit_flow_s3_200_cfg1" dit flow 3 200 99 99 1; } >"$T/cfg_rows.jsonl"   # seed 3 lacks 2.5: not in the means
out=$("$PY" studies/recipes/table.py "$T/rows.jsonl" "$T/cfg_rows.jsonl")
grep -q "| DDPM | 200 | 1, 2, 3 | 40.00 | 40.10 | .* | met |" <<<"$out" || fail "+0.25 % in every seed is met: $out"
grep -q "| flow | 200 | 1, 2, 3 | 20.00 | 30.00 | .* | not met |" <<<"$out" || fail "+50 % is not met: $out"
grep -q "| flow | DiT | 1 | 40.00 (200) | 100 | 39.00 | 0.50 |" <<<"$out" || fail "DiT flow reaches 40 at step 100: $out"
grep -q "| flow | MoH | 1 | 40.10 (200) | 200 | 30.00 | 1.00 |" <<<"$out" || fail "MoH flow reaches 40.1 at 200: $out"
grep -q "| flow | DiT | 200 | 1, 2 | 25.00 / 20.0 | 17.50 / 45.0 | 20.00 / 60.0 | 2.5 |" <<<"$out" ||
  fail "the sweep's means over seeds 1, 2 and the lowest-FID scale: $out"
! grep -q "| flow | MoH | 200 | .* / " <<<"$out" || fail "a model without sweep rows has no sweep line: $out"
! grep -q "99" <<<"$out" || fail "sweep rows stay out of the step tables, and a seed missing a scale out of the means"
! grep -q "Warning: these rows ran on" <<<"$out" || fail "rows without device records must not warn"
# one row sampled on another device than the rest: named (studies/provenance.py, shared with studies/ct_plateau/table.py)
sed -i 's/"nfe": 17}/"nfe": 17, "sampled_on": "cuda:0 (NVIDIA H200)"}/' "$T/rows.jsonl"
! grep -q "Warning: these rows ran on" <<<"$("$PY" studies/recipes/table.py "$T/rows.jsonl")" ||
  fail "rows of one device must not warn"
sed -i '/"id": "moh_flow_s2"/s/NVIDIA H200)"/AMD EPYC)", "trained_on": "cpu (AMD EPYC)"/; /"id": "moh_flow_s2"/s/cuda:0 (AMD/cpu (AMD/' "$T/rows.jsonl"
out=$("$PY" studies/recipes/table.py "$T/rows.jsonl")
grep -q "Warning: these rows ran on 2 devices (cpu (AMD EPYC); cuda:0 (NVIDIA H200))" <<<"$out" ||
  fail "a row of another device must be named: $out"
echo "recipes_table: ok"
