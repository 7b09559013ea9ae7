#!/usr/bin/env bash
# Installs everything the MoH toolkit needs on Debian 12 (idempotent, runs as root), then builds.
#   MOH_LIBTORCH      debian (default): Debian's libtorch-dev 1.13 (CPU), built into build/
#                     pip: the pinned PyPI torch wheel (LibTorch 2.14.1, CUDA 13.0) and the Python reference packages
#                          (scripts/requirements-torch2.txt) in the project-local venv .venv/, built into build-torch2/
#                          with the CUDA kernels and NCCL on (they compile and link without a GPU)
#   MOH_SKIP_BUILD=1  only install packages (and, for pip, the venv)
#   MOH_BUILD_TYPE    CMake build type (default Release)
#   MOH_BUILD_TARGETS targets to build (default: all; the demo builds only `moh`)
#   MOH_CACHE_DIR     where downloaded wheels are kept (default ~/.cache/moh): a second run, or another clone on the
#                     same machine, installs from there and downloads nothing
#   MOH_PYTHON        the Python that creates the venv (default python3; torch 2.14 needs 3.10 to 3.14)
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${MOH_LIBTORCH:-debian}
case "$MODE" in
  debian|pip) ;;
  *) echo "error: MOH_LIBTORCH=$MODE: unknown LibTorch source (use debian or pip)" >&2; exit 2 ;;
esac

PKGS=(build-essential cmake ninja-build ccache pkg-config clang-format
      libopenblas0-pthread libgloo-dev
      libopencv-dev libjpeg62-turbo-dev libpng-dev libyaml-cpp-dev libcxxopts-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev libzip-dev
      dataset-fashion-mnist)
if [ "$MODE" = debian ]; then PKGS+=(libtorch-dev); else PKGS+=(python3-venv); fi

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

cmake_args=()
if [ "$MODE" = pip ]; then
  bash scripts/setup_venv.sh
  BUILD_DIR=build-torch2
  torch_cmake=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  # MOH_TORCH_OPS: python/'s torch.ops.moh library, built and tested against the venv's torch (the moh_torch package).
  cmake_args+=(-DTorch_DIR="$torch_cmake/Torch" -DMOH_WITH_NCCL=ON -DMOH_TORCH_OPS=ON)
else
  BUILD_DIR=build
fi
# The Python reference tests (tests/pyref_test.sh) run in either build once the venv exists.
[ -x .venv/bin/python ] && [ -f .venv/.moh-requirements.sha256 ] && cmake_args+=(-DMOH_PYTHON="$PWD/.venv/bin/python")

[ "${MOH_SKIP_BUILD:-0}" = 1 ] && exit 0

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${MOH_BUILD_TYPE:-Release}" "${launcher[@]}" "${cmake_args[@]}" \
  ${MOH_CMAKE_ARGS:-}
targets=()
for t in ${MOH_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
# Cores without OpenMP's say: GNU nproc honours OMP_NUM_THREADS, which scripts/test.sh sets to 1 for its test
# processes; taken from there, the whole build ran one compiler at a time.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
if [[ " ${MOH_CMAKE_ARGS:-} " != *" -DMOH_WERROR=ON "* ]]; then
  cmake --build "$BUILD_DIR" -j"$jobs" "${targets[@]}"
  exit 0
fi
# CI (MOH_WERROR): a compiler note fails the build as a warning does. -Werror cannot catch it: GCC prints some notes
# on their own (its ABI note for a 64-byte vector parameter), and a newcomer cannot tell them from trouble.
build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
cmake --build "$BUILD_DIR" -j"$jobs" "${targets[@]}" 2>&1 | tee "$build_log"
if grep -q ': note: ' "$build_log"; then
  echo "error: the build printed compiler notes (CI treats them as warnings):" >&2
  grep ': note: ' "$build_log" >&2
  exit 1
fi
