#!/usr/bin/env bash
# The training-step measurements of docs/GPU.md ("the training step") as one device call under a deadline: parts in
# order of value, each a scripts/gpu_check.sh run with its own report, skipped when too little time is left, and at
# most eight files copied to OUT every 20 s and after every part (the device tool brings back eight).
#   usage: scripts/gpu_step_loan.sh OUT [SECONDS]     (SECONDS: the deadline of all parts, default 540)
#   parts (run in the order PARTS names them; each builds what it needs, an incremental build after the first):
#          step     build moh; profiles of DiT-XL/2 and MoH-DiT-XL/2-90 with the per-tensor and the fused optimizer,
#                   the official-structure PyTorch step beside them (MOH_GPU_BENCH=step)
#          router   build moh; MoH-DiT-XL/2-90 with the plain and the compact router and DiT-XL/2, interleaved in
#                   three rounds, the last compact step profiled (MOH_GPU_BENCH=router)
#          tests    build the test binaries; the CUDA parity tests of the optimizer, profiler, CUDA-graph sampling,
#                   activation checkpointing and the trainers' exact resume (MOH_GPU_CTEST_INCLUDE)
#          parity   build moh; ours and the official-structure PyTorch step side by side: DiT-XL/2 and MoH-DiT-XL/2-90
#                   at batch 32, DiT-XL/2 at 128 (MOH_GPU_BENCH=official)
#          sweep    the best DiT-XL/2 batch without and with activation checkpointing, then ours and the official
#                   step at 64 and 128 (MOH_GPU_BENCH="sweep official")
#          graphs   sampling with and without CUDA graphs (MOH_GPU_BENCH=graphs)
#          precision DiT-XL/2's training step and a sampling chain in fp32, tf32 and bf16 (MOH_GPU_BENCH=precision)
#   env: KIT (.gpu_kit), PARTS ("step sweep graphs tests"; parity is the step part's official comparison alone);
#        MOH_GPU_GRAPH_MODES / MOH_GPU_GRAPH_CHAINS pass through to the graphs part
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 1 ] || { echo "usage: $0 OUT [SECONDS]" >&2; exit 2; }
OUT=$(realpath -m "$1") LIMIT=${2:-540} KIT=${KIT:-.gpu_kit} WORK=$PWD/gpu_step_work
PARTS=${PARTS:-step sweep graphs tests}
mkdir -p "$OUT" "$WORK"
T0=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - T0))); }
log() { echo "[+$(($(date +%s) - T0)) s] $*" >>"$WORK/driver.log"; }
collect() {  # one results file per part, the driver's log, every log and report in one archive
  local r
  for r in "$WORK"/*/results.jsonl; do [ -f "$r" ] && cp "$r" "$OUT/$(basename "$(dirname "$r")").jsonl"; done
  cp "$WORK/driver.log" "$OUT/"
  (cd "$WORK" && tar -czf "$OUT/logs.tar.gz" --exclude=cli_runs .) 2>/dev/null || true
}
# part NAME NEEDS VAR=VALUE...: gpu_check.sh with report WORK/NAME and the given environment, if NEEDS seconds are left
part() {
  local name=$1 need=$2 rc
  shift 2
  case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
  if [ "$(left)" -lt "$need" ]; then log "$name skipped: $(left) s left, needs $need"; return 0; fi
  log "$name"
  env "$@" timeout "$(left)" bash scripts/gpu_check.sh "$KIT" "$WORK/$name" >"$WORK/$name.out" 2>&1
  rc=$?
  log "$name exit $rc"
  collect
}
# Copied every 20 s too: a call cut off by the device's limit (which also counts the machine's start, 30-160 s)
# brings back only what is in OUT by then.
(while sleep 20; do collect 2>/dev/null; done) &
COPIER=$!
trap 'kill $COPIER 2>/dev/null' EXIT
log "deadline $LIMIT s; parts: $PARTS"
# Parts run in the order PARTS names them.
run_part() {
  case "$1" in
    step) part step 120 MOH_GPU_STAGES="env build bench" MOH_GPU_TARGETS=moh MOH_GPU_BENCH=step ;;
    router) part router 120 MOH_GPU_STAGES="env build bench" MOH_GPU_TARGETS=moh MOH_GPU_BENCH=router ;;
    parity) part parity 120 MOH_GPU_STAGES="env build bench" MOH_GPU_TARGETS=moh MOH_GPU_BENCH=official \
      MOH_GPU_OFFICIAL_RUNS="DiT-XL/2:32 MoH-DiT-XL/2-90:32 DiT-XL/2:128" ;;
    sweep) part sweep 90 MOH_GPU_STAGES="env build bench" MOH_GPU_TARGETS=moh MOH_GPU_BENCH="sweep official" ;;
    graphs) part graphs 60 MOH_GPU_STAGES="env build bench" MOH_GPU_TARGETS=moh MOH_GPU_BENCH=graphs ;;
    precision) part precision 60 MOH_GPU_STAGES="env build bench" MOH_GPU_TARGETS=moh MOH_GPU_BENCH=precision ;;
    tests) part tests 90 MOH_GPU_STAGES="build tests" MOH_GPU_TARGETS="moh moh_tests_core moh_tests_models" \
      MOH_GPU_CTEST_EXCLUDE='^(format)$' \
      MOH_GPU_CTEST_INCLUDE='^(MoHRouting|MoHAttention|Optimizer|OpProfile|OnDevice|GradCheckpoint|TrainLoop|Guard|ClassificationTrainer|DiffusionTrainer)\.' ;;
    *) log "unknown part $1" ;;
  esac
}
for p in $PARTS; do run_part "$p"; done
log "finished"
collect
