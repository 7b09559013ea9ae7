#!/usr/bin/env bash
# Prepares, on a machine of this project (Debian 12 with apt), the folder a bare GPU machine needs to build and check
# the toolkit: the Debian packages it lacks (headers and shared libraries of yaml-cpp, cxxopts, nlohmann-json, libzip,
# zlib, Gloo's headers, GoogleTest) and the embedded Fashion-MNIST, as .deb files that scripts/gpu_check.sh unpacks
# into a private prefix there. LibTorch, CUDA, NCCL, the compiler, CMake and ninja come from the GPU machine itself
# (its PyTorch wheel and CUDA toolkit); OpenCV stays behind (gpu_check.sh builds with -DMOH_WITH_OPENCV=OFF).
#   usage: scripts/gpu_kit.sh [DIR]      DIR defaults to .gpu_kit (ignored by git; carry it to the GPU machine)
# Refuses (exit 2) when apt cannot download a package or the folder would exceed 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu_kit}
LIMIT_MIB=60
PKGS=(libyaml-cpp-dev libyaml-cpp0.7 libcxxopts-dev nlohmann-json3-dev libzip-dev libzip4 zlib1g-dev
      libgloo-dev libgtest-dev libgmock-dev googletest dataset-fashion-mnist)

command -v apt-get >/dev/null || { echo "error: gpu_kit: apt-get not found (run on Debian 12, the project's machine)" >&2; exit 2; }
rm -rf "$DIR.tmp"
mkdir -p "$DIR.tmp/debs"
# apt-get download runs as _apt where it can; a root-owned folder only costs a warning, so keep its output for errors.
if ! (cd "$DIR.tmp/debs" && apt-get download "${PKGS[@]}" >../apt.log 2>&1); then
  echo "error: gpu_kit: apt-get download failed: $(grep -m1 '^E:' "$DIR.tmp/apt.log" || tail -n1 "$DIR.tmp/apt.log") (apt-get update, or check the network)" >&2
  rm -rf "$DIR.tmp"
  exit 2
fi
rm -f "$DIR.tmp/apt.log"
size_kib=$(du -sk "$DIR.tmp" | cut -f1)
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "error: gpu_kit: the kit is $((size_kib / 1024)) MiB, over $LIMIT_MIB MiB (what travels to the GPU machine is limited)" >&2
  rm -rf "$DIR.tmp"
  exit 2
fi
{
  echo "# made by scripts/gpu_kit.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(. /etc/os-release && echo "$PRETTY_NAME")"
  (cd "$DIR.tmp/debs" && for f in *.deb; do echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(sha256sum "$f" | cut -c1-16)"; done)
} >"$DIR.tmp/MANIFEST"
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
echo "gpu_kit: $DIR: ${#PKGS[@]} packages, $((size_kib / 1024)) MiB (carry it with the working tree; then bash scripts/gpu_check.sh $DIR)"
