#!/usr/bin/env bash
# Data parallel on c10d / Gloo with two processes on 127.0.0.1 (moh launch): training equals a single process with the
# same global batch (classifier and DiT), sampling merges into the same .npz, evaluation gives the same top-1, and a
# rank that dies makes the other exit with an error instead of hanging; one that stops answering is named while waiting.
# usage: ddp_test.sh path/to/moh repo_root
set -u
MOH=$1
ROOT=$2
cd "$ROOT" || exit 1
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
pass=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
bad() { fails=$((fails + 1)); echo "FAIL: $*"; }
# run LOG -- ARGS: runs moh, keeps its output in LOG, echoes the exit code
run() { local log=$1; shift 2; "$MOH" "$@" >"$log" 2>&1; echo $?; }

if ! "$MOH" --version | grep -q "data parallel: c10d"; then
  echo "skipped: this build has no c10d/Gloo (install libgloo-dev)"; exit 0
fi
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  echo "skipped: dataset-fashion-mnist is not installed"; exit 0
fi

# Classifier: drop path and the load-balance term are off, the two things that legitimately differ per rank (drop
# masks are drawn per rank; MoH's balance loss is a product of batch means, computed on each rank's half). AdamW's
# eps is raised to 1e-3: with the default 1e-8 Adam turns gradients that are pure rounding noise into full-size ±lr
# steps whose signs differ between any two summation orders; with a large eps the update is linear in small
# gradients, so the comparison measures the gradients. The criterion is the whole model's relative L2 error: single
# tensors that start at zero (biases, DiT's zeroed final layer) carry ~1e-6 relative rounding differences of fp32
# sums in another order, and the last stage's CPB bias has an exact gradient of 0 (softmax ignores a constant
# shift), so it holds rounding noise only.
NANO=configs/fashion_mnist/moh_vit_nano.yaml
C=(--set train.device=cpu --set train.processes=1 --set data.limit_train=256 --set data.limit_val=96 --set data.batch_size=32 --set train.epochs=1 --set train.max_steps=6
   --set model.drop_path=0 --set train.moh_loss_coeff=0 --set train.log_every_steps=2 --set optim.eps=1e-3 --set train.precision=fp32)
[ "$(run "$tmp/c1.log" -- train $NANO "${C[@]}" --run-dir "$tmp/c1")" = 0 ] || bad "single-process classifier run: $(tail -3 "$tmp/c1.log")"
[ "$(run "$tmp/c2.log" -- launch --nproc 2 -- train $NANO "${C[@]}" --run-dir "$tmp/c2")" = 0 ] || bad "2-rank classifier run: $(tail -3 "$tmp/c2.log")"
if "$MOH" compare "$tmp/c1" "$tmp/c2" --l2 --tol 1e-6 >"$tmp/cmp.log"; then ok "classifier 2 ranks = 1 process: $(cat "$tmp/cmp.log")"
else bad "classifier weights differ: $(cat "$tmp/cmp.log")"; fi
grep -q "2 data-parallel ranks" "$tmp/c2.log" && ok "launch reports the world size" || bad "no world size line"
[ "$(grep -c . "$tmp/c2/metrics.jsonl")" = "$(grep -c . "$tmp/c1/metrics.jsonl")" ] && ok "one metrics file, written by rank 0" || bad "metrics lines differ"
l1=$(grep -o '"loss":[0-9.e-]*' "$tmp/c1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
l2=$(grep -o '"loss":[0-9.e-]*' "$tmp/c2/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
if awk -v a="$l1" -v b="$l2" 'BEGIN { n = split(a, x, " "); split(b, y, " "); if (n == 0) exit 1;
     for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-6 * x[i]) exit 1 } }'; then
  ok "logged losses equal within 1e-6: $l2"; else bad "losses: 1 process $l1 / 2 ranks $l2"; fi
t1=$("$MOH" eval $NANO "${C[@]}" --checkpoint "$tmp/c1" --json | grep '"top1"')
t2=$("$MOH" launch --nproc 2 -- eval $NANO "${C[@]}" --checkpoint "$tmp/c1" --json | grep '"top1"')
[ -n "$t1" ] && [ "$t1" = "$t2" ] && ok "eval 2 ranks: $t2" || bad "eval top-1 '$t2' vs '$t1'"

