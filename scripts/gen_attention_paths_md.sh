#!/usr/bin/env bash
# Regenerates the table of what `attention_path: auto` runs in each MoH layer (`moh info --attention-paths`) between
# its markers in README.md (tests/cli_test.sh fails when they drift apart).
# usage: scripts/gen_attention_paths_md.sh [path/to/moh]
set -euo pipefail
cd "$(dirname "$0")/.."
MOH=${1:-build/moh}
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$MOH" info --attention-paths > "$table"
for f in README.md; do
  grep -q '^<!-- moh info --attention-paths: begin -->$' "$f" || { echo "error: $f has no attention-paths markers" >&2; exit 2; }
  awk -v table="$table" '
    /^<!-- moh info --attention-paths: begin -->$/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
    /^<!-- moh info --attention-paths: end -->$/ { skip = 0 }
    !skip { print }' "$f" > "$f.tmp" && mv "$f.tmp" "$f"
done
