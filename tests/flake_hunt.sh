#!/usr/bin/env bash
# Hunts tests that fail by chance: every GoogleTest binary of the given build directories, run many times in shuffled
# order (--gtest_shuffle draws a new order each repetition; the seeds are printed, so an order that fails replays with
# --gtest_random_seed=SEED). Tests are timed by one plain pass first; those taking at least SLOW_SECONDS repeat
# SLOW_REPEAT times, the others REPEAT times. Prints one line per binary and a table of every test that failed, with
# its count and the seeds of the failing repetitions; exit 1 when anything failed.
#   usage: tests/flake_hunt.sh [BUILD_DIR...]            (default: build build-torch2, those that exist)
#   env:   REPEAT (20), SLOW_REPEAT (5), SLOW_SECONDS (2), FILTER (a --gtest_filter for all runs, default *),
#          OUT (flake_hunt/: every run's log and JSON)
set -uo pipefail
cd "$(dirname "$0")/.."
REPEAT=${REPEAT:-20} SLOW_REPEAT=${SLOW_REPEAT:-5} SLOW_SECONDS=${SLOW_SECONDS:-2} FILTER=${FILTER:-*}
OUT=$(realpath -m "${OUT:-flake_hunt}")
PY=${PY:-$(command -v .venv/bin/python || command -v python3)}
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || for d in build build-torch2; do [ -d "$d/tests" ] && dirs+=("$d"); done
[ ${#dirs[@]} -gt 0 ] || { echo "error: flake_hunt: no build directory with tests (scripts/setup.sh)" >&2; exit 2; }
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The tests of a JSON report taking >= SLOW_SECONDS, as a gtest filter (":"-joined), or "" when none.
slow_filter() {
  "$PY" - "$1" "$SLOW_SECONDS" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
slow = [s["name"] + "." + t["name"] for s in r["testsuites"] for t in s["testsuite"]
        if float(t.get("time", "0s").rstrip("s")) >= float(sys.argv[2])]
print(":".join(slow))
EOF
}

failed=0
for d in "${dirs[@]}"; do
  for bin in "$d"/tests/moh_tests_*; do
    [ -x "$bin" ] || continue
    tag=$(basename "$d")_$(basename "$bin")
    "$bin" --gtest_filter="$FILTER" --gtest_output="json:$OUT/${tag}_timing.json" >"$OUT/${tag}_timing.log" 2>&1 ||
      echo "flake_hunt: $tag: the timing pass itself failed ($OUT/${tag}_timing.log)"
    slow=$(slow_filter "$OUT/${tag}_timing.json")
    fast="$FILTER"
    [ -n "$slow" ] && fast="$FILTER-$slow"
    "$bin" --gtest_filter="$fast" --gtest_repeat="$REPEAT" --gtest_shuffle >"$OUT/${tag}_fast.log" 2>&1 || failed=1
    if [ -n "$slow" ]; then
      "$bin" --gtest_filter="$slow" --gtest_repeat="$SLOW_REPEAT" --gtest_shuffle >"$OUT/${tag}_slow.log" 2>&1 || failed=1
    fi
    n_slow=$(echo "$slow" | tr ':' '\n' | grep -c . || true)
    echo "flake_hunt: $tag: fast tests x$REPEAT, $n_slow slow tests (>= ${SLOW_SECONDS} s) x$SLOW_REPEAT"
  done
done
# Every failure of every repetition, with the shuffle seed of that repetition.
"$PY" - "$OUT" <<'EOF'
import collections, glob, re, sys
counts, seeds = collections.Counter(), collections.defaultdict(set)
for log in sorted(glob.glob(sys.argv[1] + "/*_fast.log") + glob.glob(sys.argv[1] + "/*_slow.log")):
    seed = "?"
    for line in open(log, errors="replace"):
        m = re.search(r"Randomizing tests' orders with a seed of (\d+)", line)
        if m:
            seed = m.group(1)
        m = re.match(r"\[  FAILED  \] (\S+) \(", line)
        if m:
            key = log.rsplit("/", 1)[1].rsplit("_", 1)[0] + " " + m.group(1)
            counts[key] += 1
            seeds[key].add(seed)
if counts:
    print("| build / binary | test | failures | shuffle seeds |\n|---|---|---|---|")
    for key, n in counts.most_common():
        where, test = key.split(" ")
        print(f"| {where} | {test} | {n} | {', '.join(sorted(seeds[key]))} |")
else:
    print("flake_hunt: no failure in any repetition")
EOF
exit $failed
