#!/usr/bin/env bash
# Two hosts over a network: two network namespaces joined by a veth pair, each with its own address, and one
# `moh launch --nnodes 2 --node_rank R --nproc_per_node 1 --master_addr <host 0>` in each (what two machines run).
# The checkpoints must equal those of one host running two processes, bit for bit (hashes of every tensor file).
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
C=(--set train.device=cpu --set train.processes=1 --set data.limit_train=256 --set data.limit_val=64 --set data.batch_size=32
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

echo "multihost_test: $pass passed, $fails failed"
[ "$fails" = 0 ]
