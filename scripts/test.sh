#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): setup (apt packages as root, the pinned pip venv) + Release
# builds + the whole ctest suite, once against Debian's LibTorch 1.13 (build/) and once against the pip wheel's
# LibTorch 2.14.1 with CUDA 13.0 (build-torch2/; CPU tests only, GPU-only tests skip).
# Testing both, the long command-line tests run once: cli, bad_input and readme against the Debian build (the README's
# default), demo_quick and scale_check against the pip build (the faster one); a single build runs every test.
#   MOH_TEST_LIBTORCH  both (default) | debian | pip   which builds to test
#   MOH_TEST_JOBS      ctest parallelism (default 2)
#   MOH_TEST_NOCV      1 (default): also build and check the tree without OpenCV (build-nocv/, with the Debian build)
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

run_suite() {  # $1 = debian|pip
  local dir=build t0 t1
  if [ "$1" = pip ]; then dir=build-torch2; fi
  t0=$(date +%s)
  MOH_LIBTORCH=$1 bash scripts/setup.sh
  t1=$(date +%s)
  # Testing both builds, each long script test runs in one of them (label once_debian / once_pip, tests/CMakeLists.txt).
  local skip=()
  if [ "$which" = both ]; then
    if [ "$1" = pip ]; then skip=(-LE once_debian); else skip=(-LE once_pip); fi
  fi
  (cd "$dir" && ctest --output-on-failure -j"${MOH_TEST_JOBS:-2}" --timeout 1200 "${skip[@]}")
  echo "test.sh: $1 LibTorch ($dir): build $(( t1 - t0 )) s, tests $(( $(date +%s) - t1 )) s"
}
# A third tree without OpenCV (the GPU machines' build, docs/GPU.md): the binary only, against Debian's LibTorch, and
# tests/nocv_test.sh (what it still does end to end, what it refuses). MOH_TEST_NOCV=0 leaves it out.
# At -O1: this tree checks that the code builds and works without OpenCV; no one times its binary, so it is built for
# compile speed.
nocv_suite() {
  local t0=$(date +%s)
  cmake -S . -B build-nocv -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
    -DMOH_WITH_OPENCV=OFF -DMOH_BUILD_TESTS=OFF -DMOH_BUILD_BENCH=OFF ${MOH_CMAKE_ARGS:-} >/dev/null
  cmake --build build-nocv -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --target moh  # not OMP's 1
  bash tests/nocv_test.sh build-nocv/moh
  echo "test.sh: no-OpenCV build (build-nocv): build + test $(( $(date +%s) - t0 )) s"
}
if [ "$which" != pip ]; then run_suite debian; fi
if [ "$which" != pip ] && [ "${MOH_TEST_NOCV:-1}" = 1 ]; then nocv_suite; fi
if [ "$which" != debian ]; then run_suite pip; fi
echo "test.sh: done ($which)"
