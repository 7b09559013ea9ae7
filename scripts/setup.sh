#!/usr/bin/env bash
# Installs everything the MoH toolkit needs on Debian 12 (idempotent, runs as root), then builds into build/.
#   MOH_SKIP_BUILD=1  only install packages
#   MOH_BUILD_TYPE    CMake build type (default Release)
#   MOH_BUILD_TARGETS targets to build (default: all; the demo builds only `moh`)
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build ccache pkg-config
      libtorch-dev libopenblas0-pthread libgloo-dev
      libopencv-dev libyaml-cpp-dev libcxxopts-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev libzip-dev
      dataset-fashion-mnist)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "error: setup: missing packages ${missing[*]}: not root (run as root or install them with apt-get)" >&2
    exit 2
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# LibTorch from Debian links against the generic libblas.so.3; point the alternative at OpenBLAS (pthread),
# the reference BLAS is ~40x slower for GEMMs.
if command -v update-alternatives >/dev/null; then
  alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas-pthread | head -n1 || true)
  [ -n "$alt" ] && update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null 2>&1 || true
  alt=$(update-alternatives --list liblapack.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas-pthread | head -n1 || true)
  [ -n "$alt" ] && update-alternatives --set liblapack.so.3-x86_64-linux-gnu "$alt" >/dev/null 2>&1 || true
fi

[ "${MOH_SKIP_BUILD:-0}" = 1 ] && exit 0

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${MOH_BUILD_TYPE:-Release}" "${launcher[@]}" ${MOH_CMAKE_ARGS:-}
targets=()
for t in ${MOH_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build -j"$(nproc)" "${targets[@]}"
