#!/usr/bin/env bash
# scripts/results_tables.sh trace: README.md and docs/RESULTS.md pass, and the rule fails where it should — a number
# no raw file holds, a table without its <!-- raw: --> line, a source outside docs/results/, a wrong ratio.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check EXPECTED_RC NEEDLE DOC
  local out rc
  out=$(bash scripts/results_tables.sh trace "$3" 2>&1)
  rc=$?
  if [ "$rc" != "$1" ] || ! grep -qF -- "$2" <<<"$out"; then
    echo "FAIL: trace $3: expected rc $1 and '$2', got rc $rc:"
    echo "$out"
    fails=$((fails + 1))
  fi
}
check 0 "problems" README.md
check 0 "problems" docs/RESULTS.md
for page in docs/results/*/README.md; do check 0 "problems" "$page"; done

raw=docs/results/fm_fid_trained.json  # FID 54.2177, seconds 103.1, sample accuracy 53.27, precision 0.5286
table() {  # table MARKER ROW...
  { echo "# t"; [ -n "$1" ] && echo "$1"; echo "| run | FID (× base) | seconds | acc. % |"; echo "|---|---|---|---|"
    shift; printf '%s\n' "$@"; } >"$tmp/doc.md"
}
table "<!-- raw: $raw labels=1 -->" "| run 3 | 54.22 (1.00) | 1 min 43 s | 53.27 |" "| again | 54.2 (1.00) | 103 | 52.86 |"
check 0 "6 table numbers traced to raw files, 0 problems" "$tmp/doc.md"  # 52.86: precision as a percentage
table "<!-- raw: $raw labels=1 -->" "| run | 54.23 (1.00) | 103 s | 53.27 |"
check 1 "54.23 is in none of" "$tmp/doc.md"
table "<!-- raw: $raw labels=1 -->" "| run | 54.22 (1.00) | 1 min 45 s | 53.27 |"
check 1 "1 min 45 s is in none of" "$tmp/doc.md"
table "" "| run | 54.22 (1.00) | 103 s | 53.27 |"
check 1 "has no <!-- raw: FILES --> line above it" "$tmp/doc.md"
table "<!-- raw: README.md -->" "| run | 54.22 (1.00) | 103 s | 53.27 |"
check 1 "is not under docs/results/" "$tmp/doc.md"
table "<!-- raw: docs/results/no_such_*.json -->" "| run | 54.22 (1.00) | 103 s | 53.27 |"
check 1 "matches no file" "$tmp/doc.md"
table "<!-- raw: $raw docs/results/fm_fid_untrained.json labels=1 -->" "| a | 54.22 (1.00) | 103 s | 53.27 |" "| b | 153.97 (2.85) | 103 s | 53.27 |"
check 1 "ratio (2.85) is not 153.97 / 54.22" "$tmp/doc.md"
table "<!-- raw: $raw docs/results/fm_fid_untrained.json labels=1 -->" "| a | 54.22 (1.00) | 103 s | 53.27 |" "| b | 153.97 (2.84) | 103 s | 53.27 |"
check 0 "0 problems" "$tmp/doc.md"
table "<!-- raw: $raw -->" "| run 7 | 54.22 (1.00) | 103 s | 53.27 |"  # without labels=1 the row's name is a figure
check 1 "7 is in none of" "$tmp/doc.md"
# The prose of the user documents (scripts/doc_check.py): no words about how the work was organised, no dead citation;
# and each rule fails where it should.
prose() {  # prose EXPECTED_RC NEEDLE DOC...
  local out rc
  out=$(python3 scripts/doc_check.py "${@:3}" 2>&1)
  rc=$?
  if [ "$rc" != "$1" ] || ! grep -qF -- "$2" <<<"$out"; then
    echo "FAIL: doc_check ${*:3}: expected rc $1 and '$2', got rc $rc:"
    echo "$out"
    fails=$((fails + 1))
  fi
}
prose 0 " 0 problems" README.md docs/*.md docs/results/*/README.md
mkdir -p "$tmp/docs"
for line in "Measured in the next loan." "See issue 57 for the protocol." "The job started at 14:05 UTC." \
            "An evening job trained seed 2." "This session had no GPU."; do
  echo "$line" >"$tmp/docs/p.md"
  prose 1 "is about how the work was organised" "$tmp/docs/p.md"
done
printf '%s\n' "The rows: [rows](no_such_file.jsonl)." >"$tmp/docs/p.md"
prose 1 "links no_such_file.jsonl, which does not exist" "$tmp/docs/p.md"
printf '%s\n' "Run \`scripts/no_such_script.sh\` first." >"$tmp/docs/p.md"
prose 1 "cites scripts/no_such_script.sh, which does not exist" "$tmp/docs/p.md"
printf '%s\n' "Durations such as 8 min 21 s, ratios 1.00×, 2026-11-27, \`scripts/test.sh\`, [this page](p.md)." >"$tmp/docs/p.md"
printf '%s\n' '```' 'at 14:05 in a fenced log' '```' >>"$tmp/docs/p.md"
prose 0 " 0 problems" "$tmp/docs/p.md"  # what the rules must let pass
# The pages of published figures (a README.md outside docs/, BENCHMARKS.md) name the raw file of every figure, and
# the README names no commit.
mkdir -p "$tmp/page/results" && echo "real 8m2s" >"$tmp/page/results/demo.log"
printf '%s\n' "The demo took 8 min 2 s here." >"$tmp/page/README.md"
prose 1 "names no raw file" "$tmp/page/README.md"
printf '%s\n' "The demo took 8 min 2 s ([log](results/demo.log))." >"$tmp/page/BENCHMARKS.md"
prose 0 " 0 problems" "$tmp/page/BENCHMARKS.md"
printf '%s\n' "Fixed in 4f1ef53, see the log." >"$tmp/page/README.md"
prose 1 "commit hash 4f1ef53" "$tmp/page/README.md"
printf '%s\n' "| run | time |" "|---|---|" "| a | 3.5 s |" >"$tmp/page/BENCHMARKS.md"
prose 1 "a table of 1 figures names no raw file" "$tmp/page/BENCHMARKS.md"
echo "results_trace: $fails failures"
[ "$fails" = 0 ]
