#!/usr/bin/env bash
# The layering of the source tree (../shared/CONVENTIONS.md, each folder's CMakeLists comment): every
# `#include "FOLDER/..."` of a folder's sources must name the folder itself or one it may depend on:
#   core <- datasets <- vision/nn <- vision <- {diffusion, eval} <- experiments <- {bench <- apps, python}
# (diffusion and eval are peers: neither includes the other; python/csrc, the PyTorch ops, sits on experiments). One line per offending include; exit 1 if any.
# Run by ctest (test `layers`).
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A allowed=(
  [core]="core"
  [datasets]="core datasets"
  [vision/nn]="core datasets vision/nn"
  [vision]="core datasets vision/nn vision"
  [diffusion]="core datasets vision/nn vision diffusion"
  [eval]="core datasets vision/nn vision eval"
  [experiments]="core datasets vision/nn vision diffusion eval experiments"
  [bench]="core datasets vision/nn vision diffusion eval experiments bench"
  [apps]="core datasets vision/nn vision diffusion eval experiments bench apps"
  [python]="core datasets vision/nn vision diffusion eval experiments python"
)
bad=0
for folder in core datasets vision/nn vision diffusion eval experiments bench apps python; do
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")
    # vision/ files outside vision/nn belong to vision; the include's folder is its first component (vision/nn kept)
    target=${inc%%/*}
    [[ "$inc" == vision/nn/* ]] && target=vision/nn
    [ -d "$target" ] || continue  # a system or generated header ("moh_version.h")
    ok=0
    for a in ${allowed[$folder]}; do [ "$a" = "$target" ] && ok=1; done
    if [ $ok = 0 ]; then echo "layers: $file includes $inc ($folder may use: ${allowed[$folder]})"; bad=1; fi
  done < <(if [ "$folder" = vision ]; then find vision -path vision/nn -prune -o \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print;
           else find "$folder" \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \); fi | xargs grep -Hn '^#include "' || true)
done
[ $bad = 0 ] && echo "layers: every include follows core <- datasets <- vision/nn <- vision <- {diffusion, eval} <- experiments <- {bench <- apps, python}"
exit $bad
