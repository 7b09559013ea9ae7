#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): setup (apt packages as root, the pinned pip venv) + Release
# builds + the whole ctest suite, once against Debian's LibTorch 1.13 (build/) and once against the pip wheel's
# LibTorch 2.14.1 with CUDA 13.0 (build-torch2/; CPU tests only, GPU-only tests skip).
# Testing both, the long command-line tests run once: cli, bad_input and readme against the Debian build (the README's
# default), demo_quick and scale_check against the pip build (the faster one); a single build runs every test.
#   MOH_TEST_LIBTORCH  both (default) | debian | pip   which builds to test
#   MOH_TEST_JOBS      ctest parallelism (default 2)
#   MOH_TEST_NOCV      1 (default): the Debian tree also links moh_nocv, the program of a build without OpenCV, which
#                      ctest's nocv test checks (-DMOH_NOCV_CHECK=ON: its image code compiled without OpenCV, the rest
#                      shared)
#   MOH_TEST_GTEST_SHARDS  4 (default): the short GoogleTests of each test binary run in this many processes, not one
#                      process per test (tests/CMakeLists.txt MOH_GTEST_SHARDS; 0: one ctest per test)
#   MOH_PYREF_CACHE    the directory where the first build's pyref tests leave the Python references for the second
#                      (default: a temporary one, ~2 GB, removed at the end; tests/pyref_test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${MOH_TEST_LIBTORCH:-both}
case "$which" in both|debian|pip) ;; *) echo "error: MOH_TEST_LIBTORCH=$which: use both, debian or pip" >&2; exit 2 ;; esac

# ctest runs MOH_TEST_JOBS tests at once on a machine of few cores: one LibTorch thread per test process unless the
# user says otherwise (OpenMP threads of two tests spin-waiting on each other's cores slowed some tests 8-fold;
# docs/BENCHMARKS.md "Build and test time").
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The venv first, so that both builds register the Python reference tests.
if [ "$which" != debian ]; then MOH_LIBTORCH=pip MOH_SKIP_BUILD=1 bash scripts/setup.sh; fi

# The Python references that depend on nothing but their seeded arguments are computed once for both builds
# (tests/pyref_test.sh: the second build reads the first one's).
if [ "$which" = both ] && [ -z "${MOH_PYREF_CACHE:-}" ]; then
  MOH_PYREF_CACHE=$(mktemp -d)
  export MOH_PYREF_CACHE
  trap 'rm -rf "$MOH_PYREF_CACHE"' EXIT
fi

run_suite() {  # $1 = debian|pip
  local dir=build t0 t1 nocv=""
  if [ "$1" = pip ]; then dir=build-torch2; fi
  if [ "$1" = debian ]; then nocv=-DMOH_NOCV_CHECK=$([ "${MOH_TEST_NOCV:-1}" = 1 ] && echo ON || echo OFF); fi
  # Testing both, the pip build compiles the CUDA kernels for real; the Debian build's compile-only copy would repeat it.
  if [ "$1" = debian ] && [ "$which" = both ]; then nocv="$nocv -DMOH_CUDA_CHECK=OFF"; fi
  t0=$(date +%s)
  MOH_CMAKE_ARGS="${MOH_CMAKE_ARGS:-} $nocv -DMOH_GTEST_SHARDS=${MOH_TEST_GTEST_SHARDS:-4}" MOH_LIBTORCH=$1 \
    bash scripts/setup.sh
  t1=$(date +%s)
  # Testing both builds, each long script test runs in one of them (label once_debian / once_pip, tests/CMakeLists.txt).
  local skip=()
  if [ "$which" = both ]; then
    if [ "$1" = pip ]; then skip=(-LE once_debian); else skip=(-LE once_pip); fi
  fi
  (cd "$dir" && ctest --output-on-failure -j"${MOH_TEST_JOBS:-2}" --timeout 1200 "${skip[@]}")
  echo "test.sh: $1 LibTorch ($dir): build $(( t1 - t0 )) s, tests $(( $(date +%s) - t1 )) s"
}
if [ "$which" != pip ]; then run_suite debian; fi
if [ "$which" != debian ]; then run_suite pip; fi
echo "test.sh: done ($which)"
