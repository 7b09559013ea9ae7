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
echo "results_trace: $fails failures"
[ "$fails" = 0 ]
