#!/usr/bin/env bash
# The compute-heavy measurements of the studies (docs/RESULTS.md) as one command on one GPU:
#   ct      the DiT half of the continue-tuning study (studies/continue_tuning/run.sh PARTS=dit) for SEEDS;
#   curve   FID versus compute (studies/fid_curve/run.sh) of the demo recipe's MoH-DiT-Pixel/4-75 and of a dense
#           DiT-Pixel/4 trained with the same budget (DEMO_STEPS), over the default settings, more settings at
#           ≤ 25 network evaluations per image, and head budgets K at inference for the MoH model;
#   retime  the sampling seconds of every curve setting again, one setting at a time on an otherwise idle GPU (the
#           curve runs beside the training jobs, so its own seconds measure a shared GPU);
#   plateau continue-tuning from dense DiTs trained to their plateau (issue 57: studies/ct_plateau/run.sh, 4
#           seeds) into STATE/plateau; with END_AT (epoch seconds) its dense phase gets 35 % of the time left and no
#           job starts in the last 45 s, so a second call on the warm machine finishes what is left.
#   recipes issue 55's recipe comparison at the GPU's size (studies/recipes/run.sh) into STATE/recipes: both
#           models under REC_RECIPES ("flow flow_repa ddpm", in that order, every seed of one before the next) for
#           REC_SEEDS ("1 2 3 4"), REC_EPOCHS (8) epochs of batch REC_BATCH (256) at lr REC_LR (1e-3) — 1,872 steps
#           of 4× the CPU rows' batch (2 seeds, 1,874 steps of 64) — FID on REC_SAMPLES (5000) after every
#           REC_MEASURE_EVERY-th (2) epoch and the last, with the CPU rows' feature network (FEATURE_RUN) and REPA
#           encoder (REPA_ENCODER, default .gpu_payload/repa_encoder); one job per run, JOBS (8) at a time, none
#           started in the last 45 s before END_AT; a cut run resumes from its last epoch when started again.
# Models this small leave a GPU waiting on kernel launches, so independent jobs run side by side: first the dense
# models of the study and the two demo models, then the conversions and continue-tuning runs (one job per seed and
# router), the from-scratch runs and the two curves. Started again, finished runs and measurements are skipped.
#
# usage: studies/run_on_gpu.sh FEATURE_RUN [STATE_DIR]
#   FEATURE_RUN  the FID feature network of every measurement: a classifier run (the study's dense ViT-Nano)
#   STATE_DIR    runs, logs and results (default runs/gpu_results): ct/ (rows.jsonl, continue_tuning.md),
#                curve/ (curve.jsonl, curve.md, timing.jsonl, plots/), driver.log
# env: MOH (default: scripts/gpu_check.sh's env + build stages make build-gpu/moh from KIT, default .gpu_kit),
#      PARTS ("ct curve retime"; plateau and recipes on request)
#      SEEDS ("1 2") SAMPLES (2000) DEMO_STEPS (2400) DIT_EPOCHS (4) LIMIT (0: every
#      training image) PRECISION (fp32) SAMPLE_BATCH (1000) COPY_TO (a folder the results are copied into every 20 s
#      and at the end) OMP_NUM_THREADS (2 per job)
# Started again on the same machine, leave MOH unset: the build stage unpacks the kit again (carrying .gpu_kit anew
# replaces its unpacked libraries, which build-gpu/moh loads) and recompiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 FEATURE_RUN [STATE_DIR]" >&2; exit 2; }
[ -d "$1/checkpoints" ] || { echo "error: $1: not a classifier run (no checkpoints/)" >&2; exit 2; }
FEATURE=$(realpath "$1") STATE=$(realpath -m "${2:-runs/gpu_results}")
PARTS=${PARTS:-"ct curve retime"} SEEDS=${SEEDS:-"1 2"} SAMPLES=${SAMPLES:-2000} DEMO_STEPS=${DEMO_STEPS:-2400}
export DIT_EPOCHS=${DIT_EPOCHS:-4} LIMIT=${LIMIT:-0} PRECISION=${PRECISION:-fp32} SAMPLES
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} RUNS=$STATE/runs FEATURE_RUN=$FEATURE
export SAMPLE_ARGS="--set sampling.batch_size=${SAMPLE_BATCH:-1000}"
COPY_TO=${COPY_TO:-}
T0=$(date +%s)
mkdir -p "$RUNS" "$STATE/jobs" "$STATE/curve"
log() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0)) s] $*" | tee -a "$STATE/driver.log"; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# collect: the results (not the runs) into COPY_TO, few files: logs and per-run reports go in one archive.
collect() {
  [ -n "$COPY_TO" ] || return 0
  mkdir -p "$COPY_TO"
  local f
  # seven files: the device tool brings back at most eight; tables and plots are made again from these
  for f in driver.log ct/rows.jsonl curve/curve.jsonl curve/timing.jsonl gpu_report/results.jsonl plateau/rows.jsonl \
    plateau/checks.jsonl plateau/driver.log recipes/rows.jsonl; do
    [ -f "$STATE/$f" ] && cp "$STATE/$f" "$COPY_TO/$(echo "$f" | tr / _)"
  done
  (cd "$STATE" && find . \( -name '*.log' -o -name metrics.jsonl -o -name sampling.json -o -name report.json \
    -o -name conversion.json -o -name 'settings_*.txt' -o -name 'protocol_*.txt' \) -print0 |
    tar -czf "$COPY_TO/logs.tar.gz" --null -T -) || true
}
if [ -n "$COPY_TO" ]; then
  (while sleep 20; do collect 2>/dev/null; done) &
  COPIER=$!
  trap 'kill $COPIER 2>/dev/null; collect' EXIT
