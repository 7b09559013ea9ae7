#!/usr/bin/env bash
# A disk that fills up during a run (core/train/retention.h): on a 100 MiB tmpfs, MoH-ViT-Nano's 24 MB checkpoints leave room
# for one (a save needs its size plus a 64 MiB margin). The run writes its first checkpoint, then stops before the
# second with exit 1 and exactly one `error:` line, and the first checkpoint is intact and usable. Needs root (mount);
# says so and passes elsewhere.
# usage: tests/disk_full_test.sh path/to/moh path/to/source
set -uo pipefail
MOH=$(realpath "$1")
SRC=$2
if [ "$(id -u)" != 0 ]; then echo "disk_full: skipped (mounting a tmpfs needs root)"; exit 0; fi
tmp=$(mktemp -d)
trap 'umount "$tmp/disk" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/disk"
if ! mount -t tmpfs -o size=100m tmpfs "$tmp/disk" 2>/dev/null; then echo "disk_full: skipped (no tmpfs mount here)"; exit 0; fi
fails=0
check() { if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
run=$tmp/disk/run
"$MOH" train "$SRC/configs/fashion_mnist/moh_vit_nano.yaml" --set data.limit_train=256 --set data.limit_val=64 \
  --set train.epochs=3 --set train.processes=1 --set train.precision=fp32 --run-dir "$run" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "exit 1 (a runtime stop), got $rc" test "$rc" = 1
check "exactly one error line: $(grep '^error:' "$tmp/err")" test "$(grep -c '^error:' "$tmp/err")" = 1
check "it says the checkpoint does not fit" grep -q '^error: checkpoint at step 4: a checkpoint needs .* MiB free' "$tmp/err"
check "the first checkpoint is the latest" grep -qx 0000002 "$run/checkpoints/latest"
check "no half-written checkpoint left" test "$(find "$run/checkpoints" -maxdepth 1 -name '*.tmp*' | wc -l)" = 0
"$MOH" eval --checkpoint "$run" --out "$tmp/eval" >"$tmp/eval.out" 2>&1
check "the first checkpoint evaluates: $(tail -1 "$tmp/eval.out")" grep -q "top-1" "$tmp/eval.out"
echo "disk_full: $fails failed"
[ "$fails" = 0 ]
