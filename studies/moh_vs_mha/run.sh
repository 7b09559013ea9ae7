#!/usr/bin/env bash
# MoH against MHA at the CPU's size, with paired seeds (docs/results/moh_vs_mha/README.md: the questions, margins and
# verdicts). Every cell is one training run of one variant with one seed, `train.paired: true` (the same seed gives
# every variant the same data order, training noise and initial weights wherever the variants share a parameter):
#   cls   the MoH-ViT-Nano family on Fashion-MNIST (ViT-Nano = MHA, MoH-ViT-Nano-90 / -75 / -50, MoA-ViT-Nano), the
#         demo's classifier recipe (150 steps of 128, fp32), top-1 on the whole test set (10,000 images);
#   dit   the demo's flow recipe (configs/fashion_mnist/moh_sit_pixel_demo.yaml: 750 steps, fp32) for DiT-Pixel/2 and
#         MoH-DiT-Pixel/2-90 / -75, then SAMPLES samples (Heun 6 steps, CFG 4 in [0, 0.5], classes balanced) and
#         their FID and class accuracy with one fixed feature network: the demo's classifier trained once (seed 0),
#         its SHA-256 in every row, against the Fashion-MNIST test set; for the first SETS2 seeds a second sample set
#         (another sampling seed) of the same run, to separate the spread over sample sets from the spread over seeds.
# One JSON line per measurement in OUT/rows.jsonl with its provenance (commit, LibTorch, CPU, seed, variant, steps,
# wall seconds, feature network hash, N); a cell whose row exists is skipped, a killed run resumes from its latest
# checkpoint (moh train --resume auto), so the script can be started again after a kill or a restart of the machine.
# Afterwards studies/moh_vs_mha/table.py OUT rebuilds the tables and verdicts from the rows.
#
# usage: nohup studies/moh_vs_mha/run.sh [OUT] &      (OUT defaults to docs/results/moh_vs_mha)
#   speed the classifier variants' training steps/s, interleaved rounds on an otherwise idle machine (PARTS=speed).
# env:   PARTS ("cls dit") CLS_SEEDS (1..10) DIT_SEEDS (1..12) SETS2 (4) SAMPLES (1000) MOH (build/moh)
#        RUNS (runs/moh_vs_mha) CLS_VARIANTS DIT_VARIANTS (the lists above) NICE (10: below interactive work)
#        CLS_STEPS (150) DIT_STEPS (750): the protocol's; fewer only for a smoke run into another OUT
#        ROUNDS (3) SPEED_STEPS (60): the speed part's; SAMPLE_PROCS (2): sampling processes of 1 thread each
#        (moh launch; this small model's forward gains nothing from a second intra-op thread, and the samples equal
#        one process's up to float rounding: 12 of 235,200 pixel values differed by 1 level for 100 samples)
set -euo pipefail
cd "$(dirname "$0")/../.."
MOH=${MOH:-build/moh}
OUT=${1:-docs/results/moh_vs_mha}
RUNS=${RUNS:-runs/moh_vs_mha}
PARTS=${PARTS:-"cls dit"}
CLS_SEEDS=${CLS_SEEDS:-"1 2 3 4 5 6 7 8 9 10"}
DIT_SEEDS=${DIT_SEEDS:-"1 2 3 4 5 6 7 8 9 10 11 12"}
SETS2=${SETS2:-4} SAMPLES=${SAMPLES:-1000} NICE=${NICE:-10} SAMPLE_PROCS=${SAMPLE_PROCS:-2}
CLS_VARIANTS=${CLS_VARIANTS:-"ViT-Nano MoH-ViT-Nano-90 MoH-ViT-Nano-75 MoH-ViT-Nano-50 MoA-ViT-Nano"}
DIT_VARIANTS=${DIT_VARIANTS:-"DiT-Pixel/2 MoH-DiT-Pixel/2-90 MoH-DiT-Pixel/2-75"}
CLS_STEPS=${CLS_STEPS:-150} DIT_STEPS=${DIT_STEPS:-750} ROUNDS=${ROUNDS:-3} SPEED_STEPS=${SPEED_STEPS:-60}
[ -x "$MOH" ] || { echo "error: $MOH not found (run scripts/setup.sh first)" >&2; exit 2; }
[[ "$SAMPLES" =~ ^[1-9][0-9]*$ && $((SAMPLES % 10)) = 0 ]] ||
  { echo "error: SAMPLES=$SAMPLES: a positive multiple of 10 (classes balanced)" >&2; exit 2; }
[[ "$SAMPLE_PROCS" =~ ^[1-9]$ ]] || { echo "error: SAMPLE_PROCS=$SAMPLE_PROCS: 1 to 9 processes" >&2; exit 2; }
[[ "$SETS2" =~ ^[0-9]+$ ]] || { echo "error: SETS2=$SETS2: a count of seeds" >&2; exit 2; }
for p in $PARTS; do case $p in cls | dit | speed) ;; *) echo "error: PARTS: unknown part $p (cls, dit, speed)" >&2; exit 2 ;; esac; done
[[ "$SPEED_STEPS" =~ ^[1-9][0-9]*$ && $SPEED_STEPS -ge 6 ]] ||
  { echo "error: SPEED_STEPS=$SPEED_STEPS: 6 or more" >&2; exit 2; }