fi

if [ -z "${MOH:-}" ]; then
  log "build (scripts/gpu_check.sh env build)"
  MOH_GPU_STAGES="env build" MOH_GPU_TARGETS=moh bash scripts/gpu_check.sh "${KIT:-.gpu_kit}" "$STATE/gpu_report" ||
    { log "build failed"; exit 1; }
  MOH=$PWD/build-gpu/moh
fi
export MOH
log "$("$MOH" --version | head -n1); parts: $PARTS; seeds: $SEEDS; $SAMPLES samples; precision $PRECISION"

# job NAME CMD...: CMD in the background, its output in STATE/jobs/NAME.log; finish waits for every job.
PIDS=() NAMES=()
job() {
  local name=$1
  shift
  "$@" >"$STATE/jobs/$name.log" 2>&1 &
  PIDS+=($!) NAMES+=("$name")
}
finish() {
  local i rc=0
  for i in "${!PIDS[@]}"; do
    if wait "${PIDS[$i]}"; then log "${NAMES[$i]} done"; else
      rc=1
      log "${NAMES[$i]} FAILED: $(tail -n1 "$STATE/jobs/${NAMES[$i]}.log")"
    fi
  done
  PIDS=() NAMES=()
  collect
  return $rc
}
# throttle N: wait until fewer than N of the jobs started by job() are running
throttle() {
  local p n
  while :; do
    n=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
    [ "$n" -lt "$1" ] && return
    sleep 2
  done
}
# install_run SRC DST: a carried run (model weights, config, checkpoints/latest) as DST, once
install_run() {
  [ -f "$2.done" ] && return
  [ -d "$1/checkpoints" ] || { log "error: $1: not a run (no checkpoints/)"; exit 2; }
  rm -rf "$2" && cp -r "$1" "$2" && touch "$2.done"
}
recipes_part() {
  local out=$STATE/recipes runs=$STATE/recipes/runs s r m
  local deadline=$((${END_AT:-0} > 0 ? ${END_AT:-0} - 45 : 0))
  mkdir -p "$runs"
  install_run "$FEATURE" "$runs/features"
  install_run "$(realpath -m "${REPA_ENCODER:-.gpu_payload/repa_encoder}")" "$runs/repa_encoder"
  [ -f "$runs/fm_test_stats.npz" ] ||
    "$MOH" ref-stats --images fashion_mnist:test --features "classifier:$runs/features" \
      --out "$runs/fm_test_stats.npz" >/dev/null
  # recipe by recipe, the two models of a pair side by side: a cut leaves whole pairs of the first recipes
  for r in ${REC_RECIPES:-flow flow_repa ddpm}; do
    for s in ${REC_SEEDS:-1 2 3 4}; do
      for m in dit moh; do
        throttle "${JOBS:-8}"
        if [ "$deadline" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ]; then
          log "recipes: $m $r seed $s not started (deadline)"
          continue
        fi
        job "rec_${m}_${r}_s$s" env RUNS="$runs" MODELS="$m" RECIPES="$r" SEEDS="$s" EPOCHS="${REC_EPOCHS:-8}" \
          SAMPLES="${REC_SAMPLES:-5000}" MEASURE_EVERY="${REC_MEASURE_EVERY:-2}" JOB="gpu_${m}_${r}_s$s" \
          TRAIN_ARGS="--set data.batch_size=${REC_BATCH:-256} --set optim.lr=${REC_LR:-1e-3}" \
          bash studies/recipes/run.sh "$out"
      done
    done
  done
  finish || true
}
demo_train() {  # demo_train NAME CONFIG: the demo recipe's DiT training, DEMO_STEPS steps
  [ -f "$RUNS/$1.done" ] && return
  rm -rf "${RUNS:?}/$1"
  "$MOH" train "$2" --run-dir "$RUNS/$1" --set train.max_steps="$DEMO_STEPS" --set train.precision="$PRECISION" \
    --set data.limit_train="$LIMIT"
  touch "$RUNS/$1.done"
}

