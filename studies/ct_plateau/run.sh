#!/usr/bin/env bash
# Continue-tuning from a dense DiT trained to its plateau (issue 57), on the embedded data:
#   1. per seed, a dense DiT-Pixel/4 trained SEGMENT epochs at a time (exact resume at epoch ends) and its FID measured
#      after each segment on two sample sets (CHECK_SAMPLES each, sampling seeds 101 and 102); it stops when the last
#      improvement is within the noise (FID_prev - FID_now < 2 sigma, sigma pooled from the two-set spreads of its own
#      checks), at MAX_EPOCHS, or when DENSE_BUDGET seconds of the study have passed (the row then says so);
#   2. the dense EMA converted to MoH-DiT-Pixel/4-75 for every router × shared-head choice, each continue-tuned for
#      PCTS % of the dense steps (one run per conversion: its checkpoint at the smaller share is kept and measured, the
#      same model a separate shorter run gives under the constant lr), and MoH-DiT from scratch for 100 + PCTS % of
#      the dense steps (one run, checkpoints kept likewise);
#   3. every model's FID on SAMPLES samples, all with the seed's sampling seed (common random numbers for the paired
#      differences), one feature network and one reference set; each row carries its provenance (the device, LibTorch
#      and commit that trained and sampled it, as moh recorded them; the parent's, features' and reference's hashes).
# Jobs run side by side, at most JOBS at a time (a GPU left waiting on small kernels is filled by the others).
# Rows: OUT/rows.jsonl (final measurements), OUT/checks.jsonl (the plateau checks), OUT/protocol_LABEL.txt (a line per
# start: a study finished by a second call keeps both); the table:
# studies/ct_plateau/table.py OUT. Started again, finished runs and measured rows are skipped.
#
# usage: studies/ct_plateau/run.sh OUT
# env: FEATURE_RUN (required: the classifier run whose features every FID uses) MOH (build/moh) RUNS (OUT/runs)
#      LABEL (this machine's table: gpu or cpu) SEEDS ("1 2 3 4") JOBS (8) BATCH (256) LR (1e-3) CT_LR (LR / 2)
#      SEGMENT (4 epochs) MAX_EPOCHS (40) DENSE_BUDGET (0: none; seconds) DEADLINE (0: none; seconds after which no
#      new job starts) CHECK_SAMPLES (2000) SAMPLES (5000) ROUTERS ("learned query_norm")
#      CHOICES ("first importance learned") PCTS ("10 25") SAMPLER ("--sampler dpm++2m --steps 12 --cfg-scale 4")
#      SAMPLE_BATCH (1000) PRECISION (fp32) LIMIT (0: every training image)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
OUT=$(realpath -m "$1")
MOH=${MOH:-build/moh} LABEL=${LABEL:-cpu} SEEDS=${SEEDS:-"1 2 3 4"} JOBS=${JOBS:-8} BATCH=${BATCH:-256}
LR=${LR:-1e-3} SEGMENT=${SEGMENT:-4} MAX_EPOCHS=${MAX_EPOCHS:-40} DENSE_BUDGET=${DENSE_BUDGET:-0}
DEADLINE=${DEADLINE:-0} CHECK_SAMPLES=${CHECK_SAMPLES:-2000} SAMPLES=${SAMPLES:-5000}
ROUTERS=${ROUTERS:-"learned query_norm"} CHOICES=${CHOICES:-"first importance learned"} PCTS=${PCTS:-"10 25"}
SAMPLER=${SAMPLER:-"--sampler dpm++2m --steps 12 --cfg-scale 4"} SAMPLE_BATCH=${SAMPLE_BATCH:-1000}
PRECISION=${PRECISION:-fp32} LIMIT=${LIMIT:-0} RUNS=${RUNS:-$OUT/runs}
CT_LR=${CT_LR:-$(python3 -c "print(float('$LR') / 2)")}
[ -d "${FEATURE_RUN:-/nonexistent}/checkpoints" ] ||
  { echo "error: FEATURE_RUN=${FEATURE_RUN:-}: not a classifier run (no checkpoints/) (name the FID feature network)" >&2; exit 2; }
