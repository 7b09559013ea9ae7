#!/usr/bin/env bash
# The installed toolkit (issue: an installable toolkit): `cmake --install` into a fresh prefix, examples/embed built
# against that prefix alone (find_package(moh); a header or dependency the package lacks fails the build) and run;
# then, in a build against Debian's LibTorch, the Debian package of `cpack -G DEB`: its control file declares the
# packages scripts/setup.sh installs, it holds the command, the headers and the CMake package, its `moh --version`
# runs from the unpacked tree, and apt accepts it (`apt-get install --simulate`: every dependency resolvable).
#   usage: tests/install_test.sh BUILD_DIR          [ctest: install]
set -uo pipefail
BUILD=$(realpath "$1")
R=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cached() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }

cmake --install "$BUILD" --prefix "$W/prefix" >"$W/install.log" 2>&1 || { tail -n 5 "$W/install.log"; fail "cmake --install"; }
for f in bin/moh lib/cmake/moh/mohConfig.cmake lib/cmake/moh/mohConfigVersion.cmake lib/cmake/moh/mohTargets.cmake \
         lib/moh/libmoh_core.a include/moh/diffusion/sampler.h include/moh/experiments/registry.h include/moh/moh_version.h; do
  [ -e "$W/prefix/$f" ] || fail "the install lacks $f"
done
# The example from a copy outside the source tree: only the prefix (and the dependencies' own packages) to build on.
cp -r "$R/examples/embed" "$W/src"
torch_dir=$(cached Torch_DIR)
if cmake -S "$W/src" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$W/prefix" \
     ${torch_dir:+-DTorch_DIR="$torch_dir"} >"$W/configure.log" 2>&1 && cmake --build "$W/b" >"$W/build.log" 2>&1; then
  if OMP_NUM_THREADS=1 "$W/b/embed" "$W/out" >"$W/run.log" 2>&1; then
    python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); assert {"arr_0.npy", "arr_1.npy"} <= set(z.namelist())' \
      "$W/out/samples.npz" || fail "embed wrote no samples.npz with arr_0 and arr_1"
    if grep -q 'MOH_WITH_OPENCV' "$W/prefix/lib/cmake/moh/mohTargets.cmake"; then
      [ "$(head -c 8 "$W/out/grid.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "embed wrote no PNG grid"
    fi
    cat "$W/run.log"
  else
    cat "$W/run.log"; fail "embed exited non-zero"
  fi
else
  tail -n 20 "$W/configure.log" "$W/build.log"; fail "examples/embed does not build against the installed package"
fi

# The Debian package (a build against Debian's LibTorch configures it; a wheel's LibTorch has no package to depend on).
if [ -f "$BUILD/CPackConfig.cmake" ] && grep -q '"DEB"' "$BUILD/CPackConfig.cmake"; then
  (cd "$W" && cpack --config "$BUILD/CPackConfig.cmake" -B "$W/deb" >"$W/cpack.log" 2>&1) || { tail -n 5 "$W/cpack.log"; fail "cpack -G DEB"; }
  deb=$(ls "$W"/deb/moh_*.deb 2>/dev/null | head -n1)
  if [ -n "$deb" ]; then
    depends=$(dpkg-deb -f "$deb" Depends)
    for p in libtorch-dev libgloo-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev libzip-dev libopenblas0-pthread; do
      [[ ", $depends," == *", $p,"* ]] || fail "the package's Depends lacks $p ($depends)"
    done
    listing=$(dpkg-deb -c "$deb")
    for f in ./usr/bin/moh ./usr/lib/cmake/moh/mohConfig.cmake ./usr/include/moh/vision/nn/moh_attention.h; do
      grep -q " $f$" <<<"$listing" || fail "the package lacks $f"
    done
    dpkg-deb -x "$deb" "$W/root"
    "$W/root/usr/bin/moh" --version | grep -q '^moh ' || fail "moh --version from the unpacked package"
    if out=$(apt-get install --simulate --no-install-recommends "$deb" 2>&1); then
      grep -q '^Inst moh ' <<<"$out" || fail "apt-get --simulate does not install moh: $(tail -n 2 <<<"$out")"
    else
      fail "apt-get --simulate refuses the package: $(grep -m2 'E:\|Depends' <<<"$out")"
    fi
    echo "install: $(basename "$deb"), $(du -k "$deb" | cut -f1) KiB; Depends: $depends"
  else
    fail "cpack wrote no moh_*.deb"
  fi
fi
[ $fails = 0 ] && echo "install: all checks passed"
exit $((fails > 0))
