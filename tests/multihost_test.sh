#!/usr/bin/env bash
# Two hosts over a network: two network namespaces joined by a veth pair, each with its own address, and one
# `moh launch --nnodes 2 --node_rank R --nproc_per_node 1 --master_addr <host 0>` in each (what two machines run).
# The checkpoints must equal those of one host running two processes, bit for bit (hashes of every tensor file).
# Then the failures of issue 37: host 1 lost mid-run (host 0 exits 1 naming it), another world size, another config,
# a port in use, an unreachable master; and a run with --max-restarts that loses host 1's rank once and finishes with
# the weights of an uninterrupted run.
# Needs root and network namespaces; where they are not permitted it says why in one line and passes.
# usage: multihost_test.sh path/to/moh repo_root
set -u
MOH=$1
ROOT=$2
cd "$ROOT" || exit 1
skip() { echo "multihost_test: skipped: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root for network namespaces (ip netns)"
command -v ip >/dev/null || skip "no ip command (iproute2)"
"$MOH" --version | grep -q "data parallel: c10d" || skip "this build has no c10d/Gloo"
[ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] || skip "dataset-fashion-mnist is not installed"

tag=moh$$ tmp=$(mktemp -d)
ns0=${tag}h0 ns1=${tag}h1 addr0=10.231.0.1 addr1=10.231.0.2
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$ns0" 2>/dev/null; ip netns del "$ns1" 2>/dev/null; rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns0" 2>"$tmp/ns.err" || skip "network namespaces not permitted here: $(head -1 "$tmp/ns.err")"
ip netns add "$ns1" || exit 1
ip link add "${tag}a" netns "$ns0" type veth peer name "${tag}b" netns "$ns1" || exit 1
ip -n "$ns0" addr add "$addr0/24" dev "${tag}a" && ip -n "$ns1" addr add "$addr1/24" dev "${tag}b" || exit 1
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "${tag}a" up && ip -n "$ns1" link set "${tag}b" up || exit 1

fails=0 pass=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
bad() { fails=$((fails + 1)); echo "FAIL: $*"; }
# Every tensor file of a run's checkpoints with its hash, by relative path.
hashes() { (cd "$1/checkpoints" && find . -name '*.safetensors' | sort | xargs sha256sum); }

NANO=configs/fashion_mnist/moh_vit_nano.yaml
C=(--set train.device=cpu --set train.processes=1 --set data.limit_train=256 --set data.limit_val=64 --set data.batch_size=48
   --set train.epochs=1 --set train.max_steps=4 --set train.log_every_steps=2)
export OMP_NUM_THREADS=1 MOH_DIST_TIMEOUT=60
port=$((20000 + RANDOM % 20000))
for r in 1 0; do
  ip netns exec "$([ $r = 0 ] && echo "$ns0" || echo "$ns1")" "$MOH" launch --nnodes 2 --node_rank $r --nproc_per_node 1 \
    --master_addr "$addr0" --master_port "$port" -- train $NANO "${C[@]}" --run-dir "$tmp/two_hosts" >"$tmp/h$r.log" 2>&1 &
  pids+=("$!")
done
wait "${pids[1]}"; rc0=$?
wait "${pids[0]}"; rc1=$?
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] && ok "two hosts trained (exit $rc0 / $rc1)" ||
  bad "two hosts: exit $rc0 / $rc1: $(tail -2 "$tmp/h0.log") | $(tail -2 "$tmp/h1.log")"
grep -q "2 data-parallel ranks" "$tmp/h0.log" && ok "host 0 reports 2 ranks" || bad "no world-size line on host 0"
"$MOH" launch --nproc 2 --master_port $((port + 1)) -- train $NANO "${C[@]}" --run-dir "$tmp/one_host" >"$tmp/one.log" 2>&1 ||
  bad "one host, two processes: $(tail -2 "$tmp/one.log")"
hashes "$tmp/two_hosts" >"$tmp/two.sha" 2>/dev/null
hashes "$tmp/one_host" >"$tmp/one.sha" 2>/dev/null
if [ -s "$tmp/one.sha" ] && cmp -s "$tmp/one.sha" "$tmp/two.sha"; then
  ok "checkpoints of 2 hosts × 1 process = 1 host × 2 processes, bit for bit ($(wc -l <"$tmp/one.sha") files)"
else bad "checkpoint hashes differ: $(diff "$tmp/one.sha" "$tmp/two.sha" | head -4 | tr '\n' ' ')"; fi