mkdir -p "$OUT" "$RUNS"
ROWS=$OUT/rows.jsonl
touch "$ROWS"
run() { nice -n "$NICE" "$MOH" "$@"; }
have() { grep -qF "\"id\": \"$1\"" "$ROWS"; }
COMMIT=$("$MOH" --version | sed -n '1s/.*(commit \(.*\))$/\1/p')
LIBTORCH=$("$MOH" --version | sed -n 2p)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
CPU="$CPU (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"

# row ID KIND JSON-FIELDS...: appends one measurement with its provenance.
row() {
  local id=$1 kind=$2
  shift 2
  python3 - "$id" "$kind" "$COMMIT" "$LIBTORCH" "$CPU" "$@" >>"$ROWS" <<'EOF'
import json, sys, time
fields = dict(id=sys.argv[1], kind=sys.argv[2], commit=sys.argv[3], libtorch=sys.argv[4], cpu=sys.argv[5],
              date=time.strftime("%Y-%m-%d"))
for kv in sys.argv[6:]:
    k, v = kv.split("=", 1)
    fields[k] = json.loads(v)
print(json.dumps(fields))
EOF
}
jget() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@"; }

# train_cell DIR CONFIG ARGS...: one run to its end (resumed if a checkpoint is there); prints the wall seconds, or
# -1 for a resumed run (its time is not the whole run's).
train_cell() {
  local dir=$1 t0 resumed=0
  shift
  [ -d "$dir/checkpoints" ] && resumed=1
  t0=$(date +%s)
  run train "$@" --run-dir "$dir" --resume auto >>"$dir.log" 2>&1 || { echo "error: training $dir failed (log: $dir.log)" >&2; return 1; }
  if [ $resumed = 1 ]; then echo -1; else echo $(($(date +%s) - t0)); fi
}
rate() { python3 -c "import sys; n, s = float(sys.argv[1]), float(sys.argv[2]); print(n / s if s > 0 else 'null')" "$@"; }

cls_part() {
  local v s id dir secs top1
  for s in $CLS_SEEDS; do
    for v in $CLS_VARIANTS; do
      id="cls/$v/s$s"
      have "$id" && continue
      dir=$RUNS/cls_${v}_s$s
      mkdir -p "$(dirname "$dir")"
      echo "== $id"
      secs=$(train_cell "$dir" configs/fashion_mnist/moh_vit_nano.yaml --set model.name="$v" --set train.seed="$s" \
        --set train.paired=true --set train.epochs=1 --set data.limit_train=$((CLS_STEPS * 128)) \
        --set schedule.warmup_epochs=0.1 --set data.limit_val=1000 --set train.precision=fp32 \
        --set train.log_every_steps=50)
      run eval configs/fashion_mnist/moh_vit_nano.yaml --checkpoint "$dir" --set data.limit_val=0 --json \
        >"$dir.eval.json" 2>"$dir.eval.log"
      top1=$(jget "$dir.eval.json" 'd["top1"]')
      row "$id" cls "variant=\"$v\"" "seed=$s" "steps=$CLS_STEPS" "train_seconds=$secs" \
        "train_steps_per_s=$(rate $CLS_STEPS "$secs")" "top1=$top1" "n_test=$(jget "$dir.eval.json" 'd["count"]')"
    done
  done
}

# The feature network of every FID: the demo's classifier recipe, seed 0, trained once; the reference statistics.
features() {
  FEAT=$RUNS/features
  if [ ! -f "$FEAT.done" ]; then
    train_cell "$FEAT" configs/fashion_mnist/moh_vit_nano.yaml --set train.seed=0 --set train.epochs=1 \
      --set data.limit_train=$((CLS_STEPS * 128)) --set schedule.warmup_epochs=0.1 --set data.limit_val=1000 \
      --set train.precision=fp32 >/dev/null
    run ref-stats --images fashion_mnist:test --features "classifier:$FEAT" --out "$RUNS/fm_test_stats.npz" \
      >"$RUNS/ref_stats.log" 2>&1
    touch "$FEAT.done"
  fi
  FEAT_SHA=$(sha256sum "$FEAT/checkpoints/$(cat "$FEAT/checkpoints/latest")/model.safetensors" | cut -c1-16)
}