if has plateau; then
  left=$((${END_AT:-0} - $(date +%s)))
  [ "${END_AT:-0}" -gt 0 ] || left=0
  log "plateau study (issue 57), $left s left"
  LABEL=gpu JOBS=${JOBS:-8} SEEDS=${PLATEAU_SEEDS:-"1 2 3 4"} SAMPLES=${PLATEAU_SAMPLES:-5000} \
    DENSE_BUDGET=$((left * 35 / 100)) DEADLINE=$((left > 45 ? left - 45 : 0)) SAMPLE_BATCH=${SAMPLE_BATCH:-2500} \
    bash studies/ct_plateau/run.sh "$STATE/plateau" >"$STATE/plateau.log" 2>&1 || log "plateau study FAILED"
  collect
fi
if has recipes; then
  log "recipes at the GPU's size (issue 55)"
  recipes_part
  collect
fi
STATS=$RUNS/fm_test_stats_$(basename "$FEATURE").npz  # the name studies/continue_tuning/run.sh looks for
has ct || has curve || { log "finished"; exit 0; }
[ -f "$STATS" ] || "$MOH" ref-stats --images fashion_mnist:test --features "classifier:$FEATURE" --out "$STATS" >/dev/null
log "reference statistics: $STATS"

# ct_job NAME SEED ROUTERS SCRATCH: one slice of the continue-tuning study (finished parts are skipped)
ct_job() {
  job "$1" env SEEDS="$2" ROUTERS="$3" SCRATCH="$4" PARTS=dit bash studies/continue_tuning/run.sh "$STATE/ct"
}
log "phase 1: dense models of the study, the demo's two models"
if has ct; then for s in $SEEDS; do ct_job "ct_dense_s$s" "$s" "" 0; done; fi
if has curve; then
  job demo_moh demo_train demo_moh configs/fashion_mnist/moh_dit_pixel.yaml
  job demo_dense demo_train demo_dense configs/fashion_mnist/dit_pixel.yaml
fi
finish || true

log "phase 2: conversions and continue-tuning, from-scratch runs, the two curves"
if has ct; then
  for s in $SEEDS; do
    for r in learned query_norm; do ct_job "ct_${r}_s$s" "$s" "$r" 0; done
    ct_job "ct_scratch_s$s" "$s" "" 1
  done
