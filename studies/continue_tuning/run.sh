#!/usr/bin/env bash
# Dense → MoH continue-tuning on Fashion-MNIST (the embedded dataset), on this machine (docs/CONTINUE.md):
#   classifier: a dense ViT-Nano trained by configs/fashion_mnist/mha_vit_nano.yaml is converted into MoH-ViT-Nano-75
#   (router learned | query_norm × shared heads first | importance | learned) and evaluated right after conversion,
#   after continue-tuning for 10 % and 25 % of the dense run's steps, beside the dense model and MoH-ViT-Nano-75 trained
#   from scratch for the dense steps + 25 %; and each conversion's head load before and after (head_load_sSEED/);
#   diffusion (PARTS includes dit): a dense DiT-Pixel/4 (configs/fashion_mnist/dit_pixel.yaml) into MoH-DiT-Pixel/4-75
#   with the same columns: FID with the seed's dense classifier as the feature network (SAMPLES samples, DDIM 50, CFG
#   4), sample accuracy and the final training loss.
# Every number in the tables comes from files this script writes under OUT (one JSON line per measurement in
# rows.jsonl; continue_tuning.md is made from them). Finished steps are skipped when the script is started again.
#
# usage: studies/continue_tuning/run.sh [OUT]    (OUT defaults to docs/results/continue_tuning)
# env:   SEEDS ("1 2") PARTS ("cls dit") ROUTERS ("learned query_norm") CHOICES ("first importance learned")
#        (ROUTERS="" measures the dense model and, with SCRATCH=1, the from-scratch one only)
#        CLS_EPOCHS (3, the shipped recipe) DIT_EPOCHS (4) SAMPLES (2000) PRECISION (auto) MOH (build/moh)
#        RUNS (runs/continue_tuning) LIMIT (0: every training image; a smaller number for a smoke run)
#        FEATURE_RUN (the FID feature network, a classifier run; default: the seed's dense classifier RUNS/cls_dense_sN)
#        SCRATCH (1: train and measure the MoH-from-scratch model; 0 leaves it out, e.g. to run it in a parallel job)
#        DENSE_STEPS (the dense DiT's optimizer steps when it was trained elsewhere, e.g. on a GPU whose runs are gone:
#        only the from-scratch model is then trained and measured, for 125 % of them; needs ROUTERS="" and SCRATCH=1)
#        SAMPLE_ARGS (more moh sample flags for the FID samples, e.g. "--set sampling.batch_size=1000" on a GPU)
set -euo pipefail
cd "$(dirname "$0")/../.."
MOH=${MOH:-build/moh}
OUT=${1:-docs/results/continue_tuning}
RUNS=${RUNS:-runs/continue_tuning}
SEEDS=${SEEDS:-"1 2"} PARTS=${PARTS:-"cls dit"} ROUTERS=${ROUTERS-"learned query_norm"}
CHOICES=${CHOICES:-"first importance learned"} CLS_EPOCHS=${CLS_EPOCHS:-3} DIT_EPOCHS=${DIT_EPOCHS:-4}
SAMPLES=${SAMPLES:-2000} PRECISION=${PRECISION:-auto} LIMIT=${LIMIT:-0}
FEATURE_RUN=${FEATURE_RUN:-} SCRATCH=${SCRATCH:-1} SAMPLE_ARGS=${SAMPLE_ARGS:-} DENSE_STEPS=${DENSE_STEPS:-}
[ -x "$MOH" ] || { echo "error: $MOH not found (run scripts/setup.sh first)" >&2; exit 2; }
if [ -n "$DENSE_STEPS" ] && { [ -n "$ROUTERS" ] || [ "$SCRATCH" != 1 ] || ! [ "$DENSE_STEPS" -gt 0 ] 2>/dev/null; }; then
  echo "error: DENSE_STEPS=$DENSE_STEPS: measures the from-scratch DiT only (set ROUTERS=\"\" SCRATCH=1 and a step count > 0)" >&2
  exit 2