[ -x "$MOH" ] || { echo "error: $MOH: not found (run scripts/setup.sh first)" >&2; exit 2; }
MOH=$(realpath "$MOH") FEATURE_RUN=$(realpath "$FEATURE_RUN")
mkdir -p "$OUT/logs" "$RUNS"
T0=$(date +%s)
LIBTORCH=$("$MOH" --version | sed -n 2p)
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
else MACHINE=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); fi
STATS=$RUNS/fm_test_stats.npz
[ -f "$STATS" ] || "$MOH" ref-stats --images fashion_mnist:test --features "classifier:$FEATURE_RUN" --out "$STATS" >/dev/null
sha() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }
FEATURE_SHA=$(sha "$FEATURE_RUN/checkpoints/$(cat "$FEATURE_RUN/checkpoints/latest")/model.safetensors")
REF_SHA=$(sha "$STATS")
COMMON="\"machine\": \"$MACHINE\", \"libtorch\": \"$LIBTORCH\", \"label\": \"$LABEL\", \"feature_sha256\": \"$FEATURE_SHA\", \"reference_sha256\": \"$REF_SHA\", \"batch\": $BATCH, \"lr\": $LR, \"ct_lr\": $CT_LR, \"precision\": \"$PRECISION\", \"sampler\": \"$SAMPLER\""
echo "protocol ($LABEL): $MACHINE, $LIBTORCH; seeds $SEEDS; batch $BATCH, lr $LR (continue-tuning $CT_LR), $PRECISION;" \
  "dense in segments of $SEGMENT epochs up to $MAX_EPOCHS (budget ${DENSE_BUDGET}s, 0 = none), plateau checks on 2 x" \
  "$CHECK_SAMPLES samples; routers $ROUTERS; shared heads $CHOICES; extra steps $PCTS %; FID on $SAMPLES samples" \
  "($SAMPLER, sampling seed = training seed), feature network $FEATURE_SHA, reference $REF_SHA; training images" \
  "${LIMIT/#0/all}; at most $JOBS jobs at a time; started $(date -u +%FT%TZ)" | tee -a "$OUT/protocol_$LABEL.txt"
touch "$OUT/rows.jsonl" "$OUT/checks.jsonl"
log() { echo "[+$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/driver.log" >&2; }

# A pool of JOBS tokens shared by every background pipeline: a GPU process runs only while it holds one.
POOL=$OUT/.pool
rm -f "$POOL" && mkfifo "$POOL" && exec 9<>"$POOL" && rm -f "$POOL"
for _ in $(seq "$JOBS"); do echo >&9; done
late() { [ "$DEADLINE" -gt 0 ] && [ $(($(date +%s) - T0)) -ge "$DEADLINE" ]; }
# gpu NAME CMD...: CMD while holding a token, output in logs/NAME.log; refused (status 3) once DEADLINE has passed.
gpu() {
  local name=$1 rc=0 _t
  shift
  read -r -u 9 _t
  if late; then echo >&9; log "$name: skipped (deadline)"; return 3; fi
  "$@" >>"$OUT/logs/$name.log" 2>&1 || rc=$?
  echo >&9
  [ $rc -eq 0 ] || log "$name FAILED ($rc): $(tail -n1 "$OUT/logs/$name.log")"
  return $rc
}
ckpt() { echo "$RUNS/$1/checkpoints/$(printf %07d "$2")"; }  # ckpt RUN STEP: that step's checkpoint directory
steps_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$RUNS/$1/checkpoints/$(cat "$RUNS/$1/checkpoints/latest")/trainer_state.json"; }
have() { grep -qF "\"id\": \"$2\"" "$OUT/$1"; }
train_args() {  # the settings every training run shares
  echo --set data.batch_size="$BATCH" --set train.precision="$PRECISION" --set data.limit_train="$LIMIT" \
    --set train.eval_every_epochs=1000 --set train.keep_last=1
}

