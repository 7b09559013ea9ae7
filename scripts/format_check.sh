#!/usr/bin/env bash
# Every C++ and CUDA source formatted by .clang-format (clang-format 14, Debian 12's): `clang-format --dry-run
# --Werror`, one line per offending place. Fix with: clang-format -i $(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
# Run by ctest (test `format`, once per `scripts/test.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "error: format: clang-format not found (scripts/setup.sh installs it)" >&2; exit 2; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find core datasets vision diffusion eval apps bench tests -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
fi
if ! out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1); then
  echo "$out" | grep 'error:' | head -n 20
  echo "format: $(echo "$out" | grep -c 'error:') places differ from .clang-format in ${#files[@]} files (clang-format -i FILES)"
  exit 1
fi
echo "format: ${#files[@]} files follow .clang-format"