fi
mkdir -p "$OUT" "$RUNS"
# One protocol file per job: jobs run side by side (one per seed, or per part) write into the same OUT.
JOB=${JOB:-seeds_${SEEDS// /-}_parts_${PARTS// /-}_routers_${ROUTERS// /-}}
LIBTORCH=$("$MOH" --version | sed -n 2p)
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
else MACHINE=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); fi
echo "protocol: $MACHINE, $LIBTORCH; seeds $SEEDS; training images ${LIMIT/#0/all}; parts $PARTS; routers $ROUTERS; shared heads $CHOICES; classifier $CLS_EPOCHS epochs," \
  "DiT $DIT_EPOCHS epochs; FID on $SAMPLES samples with ${FEATURE_RUN:-the dense classifier of each seed} as the feature network;" \
  "precision $PRECISION${DENSE_STEPS:+; from-scratch DiT only, for 125 % of the $DENSE_STEPS steps of a dense DiT trained elsewhere}" |
  tee "$OUT/protocol_$JOB.txt"
ROWS=$OUT/rows.jsonl
touch "$ROWS"

jnum() { grep -o "\"$1\": *[-0-9.eE+]*" "$2" | head -1 | sed 's/.*: *//'; }
have() { grep -qF "\"id\": \"$1\"" "$ROWS"; }  # a measurement already in rows.jsonl
row() { echo "{\"id\": \"$1\", $2}" >>"$ROWS"; }

# train NAME CONFIG ARGS...: a run into $RUNS/NAME (skipped when its done marker exists)
train() {
  local name=$1 config=$2
  shift 2
  [ -f "$RUNS/$name.done" ] && return
  rm -rf "${RUNS:?}/$name"
  "$MOH" train "$config" "$@" --set train.precision="$PRECISION" --set data.limit_train="$LIMIT" \
    --run-dir "$RUNS/$name" >"$RUNS/$name.log"
  touch "$RUNS/$name.done"
}
# share TOTAL PCT: PCT % of TOTAL steps, at least 1 (train.max_steps=0 would mean no limit)
share() { local n=$(($1 * $2 / 100)); echo $((n > 0 ? n : 1)); }
# steps NAME: optimizer steps of a finished run
steps() { jnum step "$RUNS/$1/checkpoints/$(cat "$RUNS/$1/checkpoints/latest")/trainer_state.json"; }
convert() {  # convert NAME TARGET DENSE_RUN ROUTER CHOICE KEY
  [ -f "$RUNS/$1/conversion.json" ] && return
  rm -rf "${RUNS:?}/$1"
  "$MOH" convert --to-moh "$2" --in "$RUNS/$3" --key "$6" --out "$RUNS/$1" --set model.router="$4" \
    --shared-heads "$5" --set data.limit_train="$LIMIT" >"$RUNS/$1.log"
}

classifier() {  # classifier SEED
  local s=$1 dense=cls_dense_s$1
  train "$dense" configs/fashion_mnist/mha_vit_nano.yaml --set train.seed="$s" --set train.epochs="$CLS_EPOCHS"
  local total
  total=$(steps "$dense")
  evaluate_cls "$dense" "$s" dense 0
  local router choice pct init
  for router in $ROUTERS; do  # every conversion first (cheap), then the continue-tuning runs, longest first
    for choice in $CHOICES; do
      init=cls_${router}_${choice}_s$s
      convert "$init" configs/fashion_mnist/continue_vit_nano_75.yaml "$dense" "$router" "$choice" model
      evaluate_cls "$init" "$s" "${router}/${choice}" 0
    done
  done
  for pct in 25 10; do
    for router in $ROUTERS; do
      for choice in $CHOICES; do
        init=cls_${router}_${choice}_s$s
        train "${init}_ct$pct" configs/fashion_mnist/continue_vit_nano_75.yaml --set model.weights="$RUNS/$init" \
          --set model.router="$router" --set train.seed="$s" --set train.max_steps="$(share "$total" "$pct")"
        evaluate_cls "${init}_ct$pct" "$s" "${router}/${choice}" "$(share "$total" "$pct")"
      done
    done
  done
  train "cls_scratch_s$s" configs/fashion_mnist/moh_vit_nano.yaml --set model.name=MoH-ViT-Nano-75 \
    --set train.seed="$s" --set train.epochs=$((CLS_EPOCHS + 1)) --set train.max_steps="$(share "$total" 125)"
  evaluate_cls "cls_scratch_s$s" "$s" scratch "$(share "$total" 125)"
}
evaluate_cls() {  # evaluate_cls RUN SEED WHAT EXTRA_STEPS
  have "$1" && return
  local top1
  top1=$("$MOH" eval --checkpoint "$RUNS/$1" --json | tr -d '\n' | grep -o '"top1": *[0-9.]*' | sed 's/.*: *//')
  row "$1" "\"part\": \"cls\", \"seed\": $2, \"what\": \"$3\", \"extra_steps\": $4, \"top1\": $top1"
}

# head_loads SEED: each conversion's head load right after conversion and after continue-tuning for 25 % (moh eval
# --out, then moh plot --head-load) into $OUT/head_load_s$SEED/ROUTER_CHOICE/.
head_loads() {
  local s=$1 router choice init dir
  for router in $ROUTERS; do
    for choice in $CHOICES; do
      init=cls_${router}_${choice}_s$s dir=$OUT/head_load_s$s/${router}_${choice}
      [ -f "$dir/head_load_compare.md" ] && continue
      for run in "$init" "${init}_ct25"; do
        [ -f "$RUNS/$run/eval/head_load.json" ] || "$MOH" eval --checkpoint "$RUNS/$run" --out "$RUNS/$run/eval" >/dev/null
      done
      rm -rf "$dir"
      "$MOH" plot --head-load "converted=$RUNS/$init/eval" "+25 % steps=$RUNS/${init}_ct25/eval" --out "$dir" >/dev/null
    done
  done
}

# features SEED: the FID feature network's run directory; stats SEED: its reference statistics of the test set
features() { echo "${FEATURE_RUN:-$RUNS/cls_dense_s$1}"; }
stats() { echo "$RUNS/fm_test_stats_$(basename "$(features "$1")").npz"; }
diffusion() {  # diffusion SEED (after classifier SEED unless FEATURE_RUN names the feature network)
  local s=$1 dense=dit_dense_s$1 feat total=$DENSE_STEPS
  feat=$(features "$1")
  if [ -z "$total" ]; then
    train "$dense" configs/fashion_mnist/dit_pixel.yaml --set train.seed="$s" --set train.epochs="$DIT_EPOCHS"
    total=$(steps "$dense")
  fi
  [ -f "$(stats "$s")" ] ||
    "$MOH" ref-stats --images fashion_mnist:test --features "classifier:$feat" --out "$(stats "$s")" >/dev/null
  [ -n "$DENSE_STEPS" ] || evaluate_dit "$dense" dense 0 "$s"
  local router choice pct init
  for router in $ROUTERS; do
    for choice in $CHOICES; do
      init=dit_${router}_${choice}_s$s
      convert "$init" configs/fashion_mnist/continue_dit_pixel_75.yaml "$dense" "$router" "$choice" ema
      evaluate_dit "$init" "${router}/${choice}" 0 "$s"
    done
  done
  for pct in 25 10; do
    for router in $ROUTERS; do
      for choice in $CHOICES; do
        init=dit_${router}_${choice}_s$s
        train "${init}_ct$pct" configs/fashion_mnist/continue_dit_pixel_75.yaml --set model.weights="$RUNS/$init" \
          --set model.router="$router" --set train.seed="$s" --set train.max_steps="$(share "$total" "$pct")"
        evaluate_dit "${init}_ct$pct" "${router}/${choice}" "$(share "$total" "$pct")" "$s"
      done
    done
  done
  [ "$SCRATCH" = 1 ] || return 0
  train "dit_scratch_s$s" configs/fashion_mnist/moh_dit_pixel.yaml --set train.seed="$s" \
    --set train.epochs=$((DIT_EPOCHS + 1)) --set train.max_steps="$(share "$total" 125)"
  evaluate_dit "dit_scratch_s$s" scratch "$(share "$total" 125)" "$s"
}
evaluate_dit() {  # evaluate_dit RUN WHAT EXTRA_STEPS SEED
  have "$1" && return
  local run=$RUNS/$1 feat
  feat=$(features "$4")
  rm -rf "$run/samples" "$run/fid"
  # shellcheck disable=SC2086  # SAMPLE_ARGS are words
  "$MOH" sample --checkpoint "$run" --num-samples "$SAMPLES" --steps ddim50 --cfg-scale 4 --seed "$4" $SAMPLE_ARGS \
    --out "$run/samples" >/dev/null
  "$MOH" fid --samples "$run/samples/samples.npz" --ref "$(stats "$4")" --features "classifier:$feat" \
    --out "$run/fid" >/dev/null
  # Provenance of the row: machine and LibTorch, the dense parent's weights (its run's latest model file), the feature
  # network and the reference statistics by SHA-256, the sample count and the sampler.
  local parent=""
  [ "$2" = dense ] || [ "$2" = scratch ] || parent=$RUNS/dit_dense_s$4/checkpoints/$(cat "$RUNS/dit_dense_s$4/checkpoints/latest" 2>/dev/null)/model.safetensors
  python3 - "$1" "$2" "$3" "$4" "$run" "$MACHINE" "$LIBTORCH" "$parent" "$(stats "$4")" "$SAMPLES" >>"$ROWS" <<'PY'
import hashlib, json, os, sys
name, what, extra, seed, run, machine, libtorch, parent, ref, samples = sys.argv[1:]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest() if p and os.path.isfile(p) else None
rep = json.load(open(run + "/fid/report.json"))
loss = None
try:
    losses = [json.loads(l)["loss"] for l in open(run + "/metrics.jsonl") if '"loss"' in l]
    loss = losses[-1] if losses else None
except FileNotFoundError:
    pass
print(json.dumps({"id": name, "part": "dit", "seed": int(seed), "what": what, "extra_steps": int(extra),
                  "fid": rep["metrics"]["fid"], "sample_acc": rep.get("sample_accuracy", {}).get("top1"),
                  "final_loss": loss, "machine": machine, "libtorch": libtorch, "parent_sha256": sha(parent),
                  "feature_sha256": rep.get("feature_net", {}).get("weights_sha256"), "reference_sha256": sha(ref),
                  "samples": int(samples), "sampler": "ddim50, cfg 4"}))
PY
}
for s in $SEEDS; do
  case " $PARTS " in *" cls "*) classifier "$s" && head_loads "$s" ;; esac
  case " $PARTS " in *" dit "*) diffusion "$s" ;; esac
done
.venv/bin/python studies/continue_tuning/table.py "$ROWS" >"$OUT/continue_tuning.md" 2>/dev/null ||
  python3 studies/continue_tuning/table.py "$ROWS" >"$OUT/continue_tuning.md"
cat "$OUT/continue_tuning.md"