# fid NAME CKPT N SSEED: FID of N samples of CKPT (sampling seed SSEED) → prints the FID; report in logs/NAME.fid/
fid() {
  local dir=$OUT/logs/$1.fid
  rm -rf "$dir"
  # shellcheck disable=SC2086  # SAMPLER holds words
  gpu "$1.sample" "$MOH" sample --checkpoint "$2" --num-samples "$3" --seed "$4" $SAMPLER --batch "$SAMPLE_BATCH" \
    --out "$dir" || return 1
  gpu "$1.fid" "$MOH" fid --samples "$dir/samples.npz" --ref "$STATS" --features "classifier:$FEATURE_RUN" \
    --batch 1000 --out "$dir/fid" || return 1
  rm -f "$dir/samples.npz" "$dir"/*.png
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"]["fid"])' "$dir/fid/report.json"
}

# ran_on ID: where ID's samples were made and its checkpoint trained, as moh recorded them (sampling.json; not a guess
# from the host: a job can run on the CPU of a GPU machine), as JSON members to splice into a row
ran_on() {
  python3 - "$OUT/logs/$1.fid/sampling.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
p, t = s["provenance"], s.get("checkpoint_written_by") or {}
on = lambda p: f'{p["device"]} ({p["device_name"]})' if p else None
by = lambda p: f'LibTorch {p["libtorch"]}, commit {p["commit"]}' if p else None
print(json.dumps({"sampled_on": on(p), "sampled_by": by(p), "trained_on": on(t), "trained_by": by(t)})[1:-1])
PY
}

# decide SEED: go (train another segment), plateau or max_epochs, from the seed's checks so far
decide() { python3 studies/ct_plateau/table.py --decide "$OUT" "$1" "$MAX_EPOCHS"; }
last_epoch() {
  python3 -c 'import json,sys; print(max([r["epoch"] for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip()) if r["seed"] == int(sys.argv[2])] or [0]))' "$OUT/checks.jsonl" "$1"
}

# dense SEED: segments until the plateau rule, MAX_EPOCHS or DENSE_BUDGET stops it (RUNS/dit_dense_sSEED.stop says which)
dense() {
  local s=$1 run=dit_dense_s$1 e verdict fa fb
  [ -f "$RUNS/$run.stop" ] && return 0
  e=$(last_epoch "$s")
  while verdict=$(decide "$s") && [ "$verdict" = go ]; do
    if [ "$DENSE_BUDGET" -gt 0 ] && [ $(($(date +%s) - T0)) -ge "$DENSE_BUDGET" ]; then verdict=budget; break; fi
    e=$((e + SEGMENT))
    # shellcheck disable=SC2046  # train_args are words
    gpu "${run}_e$e" "$MOH" train configs/fashion_mnist/dit_pixel.yaml --run-dir "$RUNS/$run" --resume auto \
      $(train_args) --set train.seed="$s" --set optim.lr="$LR" --set train.epochs="$e" \
      --set train.ckpt_every_epochs="$SEGMENT" || return 1
    fa=$(fid "${run}_e${e}_a" "$RUNS/$run" "$CHECK_SAMPLES" 101) && fb=$(fid "${run}_e${e}_b" "$RUNS/$run" "$CHECK_SAMPLES" 102) ||
      return 1
    echo "{\"id\": \"${run}_e$e\", \"seed\": $s, \"epoch\": $e, \"step\": $(steps_of "$run"), \"fid_a\": $fa, \"fid_b\": $fb, \"samples\": $CHECK_SAMPLES, $(ran_on "${run}_e${e}_a"), $COMMON}" >>"$OUT/checks.jsonl"
    log "$run: epoch $e FID $fa / $fb"
  done
  echo "$verdict" >"$RUNS/$run.stop"
  log "$run: stopped at epoch $e ($verdict)"
}

# measure ID CKPT SEED WHAT ROUTER CHOICE PCT EXTRA_STEPS: one row of rows.jsonl
measure() {
  have rows.jsonl "$1" && return 0
  local f dense=dit_dense_s$3 n
  f=$(fid "$1" "$2" "$SAMPLES" "$3") || return 1
  n=$(steps_of "$dense")
  echo "{\"id\": \"$1\", \"seed\": $3, \"what\": \"$4\", \"router\": \"$5\", \"choice\": \"$6\", \"pct\": $7, \"extra_steps\": $8, \"dense_steps\": $n, \"dense_stop\": \"$(cat "$RUNS/$dense.stop")\", \"parent_sha256\": \"$(sha "$(ckpt "$dense" "$n")/ema.safetensors")\", \"checkpoint\": \"${2#"$RUNS"/}\", \"fid\": $f, \"samples\": $SAMPLES, $(ran_on "$1"), $COMMON}" >>"$OUT/rows.jsonl"
  log "$1: FID $f"
}
share() { local n=$(($1 * $2 / 100)); echo $((n > 0 ? n : 1)); }  # share STEPS PCT: at least 1 step
PCT_LO=$(echo "$PCTS" | tr ' ' '\n' | sort -n | head -n1) PCT_HI=$(echo "$PCTS" | tr ' ' '\n' | sort -n | tail -n1)

# continue_tune SEED ROUTER CHOICE N: convert, one run to PCT_HI % of N with the PCT_LO % checkpoint kept, both measured
continue_tune() {
  local s=$1 r=$2 c=$3 n=$4 init=dit_${2}_${3}_s$1 run lo hi
  run=${init}_ct lo=$(share "$n" "$PCT_LO") hi=$(share "$n" "$PCT_HI")
  if [ ! -f "$RUNS/$init/conversion.json" ]; then
    rm -rf "${RUNS:?}/$init"
    gpu "$init" "$MOH" convert --to-moh configs/fashion_mnist/continue_dit_pixel_75.yaml --in "$RUNS/dit_dense_s$s" \
      --key ema --out "$RUNS/$init" --set model.router="$r" --shared-heads "$c" --set data.limit_train="$LIMIT" || return 1
  fi
  if [ ! -f "$RUNS/$run.done" ]; then
    rm -rf "${RUNS:?}/$run"
    # shellcheck disable=SC2046
    gpu "$run" "$MOH" train configs/fashion_mnist/continue_dit_pixel_75.yaml --run-dir "$RUNS/$run" $(train_args) \
      --set model.weights="$RUNS/$init" --set model.router="$r" --set train.seed="$s" --set optim.lr="$CT_LR" \
      --set train.epochs=1000 --set train.max_steps="$hi" --set train.ckpt_every_steps="$lo" \
      --set train.keep_every_steps="$lo" || return 1
    touch "$RUNS/$run.done"
  fi
  measure "${run}$PCT_HI" "$(ckpt "$run" "$hi")" "$s" converted "$r" "$c" "$PCT_HI" "$hi" || return 1
  measure "${run}$PCT_LO" "$(ckpt "$run" "$lo")" "$s" converted "$r" "$c" "$PCT_LO" "$lo"
}

# scratch SEED N: MoH-DiT from scratch for N + PCT_HI % steps, its N + PCT_LO % checkpoint kept; both measured
scratch() {
  local s=$1 n=$2 run=dit_scratch_s$1 lo hi
  lo=$((n + $(share "$n" "$PCT_LO"))) hi=$((n + $(share "$n" "$PCT_HI")))
  if [ ! -f "$RUNS/$run.done" ]; then
    rm -rf "${RUNS:?}/$run"
    # shellcheck disable=SC2046
    gpu "$run" "$MOH" train configs/fashion_mnist/moh_dit_pixel.yaml --run-dir "$RUNS/$run" $(train_args) \
      --set train.seed="$s" --set optim.lr="$LR" --set train.epochs=1000 --set train.max_steps="$hi" \
      --set train.ckpt_every_steps="$lo" --set train.keep_every_steps="$lo" || return 1
    touch "$RUNS/$run.done"
  fi
  measure "${run}_$((100 + PCT_HI))" "$(ckpt "$run" "$hi")" "$s" scratch "" "" $((100 + PCT_HI)) $((hi - n)) || return 1
  measure "${run}_$((100 + PCT_LO))" "$(ckpt "$run" "$lo")" "$s" scratch "" "" $((100 + PCT_LO)) $((lo - n))
}

# study SEED: the seed's whole pipeline; the continue-tuning runs and the from-scratch run go side by side
study() {
  local s=$1 n r c pids=()
  dense "$s" || { log "seed $s: dense failed"; return 1; }
  n=$(steps_of "dit_dense_s$s")
  measure "dit_dense_s$s" "$(ckpt "dit_dense_s$s" "$n")" "$s" dense "" "" 0 0 || return 1
  scratch "$s" "$n" &
  pids+=($!)
  for r in $ROUTERS; do for c in $CHOICES; do
    continue_tune "$s" "$r" "$c" "$n" &
    pids+=($!)
  done; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  log "seed $s: done"
}

pids=()
for s in $SEEDS; do study "$s" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || true; done
# The tables need scipy (studies/stats.py): the project venv's Python where there is one.
"$(command -v .venv/bin/python || command -v python3)" studies/ct_plateau/table.py "$OUT" >"$OUT/ct_plateau.md" &&
  cat "$OUT/ct_plateau.md"
log "finished"
