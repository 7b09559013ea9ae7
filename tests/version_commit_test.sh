#!/usr/bin/env bash
# `moh --version` names the commit the binary was built from (core/platform/commit_stamp.cmake): the source tree's HEAD,
# with "-dirty" exactly when tracked files differ from it, and outside a git checkout MOH_COMMIT or "unknown". Results rows and logs
# take their commit from here, so a stale or wrong stamp would mislabel every measurement.
# usage: version_commit_test.sh path/to/moh source_root
set -u
MOH=$1 ROOT=$2
line=$("$MOH" --version | head -n1)
got=$(echo "$line" | sed -n 's/^moh [0-9.]* (commit \(.*\))$/\1/p')
[ -n "$got" ] || { echo "FAIL: first line of moh --version names no commit: '$line'"; exit 1; }
if head=$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null); then
  want=$head
  git -C "$ROOT" diff --quiet HEAD -- || want="$head-dirty"
else
  want=${MOH_COMMIT:-unknown}
fi
if [ "$got" != "$want" ]; then
  echo "FAIL: moh --version says commit $got, the source tree is at $want (a binary built before the last commit or" \
    "change: rebuild)"
  exit 1
fi
echo "version_commit: ok ($got)"
