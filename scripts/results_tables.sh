#!/usr/bin/env bash
# Keeps generated tables in a Markdown document identical to the files a script wrote: each block
#   <!-- begin NAME -->
#   ...
#   <!-- end NAME -->
# of DOC holds exactly the contents of DIR/NAME.md.
#   results_tables.sh splice DOC DIR   rewrite every block from its file (used by studies/small/run.sh)
#   results_tables.sh check DOC DIR    exit 1 if a block differs from its file or a file is missing (a ctest)
#   results_tables.sh trace DOC...     exit 1 if a number of a table in DOC has no raw file under docs/results/ that
#                                      holds it (scripts/trace_numbers.py: the <!-- raw: FILES --> line over a table)
set -euo pipefail
if [ "${1:-}" = trace ]; then
  shift
  exec python3 "$(dirname "$0")/trace_numbers.py" "$@"
fi
mode=${1:-} doc=${2:-} dir=${3:-}
if [ -z "$dir" ] || { [ "$mode" != splice ] && [ "$mode" != check ]; }; then
  echo "usage: results_tables.sh splice|check DOC DIR | trace DOC..." >&2
  exit 2
fi
names=$(sed -n 's/^<!-- begin \(.*\) -->$/\1/p' "$doc")
[ -n "$names" ] || { echo "error: $doc: no <!-- begin NAME --> blocks" >&2; exit 1; }
status=0
for name in $names; do
  src="$dir/$name.md"
  [ -f "$src" ] || { echo "error: $doc: block $name has no file $src" >&2; status=1; continue; }
  block=$(awk -v n="$name" '$0 == "<!-- end " n " -->" { inb = 0 } inb { print } $0 == "<!-- begin " n " -->" { inb = 1 }' "$doc")
  if [ "$block" != "$(cat "$src")" ]; then
    if [ "$mode" = check ]; then
      echo "error: $doc: block $name differs from $src (run: scripts/results_tables.sh splice $doc $dir)" >&2
      status=1
    else
      awk -v n="$name" -v src="$src" '
        $0 == "<!-- begin " n " -->" { print; while ((getline l < src) > 0) print l; skip = 1; next }
        $0 == "<!-- end " n " -->" { skip = 0 }
        !skip { print }' "$doc" >"$doc.tmp"
      mv "$doc.tmp" "$doc"
      echo "spliced $src into $doc"
    fi
  fi
done
exit $status
