#!/usr/bin/env bash
# studies/moh_vs_mha/table.py on rows whose answers are known: the classifier's paired top-1 verdicts against the
# ±0.5-point margin (equal, worse, undecided with one pair), the speed rounds' ratios paired by round (a faster
# variant named), the DiT's paired relative FID against ±5 % (equal, worse), apart by machine and feature network
# when the rows hold two, and its two spreads (over training seeds, over the two sample sets of one run); and the study
# page's tables.md equal to what table.py writes from its rows.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$(command -v .venv/bin/python || command -v python3)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
prov='"commit": "c", "libtorch": "l", "cpu": "m", "date": "2026-12-05"'
cls() { echo "{\"id\": \"cls/$1/s$2\", \"kind\": \"cls\", $prov, \"variant\": \"$1\", \"seed\": $2, \"top1\": $3, \"train_steps_per_s\": 1}"; }
spd() { echo "{\"id\": \"speed/cls/$1/r$2\", \"kind\": \"cls_speed\", $prov, \"variant\": \"$1\", \"seed\": $2, \"train_steps_per_s\": $3}"; }
dit() {
  echo "{\"id\": \"dit/$1/s$2/set$3\", \"kind\": \"dit\", $prov, \"variant\": \"$1\", \"seed\": $2, \"fid\": $4," \
    "\"class_accuracy\": $5, \"train_steps_per_s\": 1, \"sample_images_per_s\": 2, \"feature_sha256\": \"ffff\"}"
}
{ for s in 1 2 3 4; do
    cls ViT-Nano $s "8$s.0"; cls MoH-A $s "8$s.1$s"          # +0.11 .. +0.14: equal
    cls MoH-B $s "7$s.0"                                       # -10 points: worse
    spd ViT-Nano $s "1.0$s"; spd MoH-A $s "1.5$s"             # about 1.5x: faster
    dit DiT-Pixel/2 $s 1 "1$s.0" 70; dit DiT-Pixel/2 $s 2 "1$s.5" 70
    dit MoH-C $s 1 "1$s.1" 70                                  # under +1 %: equal
    dit MoH-D $s 1 "2$s.0" 60                                  # +60 % or more: worse
  done
  cls MoH-E 1 85.0; } >"$T/rows.jsonl"
out=$("$PY" studies/moh_vs_mha/table.py "$T")
grep -q "| MoH-A | 4 | .* | 0.12 ± 0.02 | \*\*equal\*\* |" <<<"$out" || fail "+0.11..+0.14 points is equal: $out"
grep -q "| MoH-B | 4 | .* | -10.00 ± 0.00 | \*\*worse\*\* |" <<<"$out" || fail "-10 points in every seed is worse: $out"
grep -q "| MoH-E | 1 | .* | \*\*undecided\*\* | one pair |" <<<"$out" || fail "one pair is undecided: $out"
grep -q "| MoH-A | 4 | .* | no: faster |" <<<"$out" || fail "1.5x in every round is faster: $out"
grep -q "| MoH-C | 4 | .* | \*\*equal\*\* |" <<<"$out" || fail "FID within 1 % is equal at ±5 %: $out"
grep -q "| MoH-D | 4 | .* | \*\*worse\*\* |" <<<"$out" || fail "FID 60 % higher is worse: $out"
grep -q "| DiT-Pixel/2 | 1.29 | 0.35 | 4 |" <<<"$out" || fail "spreads: seeds sd 1.29, sample sets 0.5/sqrt(2): $out"
[ "$(wc -l <"$T/tables.md")" -gt 10 ] || fail "tables.md not written"
! grep -q "DiT by machine" <<<"$out" || fail "one machine and feature network: no table by them: $out"
# Seeds measured on two machines with two feature networks: the comparison apart for each (pooled it mixes them).
other() { sed 's/"cpu": "m"/"cpu": "m2"/; s/ffff/eeee/'; }
mkdir "$T/two" && { for s in 1 2 3; do dit DiT-Pixel/2 $s 1 "1$s.0" 70; dit MoH-C $s 1 "1$s.1" 70; done
  for s in 4 5 6; do dit DiT-Pixel/2 $s 1 "1$s.0" 70 | other; dit MoH-C $s 1 "2$s.0" 70 | other; done
} >"$T/two/rows.jsonl"
two=$("$PY" studies/moh_vs_mha/table.py "$T/two")
grep -q "| m | ffff | 1, 2, 3 | .* | MoH-C | .* | equal |" <<<"$two" || fail "seeds 1-3 within 1 % are equal: $two"
grep -q "| m2 | eeee | 4, 5, 6 | .* | MoH-C | .* | worse |" <<<"$two" || fail "seeds 4-6 at +60 % are worse: $two"
# The page's tables are the script's output from the page's rows (no number typed by hand).
D=docs/results/moh_vs_mha
mkdir "$T/page" && cp "$D/rows.jsonl" "$T/page/"
"$PY" studies/moh_vs_mha/table.py "$T/page" >/dev/null
diff -u "$D/tables.md" "$T/page/tables.md" || fail "$D/tables.md differs from table.py's output for $D/rows.jsonl"
echo "moh_vs_mha_table: ok"
