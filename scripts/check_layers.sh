#!/usr/bin/env bash
# The layering of the source tree (docs/ARCHITECTURE.md "Rooms and floors"): every `#include "FOLDER/..."` of a
# room's sources must name the room itself or one below it:
#   core <- core/io <- core/platform <- core/dist <- core/train          (the rooms of core/, together "core")
#   core <- datasets <- vision/nn <- vision <- {diffusion, eval} <- experiments <- {bench <- apps, python}
# (diffusion and eval are peers: neither includes the other; python/csrc, the PyTorch ops, sits on experiments). One
# line per offending include; exit 1 if any. Run by ctest (test `layers`).
set -euo pipefail
cd "$(dirname "$0")/.."
CORE="core core/io core/platform core/dist core/train"
declare -A allowed=(
  [core]="core"
  [core/io]="core core/io"
  [core/platform]="core core/io core/platform"
  [core/dist]="core core/io core/platform core/dist"
  [core/train]="$CORE"
  [datasets]="$CORE datasets"
  [vision/nn]="$CORE datasets vision/nn"
  [vision]="$CORE datasets vision/nn vision"
  [diffusion]="$CORE datasets vision/nn vision diffusion"
  [eval]="$CORE datasets vision/nn vision eval"
  [experiments]="$CORE datasets vision/nn vision diffusion eval experiments"
  [bench]="$CORE datasets vision/nn vision diffusion eval experiments bench"
  [apps]="$CORE datasets vision/nn vision diffusion eval experiments bench apps"
  [python]="$CORE datasets vision/nn vision diffusion eval experiments python"
)
# room PATH: the room a source file or an included path belongs to (vision/nn and core's rooms are rooms of their own)
room() {
  case "$1" in
    vision/nn/*) echo vision/nn ;;
    core/io/* | core/platform/* | core/dist/* | core/train/*) echo "${1%/*}" | cut -d/ -f1-2 ;;
    *) echo "${1%%/*}" ;;
  esac
}
bad=0
while IFS= read -r line; do
  file=${line%%:*}
  inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")
  [ -d "${inc%%/*}" ] && [[ "$inc" == */* ]] || continue  # a system or generated header ("moh_version.h")
  from=$(room "$file") target=$(room "$inc")
  ok=0
  for a in ${allowed[$from]}; do [ "$a" = "$target" ] && ok=1; done
  if [ $ok = 0 ]; then echo "layers: $file includes $inc ($from may use: ${allowed[$from]})"; bad=1; fi
done < <(find core datasets vision diffusion eval experiments bench apps python \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) \
           -not -path 'python/build/*' -print0 | xargs -0 grep -Hn '^#include "' || true)
[ $bad = 0 ] && echo "layers: every include follows core <- core/io <- core/platform <- core/dist <- core/train <- datasets <- vision/nn <- vision <- {diffusion, eval} <- experiments <- {bench <- apps, python}"
exit $bad