# DiT (pixel space, MHA, fp32): t, noise and the class-dropout mask are drawn for the global batch on every rank.
D=(--set train.device=cpu --set data.limit_train=256 --set data.batch_size=16 --set train.epochs=1 --set train.max_steps=4 --set train.precision=fp32
   --set train.log_every_steps=2 --set optim.eps=1e-3)
[ "$(run "$tmp/d1.log" -- train configs/fashion_mnist/dit_pixel.yaml "${D[@]}" --run-dir "$tmp/d1")" = 0 ] || bad "single DiT run: $(tail -3 "$tmp/d1.log")"
[ "$(run "$tmp/d2.log" -- launch --nproc 2 -- train configs/fashion_mnist/dit_pixel.yaml "${D[@]}" --run-dir "$tmp/d2")" = 0 ] || bad "2-rank DiT run: $(tail -3 "$tmp/d2.log")"
if "$MOH" compare "$tmp/d1" "$tmp/d2" --l2 --tol 1e-6 >"$tmp/cmp.log"; then ok "DiT 2 ranks = 1 process: $(cat "$tmp/cmp.log")"
else bad "DiT weights differ: $(cat "$tmp/cmp.log")"; fi

# Sampling: rank r draws batches r, r+2, ...; rank 0 merges them into the same .npz a single process writes.
S=(--device cpu --num-samples 10 --batch 3 --steps ddim4 --cfg-scale 2)
"$MOH" sample --checkpoint "$tmp/d1" "${S[@]}" --out "$tmp/s1" >/dev/null 2>&1
"$MOH" launch --nproc 2 -- sample --checkpoint "$tmp/d1" "${S[@]}" --out "$tmp/s2" >/dev/null 2>&1
cmp -s "$tmp/s1/samples.npz" "$tmp/s2/samples.npz" && ok "2-rank samples.npz is byte-identical" || bad "samples.npz differ"

# A rank that dies: the survivor's next collective fails (Gloo sees the closed connection) and it exits non-zero.
port=$((20000 + RANDOM % 20000))
K=(--set train.device=cpu --set data.limit_train=2048 --set data.batch_size=32 --set train.epochs=1 --set train.log_every_steps=1 --set train.processes=1)
env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=0 MOH_DIST_TIMEOUT=30 OMP_NUM_THREADS=1 \
  "$MOH" train $NANO "${K[@]}" --run-dir "$tmp/k" >"$tmp/k0.log" 2>&1 &
p0=$!
env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=1 MOH_DIST_TIMEOUT=30 OMP_NUM_THREADS=1 \
  "$MOH" train $NANO "${K[@]}" --run-dir "$tmp/k" >"$tmp/k1.log" 2>&1 &
p1=$!
pids+=("$p0" "$p1")
for _ in $(seq 1 1200); do [ -s "$tmp/k/metrics.jsonl" ] && break; sleep 0.1; done
kill -9 "$p1"
wait "$p1" 2>/dev/null
start=$(date +%s)
wait "$p0"
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" != 0 ] && grep -q "failed on rank 0 of 2" "$tmp/k0.log" && [ "$took" -le 60 ]; then
  ok "rank 0 exits $rc ${took}s after rank 1 died: $(grep -m1 "failed on rank" "$tmp/k0.log" | cut -c1-200)"
else bad "rank 0 after rank 1 died: exit $rc after ${took}s: $(tail -2 "$tmp/k0.log")"; fi
# The launcher stops the other ranks when one fails and returns its exit code.
[ "$(run "$tmp/l.log" -- launch --nproc 2 -- train $NANO --set optim.lr=-1 --run-dir "$tmp/l")" = 2 ] && \
  [ "$(grep -c '^error: ' "$tmp/l.log")" = 1 ] && ok "launch: a config error is one line, exit 2" || bad "launch bad config: $(cat "$tmp/l.log")"
