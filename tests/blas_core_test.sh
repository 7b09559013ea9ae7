#!/usr/bin/env bash
# The OpenBLAS core moh runs on (core/blas_core.h), end to end through `moh --version`: where OpenBLAS falls back to a
# generic kernel (simulated: MOH_BLAS_ASSUME_CORE=Prescott, what Debian's OpenBLAS picks on a Sapphire Rapids Xeon),
# moh runs with the best core the CPU's flags allow after its self-check; a core that fails the self-check (wrong
# products, or an illegal instruction: MOH_BLAS_SELFCHECK_INJECT) is not used and one warning line says so; a user's
# OPENBLAS_CORETYPE wins. A build whose BLAS is not OpenBLAS (the pip wheel's MKL) has nothing to check.
# usage: tests/blas_core_test.sh path/to/moh
set -uo pipefail
MOH=$1
fails=0
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
echo "blas_core: $fails failed"
[ "$fails" = 0 ]