fi
if has curve; then  # studies/fid_curve/run.sh's default settings for both; head budgets for the MoH model (trained K = 2 of 4)
  { for k in 0 1 3 4; do echo "dpm++2m_12_k$k | --sampler dpm++2m --steps 12 --cfg-scale 4 --topk $k"; done
    echo "dpm++2m_12_guidek1 | --sampler dpm++2m --steps 12 --cfg-scale 4 --guide-topk 1"
    for k in 1 3; do echo "dpm++2m_25_k$k | --sampler dpm++2m --steps 25 --cfg-scale 4 --topk $k"; done
  } >"$STATE/curve/settings_moh_k.txt"
  job curve_moh env LABEL=MoH-DiT-Pixel/4-75 CFG=4 EXTRA_SETTINGS="$STATE/curve/settings_moh_k.txt" \
    bash studies/fid_curve/run.sh "$RUNS/demo_moh" "$STATE/curve" "$STATS" "classifier:$FEATURE"
  job curve_dense env LABEL=DiT-Pixel/4 CFG=4 bash studies/fid_curve/run.sh "$RUNS/demo_dense" "$STATE/curve" "$STATS" \
    "classifier:$FEATURE"
fi
finish || true

# retime: each curve setting's sampling again, alone, into curve/timing.jsonl; then curve_timed.jsonl (seconds = alone,
# seconds_shared = beside the other jobs), curve.md with both, and the plots from it.
retime() {
  local rows=$STATE/curve/curve.jsonl times=$STATE/curve/timing.jsonl dir=$STATE/curve/retime id label flags run
  touch "$times"
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): r = json.loads(l); print(r["id"] + "\t" + r["label"] + "\t" + r["flags"])' "$rows" |
    while IFS=$'\t' read -r id label flags; do
      grep -qF "\"id\": \"$id\"" "$times" && continue
      case "$label" in MoH*) run=$RUNS/demo_moh ;; *) run=$RUNS/demo_dense ;; esac
      rm -rf "$dir"
      # shellcheck disable=SC2086  # the flags are words
      "$MOH" sample --checkpoint "$run" --num-fid-samples "$SAMPLES" --labels balanced $flags $SAMPLE_ARGS \
        --out "$dir" >"$STATE/curve/retime.log" 2>&1 || { log "retime $id failed"; continue; }
      echo "{\"id\": \"$id\", \"seconds_alone\": $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$dir/sampling.json")}" >>"$times"
    done
  rm -rf "$dir"
  python3 - "$rows" "$times" "$STATE/curve/curve_timed.jsonl" "$STATE/curve/curve.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
alone = {r["id"]: r["seconds_alone"] for r in (json.loads(l) for l in open(sys.argv[2]) if l.strip())}
with open(sys.argv[3], "w") as out:
    for r in rows:
        r["seconds_shared"], r["seconds"] = r["seconds"], alone.get(r["id"])
        out.write(json.dumps(r) + "\n")
f = lambda v, d: "–" if v is None else f"{v:.{d}f}"
with open(sys.argv[4], "w") as md:
    md.write("| model | setting | NFE / image | seconds alone | seconds beside the other jobs | FID | sFID | IS "
             "| precision | recall | sample acc. |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        md.write(f"| {r['label']} | {r['setting']} | {r['nfe']} | {f(r['seconds'], 1)} | {f(r['seconds_shared'], 1)} "
                 f"| {f(r['fid'], 2)} | {f(r['sfid'], 2)} | {f(r['inception_score'], 2)} | {f(r['precision'], 3)} "
                 f"| {f(r['recall'], 3)} | {f(r['sample_accuracy'], 2)} |\n")
PY
  "$MOH" plot --fid-curve "$STATE/curve/curve_timed.jsonl" --out "$STATE/curve/plots" >/dev/null
}
if has retime && [ -s "$STATE/curve/curve.jsonl" ]; then
  log "phase 3: sampling seconds of each curve setting alone"
  retime
fi
log "finished"
