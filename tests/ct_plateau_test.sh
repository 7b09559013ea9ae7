#!/usr/bin/env bash
# studies/ct_plateau/table.py (issue 57): the dense run's stop rule and the paired verdicts, on rows whose answers are
# known — each case is built so that a rule that ignored its inputs would answer another case wrongly.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tables compute t-intervals with scipy (studies/stats.py): the project venv's Python, else python3 with scipy.
PY=${PY:-$(command -v .venv/bin/python || command -v python3)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
common='"machine": "test", "libtorch": "test", "label": "cpu", "feature_sha256": "f", "reference_sha256": "r", "sampler": "s", "samples": 10'
check() { echo "{\"seed\": $1, \"epoch\": $2, \"step\": $2, \"fid_a\": $3, \"fid_b\": $4, $common}"; }
decide() { python3 studies/ct_plateau/table.py --decide "$T" "$1" "$2"; }

# stop rule: seed 1 improves by far more than its noise (go), seed 2 by less than 2 sigma (plateau), seed 3 gets
# worse (plateau), seed 4 improves clearly but reached the cap (max_epochs), seed 5 has one check only (go)
{ check 1 4 40 41; check 1 8 30 31
  check 2 4 20 22; check 2 8 19 21
  check 3 4 20 20.5; check 3 8 21 21.5
  check 4 4 40 41; check 4 8 30 31
  check 5 4 40 41; } >"$T/checks.jsonl"
[ "$(decide 1 40)" = go ] || fail "a clear improvement must continue, got $(decide 1 40)"
[ "$(decide 2 40)" = plateau ] || fail "an improvement within 2 sigma must stop, got $(decide 2 40)"
[ "$(decide 3 40)" = plateau ] || fail "a worse FID must stop, got $(decide 3 40)"
[ "$(decide 4 8)" = max_epochs ] || fail "the cap must stop, got $(decide 4 8)"
[ "$(decide 5 40)" = go ] || fail "one check cannot decide, got $(decide 5 40)"
[ "$(decide 6 40)" = go ] || fail "no checks: train the first segment, got $(decide 6 40)"

# verdicts over three seeds (dense FID 20 each): +1 % ± tiny is met, +20 % ± tiny not met, 0 % ± 30 % undecided
row() {
  echo "{\"id\": \"$1\", \"seed\": $2, \"what\": \"$3\", \"router\": \"$4\", \"choice\": \"c\", \"pct\": 25, \"extra_steps\": 5, \"dense_steps\": 20, \"dense_stop\": \"$6\", \"fid\": $5, $common}"
}
{ for s in 1 2 3; do row "d$s" $s dense "" 20 plateau; done
  row a1 1 converted near 20.2 x; row a2 2 converted near 20.21 x; row a3 3 converted near 20.19 x
  row b1 1 converted far 24 x; row b2 2 converted far 24.1 x; row b3 3 converted far 23.9 x
  row c1 1 converted wide 14 x; row c2 2 converted wide 20 x; row c3 3 converted wide 26 x; } >"$T/rows.jsonl"
out=$("$PY" studies/ct_plateau/table.py "$T")
grep -q "converted: near / c | 125 | .* | met | 3 |" <<<"$out" || fail "a +1 % setting must be met: $out"
grep -q "converted: far / c | 125 | .* | not met | 3 |" <<<"$out" || fail "a +20 % setting must be not met: $out"
grep -q "converted: wide / c | 125 | .* | undecided | 3 |" <<<"$out" || fail "a 0 ± 30 % setting must be undecided: $out"
grep -q "+1.0 % \[+0.9, +1.1\]" <<<"$out" || fail "the interval of the near setting (t = 4.303, n = 3): $out"
! grep -q "stopped before its plateau" <<<"$out" || fail "parents at their plateau need no warning"
sed -i 's/"dense_stop": "plateau"/"dense_stop": "budget"/' "$T/rows.jsonl"
out=$("$PY" studies/ct_plateau/table.py "$T")
grep -q "Seeds 1, 2, 3: the dense parent stopped before its plateau" <<<"$out" ||
  fail "parents stopped by the budget must be named"
# the devices moh recorded: one device, no warning; a row trained elsewhere is named
! grep -q "Warning: these rows ran on" <<<"$out" || fail "rows without device records must not warn"
on='"trained_on": "cuda:0 (NVIDIA H200)", "sampled_on": "cuda:0 (NVIDIA H200)"'
sed -i "s/\"fid\":/$on, \"fid\":/" "$T/rows.jsonl"
out=$("$PY" studies/ct_plateau/table.py "$T")
! grep -q "Warning: these rows ran on" <<<"$out" || fail "rows of one device must not warn: $out"
sed -i '/"id": "b2"/s/"trained_on": "cuda:0 (NVIDIA H200)"/"trained_on": "cpu (AMD EPYC)"/' "$T/rows.jsonl"
out=$("$PY" studies/ct_plateau/table.py "$T")
grep -q "Warning: these rows ran on 2 devices (cpu (AMD EPYC); cuda:0 (NVIDIA H200))" <<<"$out" ||
  fail "a row trained on another device must be named: $out"
echo "ct_plateau: ok"
