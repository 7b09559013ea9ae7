#!/usr/bin/env bash
# The fused block's GPU call (docs/GPU.md, "The fused block"): one device call under a deadline, in order of value —
#   build     moh and the test binaries against the machine's LibTorch (scripts/gpu_check.sh env + build stages)
#   parity    the CUDA parity tests of every fused piece, forward and backward, fp32 and bf16 (FusedOps.*,
#             FusedBlock.*, WorkingCopies.*, HeadMix.*) and the router / device tests they lean on (MoHRouting.*,
#             OnDevice.*)
#   ops       torch.ops.moh on the device: moh_torch installed from the build (into WORK, not the machine's Python),
#             its opcheck / parity tests with their CUDA cases (python/tests/test_ops.py), then the ops against the
#             official module's math, eager and compiled, bf16 (bench/moh_torch_ops.py, one round)
#   profile   DiT-XL/2 and MoH-DiT-XL/2-90, bf16, batch 32, EMA 0.9999: one step profiled by op class, fused off then on
#   moh       DiT-XL/2, MoH-DiT-XL/2-90 and -75 with the fused block, three interleaved rounds (MoH / DiT ratios)
#   sweep     DiT-XL/2 with the fused block at batch 64, 128, 256: the best batch and its MFU
#   official  ours (fused) and the official-structure PyTorch step at the best batch, interleaved, two rounds
#   vit       MoH-ViT-S-75 training step, bf16, batch 64: fused off, on, off, on
# Each part runs only while enough of the deadline is left; every row is one JSON line of OUT/fused.jsonl
# ({"part", "label", ...the bench line}), scripts/gpu_fused_summary.py turns them into OUT/summary.md (the targets of
# the fused block, met or not). At most eight files come back: fused.jsonl, summary.md, driver.log, logs.tar.gz,
# copied every 20 s and after each part.
#   usage: scripts/gpu_fused_loan.sh OUT [SECONDS]            (SECONDS: deadline of the whole call, default 540)
#   env: DEVICE (cuda; cpu rehearses the whole call on a CPU machine with small models), BUILD (build-gpu; a
#        rehearsal takes an existing build such as build-torch2 and skips the build part), KIT (.gpu_kit),
#        PY (python3: the Python with torch), PARTS (all of the above, in that order)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 1 ] || { echo "usage: $0 OUT [SECONDS]" >&2; exit 2; }
OUT=$(realpath -m "$1") LIMIT=${2:-540}
DEVICE=${DEVICE:-cuda} BUILD=$(realpath -m "${BUILD:-build-gpu}") KIT=${KIT:-.gpu_kit} PY=${PY:-python3}
# A path stays valid where a part changes directory (absolute, its symlinks kept: a venv's python is one).
[[ "$PY" == */* ]] && PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
PARTS=${PARTS:-build parity ops profile moh sweep official vit}
case "$DEVICE" in cuda | cpu) ;; *) echo "error: DEVICE=$DEVICE: use cuda or cpu" >&2; exit 2 ;; esac
WORK=$OUT/work
mkdir -p "$OUT" "$WORK"
ROWS=$OUT/fused.jsonl
: >"$ROWS"
T0=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - T0))); }
log() { echo "[+$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/driver.log" >&2; }
collect() {
  "$PY" scripts/gpu_fused_summary.py "$ROWS" >"$OUT/summary.md" 2>>"$OUT/driver.log" || true
  (cd "$WORK" && tar -czf "$OUT/logs.tar.gz" .) 2>/dev/null || true
}

# The models and sizes of a GPU call, or small stand-ins when rehearsing on a CPU (same commands, same parts).
if [ "$DEVICE" = cuda ]; then
  DIT=DiT-XL/2 MOH90=MoH-DiT-XL/2-90 MOH75=MoH-DiT-XL/2-75 VIT=MoH-ViT-S-75
  BATCH=32 SWEEP=64,128,256 VIT_BATCH=64 SIZE=() STEPS=(--steps 10 --warmup 3) PEAK=(--peak-tflops 989)
else
  DIT=DiT-S/2 MOH90=MoH-DiT-S/2-90 MOH75=MoH-DiT-S/2-75 VIT=MoH-ViT-Nano-75
  BATCH=2 SWEEP=2,4 VIT_BATCH=4 SIZE=(--img-size 8) STEPS=(--steps 1 --warmup 0) PEAK=()
fi

# bench PART LABEL ARGS...: one `moh bench train` line (bf16, EMA 0.9999 as DiT's train.py) into fused.jsonl.
bench() {
  local part=$1 label=$2 log
  shift 2
  log=$WORK/${part}_${label//\//_}.log
  timeout "$(left)" "$BUILD/moh" bench train --device "$DEVICE" --precision bf16 --ema 0.9999 "${PEAK[@]}" --json "$@" \
    >"$log" 2>&1
  grep '^{' "$log" | while read -r line; do
    "$PY" -c 'import json, sys; r = json.loads(sys.argv[3]); r.update(part=sys.argv[1], label=sys.argv[2]); print(json.dumps(r))' \
      "$part" "$label" "$line" >>"$ROWS"
  done
}
# official LABEL MODEL BATCH: the official-structure PyTorch step (bench/pytorch_moh_dit_step.py) into fused.jsonl.
official() {
  local log=$WORK/official_$1.log
  timeout "$(left)" "$PY" bench/pytorch_moh_dit_step.py --model "$2" --device "$DEVICE" --precision bf16 \
    --batch "$3" --ema 0.9999 "${STEPS[@]}" >"$log" 2>&1
  grep '^{' "$log" | tail -n1 | while read -r line; do
    "$PY" -c 'import json, sys; r = json.loads(sys.argv[3]); r.update(part="official", label=sys.argv[1], model=sys.argv[2], batch=int(sys.argv[4]), what="official_step"); print(json.dumps(r))' \
      "$1" "$2" "$line" "$3" >>"$ROWS"
  done
}

part_build() {
  if [ "$DEVICE" = cpu ]; then [ -x "$BUILD/moh" ] || { log "rehearsal: no build in $BUILD"; return 1; }; return 0; fi
  MOH_GPU_STAGES="env build" MOH_GPU_TARGETS="moh moh_tests_models" \
    bash scripts/gpu_check.sh "$KIT" "$WORK/build_report" >"$WORK/build.log" 2>&1
}
part_parity() {
  MOH_TEST_DEVICE=$DEVICE OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} timeout "$(left)" "$BUILD/tests/moh_tests_models" \
    --gtest_filter='FusedOps.*:FusedBlock.*:WorkingCopies.*:HeadMix.*:MoHRouting.*:OnDevice.*' \
    --gtest_output="json:$WORK/parity.json" >"$WORK/parity.log" 2>&1
  "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
failed = [t["classname"] + "." + t["name"] for s in r["testsuites"] for t in s["testsuite"] if t.get("failures")]
print(json.dumps({"part": "parity", "label": "tests", "what": "parity", "tests": r["tests"], "failures": r["failures"],
                  "failed": failed, "device": sys.argv[2]}))' "$WORK/parity.json" "$DEVICE" >>"$ROWS"
}
part_ops() {
  local pkg=$WORK/moh_torch_pkg
  MOH_BUILD_DIR=$BUILD timeout "$(left)" "$PY" -m pip install --quiet --no-build-isolation --no-deps --no-index \
    --disable-pip-version-check --target "$pkg" ./python >"$WORK/ops_install.log" 2>&1 || return 1
  (cd python/tests && PYTHONPATH=$pkg timeout "$(left)" "$PY" -m unittest -v test_ops) >"$WORK/ops_tests.log" 2>&1
  local rc=$?
  "$PY" -c '
import json, re, sys
text = open(sys.argv[1]).read()
ran = re.search(r"Ran (\d+) test", text)
print(json.dumps({"part": "ops", "label": "tests", "what": "ops_tests", "device": sys.argv[2], "exit": int(sys.argv[3]),
                  "ran": int(ran.group(1)) if ran else 0, "failed": re.findall(r"^(?:FAIL|ERROR): (.*)$", text, re.M)}))' \
    "$WORK/ops_tests.log" "$DEVICE" "$rc" >>"$ROWS"
  local dtype=bf16
  [ "$DEVICE" = cpu ] && dtype=fp32
  PYTHONPATH=$pkg timeout "$(left)" "$PY" bench/moh_torch_ops.py --device "$DEVICE" --dtype "$dtype" --rounds 1 \
    --iters 5 --out "$WORK/ops_bench.jsonl" >"$WORK/ops_bench.log" 2>&1
  [ -f "$WORK/ops_bench.jsonl" ] && "$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    r.update(part="ops", label=r["case"] + " | " + r["candidate"], what="ops_bench")
    print(json.dumps(r))' "$WORK/ops_bench.jsonl" >>"$ROWS"
  return $rc
}
part_profile() {
  local m f
  for m in "$DIT" "$MOH90"; do
    for f in off on; do bench profile "${m}_$f" --model "$m" --batch "$BATCH" --fused "$f" "${SIZE[@]}" "${STEPS[@]}" \
      --profile 12; done
  done
}
part_moh() {
  local round m
  for round in 1 2 3; do
    for m in "$DIT" "$MOH90" "$MOH75"; do
      bench moh "${m}_r$round" --model "$m" --batch "$BATCH" --fused on "${SIZE[@]}" "${STEPS[@]}"
    done
  done
}
part_sweep() { bench sweep "$DIT" --model "$DIT" --batch "$SWEEP" --fused on "${SIZE[@]}" --steps 5 --warmup 2; }
part_official() {
  local best round
  best=$("$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = [r for r in rows if r.get("what") == "train_batch_sweep" and "best_batch" in r]
print(s[-1]["best_batch"] if s else sys.argv[2])' "$ROWS" "${SWEEP%%,*}")
  [ "$DEVICE" = cpu ] && best=2  # the official step's latents are 32x32 whatever the rehearsal's size
  for round in 1 2; do
    bench official "ours_b${best}_r$round" --model "$DIT" --batch "$best" --fused on \
      $([ "$DEVICE" = cuda ] || echo --img-size 32) "${STEPS[@]}"
    official "pytorch_b${best}_r$round" "$DIT" "$best"
  done
}
part_vit() {
  local f round
  for round in 1 2; do
    for f in off on; do bench vit "${VIT}_${f}_r$round" --model "$VIT" --batch "$VIT_BATCH" --fused "$f" "${STEPS[@]}"; done
  done
}

# part NAME NEEDS: runs part_NAME if NEEDS seconds of the deadline are left.
part() {
  case " $PARTS " in *" $1 "*) ;; *) return 0 ;; esac
  if [ "$(left)" -lt "$2" ]; then log "$1 skipped: $(left) s left, needs $2"; return 0; fi
  log "$1"
  "part_$1"
  local rc=$?
  log "$1 exit $rc"
  collect
  return $rc
}
(while sleep 20; do collect; done) &
COPIER=$!
trap 'kill $COPIER 2>/dev/null' EXIT
log "device $DEVICE, build $BUILD, deadline $LIMIT s; parts: $PARTS"
part build 200 || { log "no build: stopping"; collect; exit 1; }
part parity 60
part ops 90
part profile 60
part moh 60
part sweep 45
part official 45
part vit 30
log "finished"
collect