# sample_set ID DIR SEED: SAMPLES samples of the run in DIR with sampling seed SEED, their FID and class accuracy.
sample_set() {
  local id=$1 dir=$2 sseed=$3 t0 secs
  have "$id" && return 0
  rm -rf "$dir.samples_$sseed"
  t0=$(date +%s)
  run launch --nproc "$SAMPLE_PROCS" -- sample --checkpoint "$dir" --sampler heun --steps 6 --cfg-scale 4 \
    --cfg-interval 0,0.5 --seed "$sseed" --set sampling.per_class=$((SAMPLES / 10)) --out "$dir.samples_$sseed" \
    >"$dir.sample_$sseed.log" 2>&1
  secs=$(($(date +%s) - t0))
  run fid --samples "$dir.samples_$sseed/samples.npz" --ref "$RUNS/fm_test_stats.npz" --features "classifier:$FEAT" \
    --metrics fid --json >"$dir.fid_$sseed.json" 2>"$dir.fid_$sseed.log"
  row "$id" dit "variant=\"$4\"" "seed=$5" "sample_seed=$sseed" "steps=$DIT_STEPS" "train_seconds=$6" \
    "train_steps_per_s=$(rate $DIT_STEPS "$6")" "sample_seconds=$secs" \
    "sample_images_per_s=$(rate "$SAMPLES" "$secs")" "sample_processes=$SAMPLE_PROCS" "n=$SAMPLES" \
    "fid=$(jget "$dir.fid_$sseed.json" 'd["metrics"]["fid"]')" \
    "class_accuracy=$(jget "$dir.fid_$sseed.json" 'd["sample_accuracy"]["top1"]')" "feature_sha256=\"$FEAT_SHA\""
  rm -rf "$dir.samples_$sseed"  # the row holds what was measured; 1,000 samples are 2.4 MB
}

dit_part() {
  local v s n=0 id dir secs
  features
  for s in $DIT_SEEDS; do
    n=$((n + 1))
    for v in $DIT_VARIANTS; do
      id="dit/$v/s$s"
      dir=$RUNS/dit_${v//\//_}_s$s
      if have "$id/set1" && { [ $n -gt "$SETS2" ] || have "$id/set2"; }; then continue; fi
      echo "== $id"
      if [ -f "$dir.train_seconds" ]; then secs=$(cat "$dir.train_seconds"); else
        secs=$(train_cell "$dir" configs/fashion_mnist/moh_sit_pixel_demo.yaml --set model.name="$v" \
          --set train.seed="$s" --set train.paired=true --set train.precision=fp32 \
          --set data.limit_train=$((DIT_STEPS * 64)) --set train.log_every_steps=250)
        echo "$secs" >"$dir.train_seconds"
      fi
      sample_set "$id/set1" "$dir" $((1000 + s)) "$v" "$s" "$secs"
      if [ $n -le "$SETS2" ]; then sample_set "$id/set2" "$dir" $((2000 + s)) "$v" "$s" "$secs"; fi
    done
  done
}

# The classifier's speed on an otherwise idle machine (its accuracy rows were timed beside other work): ROUNDS rounds,
# each training every variant for SPEED_STEPS steps in turn (the order rotated by one each round, so that a drift of
# the machine's speed falls on every variant alike); steps/s from the logged throughput after the first log point, so
# the process start and the first steps' warm-up are not counted. Rows "speed/cls/VARIANT/rR".
speed_part() {
  local r v i n id dir order
  read -ra order <<<"$CLS_VARIANTS"
  n=${#order[@]}
  for ((r = 1; r <= ROUNDS; r++)); do
    for ((i = 0; i < n; i++)); do
      v=${order[$(((i + r - 1) % n))]}
      id="speed/cls/$v/r$r"
      have "$id" && continue
      dir=$RUNS/speed_${v}_r$r
      rm -rf "$dir" && echo "== $id"
      run train configs/fashion_mnist/moh_vit_nano.yaml --set model.name="$v" --set train.seed="$r" \
        --set train.paired=true --set train.epochs=1 --set data.limit_train=$((SPEED_STEPS * 128)) \
        --set schedule.warmup_epochs=0.1 --set data.limit_val=100 --set train.precision=fp32 \
        --set train.log_every_steps=$((SPEED_STEPS / 3)) --run-dir "$dir" >"$dir.log" 2>&1 ||
        { echo "error: training $dir failed (log: $dir.log)" >&2; return 1; }
      row "$id" cls_speed "variant=\"$v\"" "seed=$r" "steps=$SPEED_STEPS" \
        "train_steps_per_s=$(python3 -c 'import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if "img_per_s" in l]
print(sum(x["img_per_s"] for x in m[1:]) / len(m[1:]) / 128)' "$dir/metrics.jsonl")"
      rm -rf "$dir"
    done
  done
}

echo "protocol: $CPU, $LIBTORCH, commit $COMMIT; parts $PARTS; classifier seeds $CLS_SEEDS; DiT seeds $DIT_SEEDS" \
  "($SETS2 with a second sample set); $SAMPLES samples per set" | tee -a "$OUT/protocol.txt"
for p in $PARTS; do "${p}_part"; done
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" studies/moh_vs_mha/table.py "$OUT"
echo "done: $(wc -l <"$ROWS") rows in $ROWS"