# --- failures --------------------------------------------------------------------------------------------------------
ns_of() { [ "$1" = 0 ] && echo "$ns0" || echo "$ns1"; }
# host R [launch flags...] -- [train args...]: one machine's launcher, in the background, output in $tmp/<tag>.h<R>.log
host() {
  local r=$1 tag=$2 port=$3; shift 3
  ip netns exec "$(ns_of "$r")" "$MOH" launch --nnodes 2 --node_rank "$r" --nproc_per_node 1 --master_addr "$addr0" \
    --master_port "$port" "$@" >"$tmp/$tag.h$r.log" 2>&1 &
}
# Waits for pid at most $2 s and sets RC to its exit code (or "timeout", after killing it). Not in $(...): a subshell
# cannot wait for this shell's children.
wait_for() {
  local t=0
  while kill -0 "$1" 2>/dev/null && [ "$t" -lt $(($2 * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1"; wait "$1" 2>/dev/null; RC=timeout; else wait "$1"; RC=$?; fi
}
one_line() { grep -c '^error: ' "$1"; }
L=(--set data.limit_train=256 --set data.batch_size=32 --set train.epochs=3 --set train.max_steps=0)

# Host 1 lost mid-run: its processes killed after the first checkpoint; host 0 must exit 1 within 60 s naming it.
port=$((port + 2))
host 1 lost "$port" -- train $NANO "${C[@]}" "${L[@]}" --run-dir "$tmp/lost"; p1=$!
host 0 lost "$port" -- train $NANO "${C[@]}" "${L[@]}" --run-dir "$tmp/lost"; p0=$!
pids+=("$p0" "$p1")
for _ in $(seq 600); do [ -e "$tmp/lost/checkpoints/latest" ] && break; sleep 0.1; done
ip netns pids "$ns1" | xargs -r kill -9
t0=$(date +%s)
wait_for "$p0" 90; rc=$RC
dt=$(($(date +%s) - t0))
if [ "$rc" = 1 ] && [ "$dt" -le 60 ] && grep -q "lost rank 1 (host .*$addr1, pid [0-9]*)" "$tmp/lost.h0.log" &&
  [ "$(one_line "$tmp/lost.h0.log")" = 1 ]; then
  ok "host 1 lost: host 0 exits 1 after ${dt} s: $(grep '^error: ' "$tmp/lost.h0.log" | cut -c1-150)"
else bad "host 1 lost: exit $rc after ${dt} s: $(tail -3 "$tmp/lost.h0.log" | tr '\n' ' ' | cut -c1-400)"; fi
"$MOH" launch --nproc 2 --master_port $((port + 1)) -- train $NANO "${C[@]}" "${L[@]}" --run-dir "$tmp/lost" \
  --resume auto >"$tmp/lost.resume.log" 2>&1 && ok "the lost run resumes from its checkpoint on one host" ||
  bad "the lost run does not resume: $(tail -2 "$tmp/lost.resume.log")"

# Machines started differently: each is refused with one line and exit 2 on both hosts, within the timeout.
refused() {  # tag expected-text port flags1... (host 1's extra launch flags, then -- and its extra train args)
  local tag=$1 text=$2 port=$3; shift 3
  local extra=("$@") t0 rc0 rc1
  t0=$(date +%s)
  host 0 "$tag" "$port" -- train $NANO "${C[@]}" --run-dir "$tmp/$tag.0"; local q0=$!
  ip netns exec "$ns1" "$MOH" launch --node_rank 1 --nproc_per_node 1 --master_addr "$addr0" --master_port "$port" \
    "${extra[@]}" --run-dir "$tmp/$tag.1" >"$tmp/$tag.h1.log" 2>&1 &
  local q1=$!
  pids+=("$q0" "$q1")
  wait_for "$q0" 60; rc0=$RC; wait_for "$q1" 60; rc1=$RC
  if [ "$rc0" = 2 ] && [ "$rc1" = 2 ] && grep -q "$text" "$tmp/$tag.h0.log" && grep -q "$text" "$tmp/$tag.h1.log" &&
    [ "$(one_line "$tmp/$tag.h0.log")" = 1 ]; then
    ok "$tag refused on both hosts in $(($(date +%s) - t0)) s: $(grep '^error: ' "$tmp/$tag.h0.log" | cut -c1-150)"
  else bad "$tag: exit $rc0 / $rc1: $(tail -2 "$tmp/$tag.h0.log" | tr '\n' ' ') | $(tail -2 "$tmp/$tag.h1.log" | tr '\n' ' ')"; fi
}
refused world "was started for 3 processes" $((port + 3)) --nnodes 3 -- train $NANO "${C[@]}"
refused config "has another config" $((port + 4)) --nnodes 2 -- train $NANO "${C[@]}" --set train.seed=7

# A port in use on host 0: refused there at once (exit 2); host 1 gives up within the rendezvous timeout (exit 1).
port=$((port + 5))
ip netns exec "$ns0" python3 -c "import socket,time; s=socket.socket(); s.bind(('0.0.0.0',$port)); s.listen(); time.sleep(120)" &
pids+=("$!")
sleep 1
MOH_DIST_TIMEOUT=10 host 1 busy "$port" -- train $NANO "${C[@]}" --run-dir "$tmp/busy"; q1=$!
MOH_DIST_TIMEOUT=10 host 0 busy "$port" -- train $NANO "${C[@]}" --run-dir "$tmp/busy"; q0=$!
pids+=("$q0" "$q1")
wait_for "$q0" 30; rc0=$RC; wait_for "$q1" 40; rc1=$RC
[ "$rc0" = 2 ] && grep -q "already in use on this machine" "$tmp/busy.h0.log" && [ ! -e "$tmp/busy" ] &&
  ok "port in use: host 0 refused (exit 2): $(grep '^error: ' "$tmp/busy.h0.log")" ||
  bad "port in use, host 0: exit $rc0: $(tail -2 "$tmp/busy.h0.log")"
[ "$rc1" = 1 ] && [ "$(one_line "$tmp/busy.h1.log")" = 1 ] &&
  ok "port in use: host 1 gives up (exit 1): $(grep '^error: ' "$tmp/busy.h1.log" | cut -c1-150)" ||
  bad "port in use, host 1: exit $rc1: $(tail -2 "$tmp/busy.h1.log")"

# An unreachable master: one line, exit 1, within the timeout.
t0=$(date +%s)
ip netns exec "$ns1" env MOH_DIST_TIMEOUT=5 "$MOH" launch --nnodes 2 --node_rank 1 --nproc_per_node 1 \
  --master_addr 10.231.0.9 --master_port "$port" -- train $NANO "${C[@]}" --run-dir "$tmp/nomaster" >"$tmp/nomaster.log" 2>&1 &
q1=$!
pids+=("$q1")
wait_for "$q1" 40; rc1=$RC
[ "$rc1" = 1 ] && grep -q "cannot reach the master at 10.231.0.9" "$tmp/nomaster.log" && [ "$(one_line "$tmp/nomaster.log")" = 1 ] &&
  ok "unreachable master: exit 1 after $(($(date +%s) - t0)) s: $(grep '^error: ' "$tmp/nomaster.log" | cut -c1-150)" ||
  bad "unreachable master: exit $rc1: $(tail -2 "$tmp/nomaster.log")"

# --max-restarts: host 1's rank killed once after the first checkpoint; both hosts restart and finish with the weights
# of an uninterrupted run.
port=$((port + 1))
host 1 restart "$port" --max-restarts 1 -- train $NANO "${C[@]}" "${L[@]}" --run-dir "$tmp/restart"; p1=$!
host 0 restart "$port" --max-restarts 1 -- train $NANO "${C[@]}" "${L[@]}" --run-dir "$tmp/restart"; p0=$!
pids+=("$p0" "$p1")
for _ in $(seq 600); do [ -e "$tmp/restart/checkpoints/latest" ] && break; sleep 0.1; done
pkill -9 -P "$p1"  # host 1's rank (the launcher stays and restarts it)
wait_for "$p0" 180; rc0=$RC; wait_for "$p1" 180; rc1=$RC
"$MOH" launch --nproc 2 --master_port $((port + 1)) -- train $NANO "${C[@]}" "${L[@]}" --run-dir "$tmp/straight" \
  >"$tmp/straight.log" 2>&1 || bad "uninterrupted run: $(tail -2 "$tmp/straight.log")"
last() { (cd "$1/checkpoints/$(cat "$1/checkpoints/latest")" && sha256sum ./*.safetensors); }
if [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -q "restart 1 of at most 1" "$tmp/restart/log.txt" &&
  grep -q '"event":"restart"' "$tmp/restart/metrics.jsonl" && grep -q "a rank failed (signal 9)" "$tmp/restart.h1.log" &&
  cmp -s <(last "$tmp/restart") <(last "$tmp/straight"); then
  ok "--max-restarts 1: one kill, both hosts restarted, final checkpoint = uninterrupted run's ($(last "$tmp/straight" | wc -l) files)"
else
  bad "--max-restarts: exit $rc0 / $rc1; $(grep -c restart "$tmp/restart/log.txt" 2>/dev/null) restart lines;" \
    "$(tail -2 "$tmp/restart.h0.log" | tr '\n' ' ') | $(tail -2 "$tmp/restart.h1.log" | tr '\n' ' ')"
fi

echo "multihost_test: $pass passed, $fails failed"
[ "$fails" = 0 ]
