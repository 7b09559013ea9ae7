# Sourced by the script tests that start `moh` hundreds of times (cli_test.sh, bad_input_test.sh): runs `moh` in the
# children of moh_zygote (tests/tools/zygote.cpp: the same program with its libraries loaded once; the caller's
# directory and environment), and every
# ZYGOTE_CHECK_EVERY-th request that fails also as `moh` itself, whose exit code and stderr must be the same
# (ZYG_DIFFERED counts those that are not: the test adds them to its failures).
#   zygote_start MOH ZYGOTE   start the server (nothing if ZYGOTE is not a program, or MOH_TEST_ZYGOTE=0)
#   zmoh OUT ERR ARGS...      `moh ARGS` with stdout OUT, stderr ERR (stdin /dev/null, 300 s at most); its exit code
#   zygote_stop               end the server; prints how many requests it served and checked
ZYG=""
ZYG_PID=""
ZYG_SERVED=0
ZYG_CHECKED=0
ZYG_DIFFERED=0
ZYGOTE_CHECK_EVERY=${ZYGOTE_CHECK_EVERY:-10}

zygote_start() {
  ZYG_MOH=$1
  [ "${MOH_TEST_ZYGOTE:-1}" = 1 ] && [ -x "${2:-}" ] || return 0
  local d
  d=$(mktemp -d)
  "$2" --serve "$d" 2>"$d/log" &
  ZYG_PID=$!
  for _ in $(seq 200); do [ -p "$d/rc" ] && break; kill -0 "$ZYG_PID" 2>/dev/null || break; sleep 0.05; done
  if [ -p "$d/rc" ] && kill -0 "$ZYG_PID" 2>/dev/null; then
    ZYG=$d
  else
    echo "note: moh_zygote did not start ($(cat "$d/log")): every case starts moh itself"
    rm -rf "$d"
  fi
}

# One request to the zygote; prints the exit code (124 when it did not answer in time).
zygote_request() {
  local out=$1 err=$2
  shift 2
  timeout 330 bash -c '{ printf "%s\0" "${@:1}" && env -0; } >"$0/req" && read -r rc <"$0/rc" && echo "$rc"' \
    "$ZYG" "$PWD" "$out" "$err" 300 $(($# + 1)) "$ZYG_MOH" "$@" || echo 124
}

zmoh() {
  local out=$1 err=$2
  shift 2
  if [ -z "$ZYG" ]; then
    timeout 300 "$ZYG_MOH" "$@" >"$out" 2>"$err" </dev/null
    return
  fi
  local rc
  rc=$(zygote_request "$out" "$err" "$@")
  ZYG_SERVED=$((ZYG_SERVED + 1))
  # A refusal is safe to repeat (a successful command's second run would meet its own output).
  if [ "$rc" != 0 ] && [ $((ZYG_SERVED % ZYGOTE_CHECK_EVERY)) = 0 ]; then
    local rc2
    timeout 300 "$ZYG_MOH" "$@" >/dev/null 2>"$err.real" </dev/null
    rc2=$?
    ZYG_CHECKED=$((ZYG_CHECKED + 1))
    if [ "$rc2" != "$rc" ] || ! cmp -s "$err" "$err.real"; then
      ZYG_DIFFERED=$((ZYG_DIFFERED + 1))
      echo "FAIL: moh $* in moh_zygote differs from moh itself: exit $rc against $rc2"
      diff "$err" "$err.real" | head -6 | sed 's/^/  | /'
    fi
    rm -f "$err.real"
  fi
  return "$rc"
}

zygote_stop() {
  [ -n "$ZYG" ] || return 0
  timeout 10 bash -c ': >"$0/req"' "$ZYG"
  wait "$ZYG_PID" 2>/dev/null
  echo "moh_zygote: $ZYG_SERVED requests, $ZYG_CHECKED of them also run as moh itself, $ZYG_DIFFERED differed"
  rm -rf "$ZYG"
  ZYG=""
}