# A rank ended by SIGKILL, which the kernel's out-of-memory killer sends, is named with that likely cause.
"$MOH" launch --nproc 2 -- train $NANO "${K[@]}" --run-dir "$tmp/m" >"$tmp/m.log" 2>&1 &
pm=$!
pids+=("$pm")
for _ in $(seq 1 1200); do [ -s "$tmp/m/metrics.jsonl" ] && break; sleep 0.1; done
kill -9 "$(pgrep -P "$pm" | tail -1)"
wait "$pm"
rc=$?
if [ "$rc" != 0 ] && grep -q "was killed by signal 9 (SIGKILL: most likely out of memory" "$tmp/m.log"; then
  ok "launch: a rank killed by SIGKILL: $(grep -m1 'killed by signal' "$tmp/m.log" | cut -c1-160)"
else bad "launch, a rank killed by SIGKILL: exit $rc: $(tail -3 "$tmp/m.log")"; fi

# A rank that stops answering (SIGSTOP) leaves no silent wait: the launcher names it at once, the waiting rank names
# it (host, pid) after 30 s and says when it gives up, and the run ends with exit 1 at MOH_DIST_TIMEOUT.
MOH_DIST_TIMEOUT=40 "$MOH" launch --nproc 2 -- train $NANO "${K[@]}" --run-dir "$tmp/st" >"$tmp/st.log" 2>&1 &
ps_=$!
pids+=("$ps_")
for _ in $(seq 1 1200); do [ -s "$tmp/st/metrics.jsonl" ] && break; sleep 0.1; done
stopped=$(pgrep -P "$ps_" | tail -1)
kill -STOP "$stopped"
start=$(date +%s)
for _ in $(seq 1 300); do grep -q "rank 1 (pid $stopped) was stopped by signal 19" "$tmp/st.log" && break; sleep 0.1; done
named=$(( $(date +%s) - start ))
wait "$ps_"
rc=$?
took=$(( $(date +%s) - start ))
[ "$named" -le 30 ] && grep -q "rank 1 (pid $stopped) was stopped by signal 19" "$tmp/st.log" &&
  ok "launch names the stopped rank after ${named}s" || bad "launch did not name the stopped rank: $(tail -3 "$tmp/st.log")"
if grep -Eq "^moh: rank 0 has waited (29|3[0-9]) s in all-reduce #[0-9]+ for rank 1 \(host [^,]+, [^,]+, pid $stopped\), which has not reached it; it gives up after 40 s \(MOH_DIST_TIMEOUT\), in 1?[0-9] s$" "$tmp/st.log"; then
  ok "the waiting rank names whom it waits for: $(grep -m1 '^moh: rank 0 has waited' "$tmp/st.log")"
else bad "no line from the waiting rank: $(grep -v '^step\|%' "$tmp/st.log" | tail -5)"; fi
[ "$rc" = 1 ] && [ "$took" -le 90 ] && grep -q "lost rank 1 (host" "$tmp/st.log" &&
  ok "the run ends with exit 1 ${took}s after the stop, naming rank 1" || bad "after a stopped rank: exit $rc after ${took}s: $(tail -3 "$tmp/st.log")"

# A diverging run on 2 ranks (optim.lr 10, weight decay 100): both ranks see the same averaged gradients, so both skip the same
# steps and stop together at train.max_nonfinite_steps — exit 1 and one error line for the machine, not one per rank.
V=(--set train.device=cpu --set data.limit_train=512 --set data.batch_size=32 --set train.epochs=2 --set optim.lr=10
   --set optim.weight_decay=100 --set train.precision=fp32 --set train.max_nonfinite_steps=3)
code=$(run "$tmp/v.log" -- launch --nproc 2 -- train $NANO "${V[@]}" --run-dir "$tmp/v")
[ "$code" = 1 ] && ok "2-rank diverging run exits 1" || bad "2-rank diverging run: exit $code: $(tail -3 "$tmp/v.log")"
[ "$(grep -c '^error:' "$tmp/v.log")" = 1 ] && grep -q '^error: training diverged: non-finite loss or gradients' "$tmp/v.log" &&
  ok "one line: $(grep '^error:' "$tmp/v.log")" || bad "diverging run's errors: $(grep error "$tmp/v.log")"

echo "ddp_test: $pass passed, $fails failed"
[ "$fails" = 0 ]
