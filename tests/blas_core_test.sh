#!/usr/bin/env bash
# The OpenBLAS core moh runs on (core/platform/blas_core.h), end to end through `moh --version`: where OpenBLAS falls back to a
# generic kernel (simulated: MOH_BLAS_ASSUME_CORE=Prescott, what Debian's OpenBLAS picks on a Sapphire Rapids Xeon),
# moh runs with the best core the CPU's flags allow after its self-check; a core that fails the self-check (wrong
# products, or an illegal instruction: MOH_BLAS_SELFCHECK_INJECT) is not used and one warning line says so; a user's
# OPENBLAS_CORETYPE wins. A build whose BLAS is not OpenBLAS (the pip wheel's MKL) has nothing to check.
# usage: tests/blas_core_test.sh path/to/moh
set -uo pipefail
MOH=$1
fails=0
# Each case below sets the variables it is about: a core chosen in the machine's own environment (one machine kind
# here sets OPENBLAS_CORETYPE=Haswell for every process) would otherwise win every case as the user's choice.
unset OPENBLAS_CORETYPE MOH_BLAS_CORE_FROM MOH_BLAS_CORE_TRIED MOH_BLAS_CORE_FAILED MOH_BLAS_CORE_CHECKED \
  MOH_BLAS_CORE_WARNED MOH_BLAS_ASSUME_CORE MOH_BLAS_SELFCHECK_INJECT
check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then echo "ok: $name"; else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
if ! "$MOH" --version | grep -q '^OpenBLAS core:'; then
  echo "blas_core: the BLAS is not OpenBLAS ($("$MOH" --version | grep '^BLAS:')): nothing to check"
  exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
best=""
if has avx512f avx512cd avx512bw avx512dq avx512vl; then
  if has avx512_bf16; then best=Cooperlake; else best=SkylakeX; fi
elif has avx2 fma; then best=Haswell
elif has avx; then best=SandyBridge; fi
core_line() { "$@" --version 2>/dev/null | grep '^OpenBLAS core:'; }

line=$(MOH_BLAS_ASSUME_CORE=Prescott core_line "$MOH")
if [ -n "$best" ]; then
  check "a generic core is replaced by $best after the self-check: $line" \
    grep -q "^OpenBLAS core: $best (detected Prescott; chosen by moh for this CPU, self-check passed" <<<"$line"
else
  check "no better core on this CPU: $line" grep -q "^OpenBLAS core: " <<<"$line"
fi
for inject in wrong crash; do
  err=$(MOH_BLAS_ASSUME_CORE=Prescott MOH_BLAS_SELFCHECK_INJECT=$inject "$MOH" --version 2>&1 >/dev/null)
  line=$(MOH_BLAS_ASSUME_CORE=Prescott MOH_BLAS_SELFCHECK_INJECT=$inject core_line "$MOH")
  if [ -n "$best" ]; then
    check "self-check failure ($inject): OpenBLAS's choice kept: $line" grep -q "^OpenBLAS core: Prescott (detected Prescott; self-check of $best failed" <<<"$line"
    check "self-check failure ($inject): one warning line" test "$(grep -c . <<<"$err")" = 1
    check "self-check failure ($inject): the warning names the core: $err" grep -q "^warning: OpenBLAS core $best failed moh's self-check" <<<"$err"
  fi
done
line=$(OPENBLAS_CORETYPE=Haswell MOH_BLAS_ASSUME_CORE=Prescott core_line "$MOH")
check "the user's OPENBLAS_CORETYPE wins: $line" grep -q "^OpenBLAS core: Haswell (.*(yours))" <<<"$line"
# A command that computes runs on the chosen core and gives what it gives on OpenBLAS's own choice of that core.
a=$("$MOH" bench train --model MoH-DiT-Pixel/4-75 --batch 2 --steps 1 --warmup 0 --img-size 8 --json 2>/dev/null | grep -c step_s)
b=$(MOH_BLAS_ASSUME_CORE=Prescott "$MOH" bench train --model MoH-DiT-Pixel/4-75 --batch 2 --steps 1 --warmup 0 --img-size 8 --json 2>/dev/null | grep -c step_s)
check "commands run after the switch" test "$a$b" = 11
# When moh starts again with the chosen core: a command that computes, before it computes; a refused config and
# `moh config` never (their first start answers); a launcher leaves it to its ranks, which check the core themselves
# (the machine's first rank says when it fails).
NANO=$(dirname "$0")/../configs/fashion_mnist/moh_vit_nano.yaml
if [ -n "$best" ] && [ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  inj=(env MOH_BLAS_ASSUME_CORE=Prescott MOH_BLAS_SELFCHECK_INJECT=wrong "$MOH")
  tiny=(--set data.limit_train=64 --set data.limit_val=32 --set data.batch_size=32 --set train.epochs=1
        --set train.max_steps=1)
  warnings() { grep -c "^warning: OpenBLAS core $best failed moh's self-check" <<<"$1"; }
  err=$("${inj[@]}" train "$NANO" --set optim.lr=-1 2>&1 >/dev/null)
  check "a refused config: its one error line, no second start: $err" \
    test "$(grep -c . <<<"$err")$(grep -c '^error: ' <<<"$err")" = 11
  err=$("${inj[@]}" config "$NANO" 2>&1 >/dev/null)
  check "moh config: no second start: $err" test -z "$err"
  err=$("${inj[@]}" train "$NANO" "${tiny[@]}" --set train.processes=1 --run-dir "$tmp/r1" 2>&1 >/dev/null)
  check "a training run starts again before it computes: one warning" test "$(warnings "$err")" = 1
  if "$MOH" --version | grep -q '^data parallel: c10d'; then
    err=$("${inj[@]}" train "$NANO" "${tiny[@]}" --set data.batch_size=64 --set train.processes=2 \
      --run-dir "$tmp/r2" 2>&1 >/dev/null)
    check "two ranks from train.processes: the core reaches them, one warning: $(warnings "$err")" \
      test "$(warnings "$err")" = 1
  fi
fi
echo "blas_core: $fails failed"
[ "$fails" = 0 ]
