#!/usr/bin/env bash
# The memory check before training (core/memory_preflight.h): a run that cannot fit is refused with one line (the
# estimate, what is available, the largest batch that fits), exit 2, nothing written. (Runs that fit are checked by
# every other training test, which all pass through the check.)
# usage: memory_check_test.sh path/to/moh repo_root
set -u
MOH=$1
ROOT=$2
cd "$ROOT" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
bad() { fails=$((fails + 1)); echo "FAIL: $*"; }
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] || [ ! -x /usr/bin/time ]; then
  echo "skipped: needs dataset-fashion-mnist and /usr/bin/time"; exit 0
fi
NANO=configs/fashion_mnist/moh_vit_nano.yaml
# The issue's run: 224 px, 2 processes × 64 images (≈ 60 GiB) on a machine of 24 GiB.
avail=$(awk '/MemAvailable/ { print $2 }' /proc/meminfo)
start=$(date +%s)
"$MOH" train $NANO --set model.img_size=224 --set train.processes=2 --run-dir "$tmp/big" >"$tmp/big.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ "$avail" -gt 58000000 ]; then echo "note: over 58 GiB available: the refusal case fits here, not checked"
elif [ "$rc" = 2 ] && [ "$(grep -c '^error: ' "$tmp/big.log")" = 1 ] &&
  grep -Eq '^error: memory: training MoH-ViT-Nano at 224 px needs about [0-9.]+ GiB on this machine \(2 processes × [0-9.]+ GiB\) .* available \(lower data.batch_size to at most [0-9]+,' "$tmp/big.log" &&
  [ ! -e "$tmp/big" ]; then
  ok "refused in ${took}s, nothing written: $(grep '^error: ' "$tmp/big.log" | cut -c1-220)"
else bad "224 px × 2 × 64: exit $rc after ${took}s: $(grep -v '%' "$tmp/big.log" | tail -3)"; fi
echo "memory_check_test: $pass passed, $fails failed"
[ "$fails" = 0 ]
