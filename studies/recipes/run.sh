#!/usr/bin/env bash
# Issue 55's evidence on the embedded data (Fashion-MNIST): DiT-Pixel/4 and MoH-DiT-Pixel/4-75 trained by each recipe
# for the same steps, with FID measured after every epoch (FID-versus-steps curves):
#   ddpm   DiT's recipe (configs/fashion_mnist/{dit,moh_dit}_pixel.yaml: ε prediction, hybrid loss, learned σ),
#          sampled by DPM-Solver++(2M) 12 steps, CFG 4 in the cleaner half of the noise range (17 evaluations);
#   flow   SiT's recipe (configs/fashion_mnist/moh_sit_pixel.yaml's diffusion section: diffusion.objective: flow,
#          linear path, velocity), sampled by Heun 6 steps with the same guidance (11 steps' worth of evaluations, 6
#          of them guided: 17);
#   ddpm_ld, flow_ld   the same with LightningDiT's block (RMSNorm, SwiGLU, 2-D RoPE); flow_ld also with its
#          logit-normal t (not its cosine loss term, which needs several channels);
#   flow_repa, flow_repa_ld   flow (or flow_ld) + REPA (train.repa): block 2 of 6 (REPA: 8 of 28) aligned with stage 2
#          (8×8 tokens, area-averaged to the DiT's 7×7) of a MoH-ViT-Nano classifier trained by the shipped recipe
#          with another seed (RUNS/repa_encoder, seed 7) — not the FID feature network itself, so the alignment
#          cannot target the metric's own features; λ 0.5, projector width 256 (REPA: 2048 for width 1152).
# The FID feature network is the shipped MoH-ViT-Nano recipe's classifier (configs/fashion_mnist/moh_vit_nano.yaml,
# trained once into RUNS/features), the reference the Fashion-MNIST test set. Every measurement is one JSON line in
# OUT/rows.jsonl with its provenance (machine, LibTorch, seed, recipe, step, feature network and reference statistics
# SHA-256, sample count, sampler), drawn at the end as OUT/fid_steps.png (`moh plot --fid-steps`); finished runs and
# measurements are skipped when the script is started again.
#
# usage: studies/recipes/run.sh [OUT]    (OUT defaults to docs/results/recipes)
# env:   MODELS ("dit moh") RECIPES ("ddpm flow"; also ddpm_ld flow_ld) SEEDS ("1 2") EPOCHS (4) SAMPLES (2000) PRECISION (auto)
#        MOH (build/moh) RUNS (runs/recipes) LIMIT (0: every training image; fewer for a smoke run)
#        JOB (the protocol file's name: jobs may run side by side into one OUT)
#        CKPT_EVERY (0: a checkpoint, and so an FID, after every epoch only; N: also every N steps inside epochs)
#        MAX_STEPS (0: all EPOCHS; N: stop after N steps — the lr is constant, so the run is the longer run's first N
#        steps: an early point without training the rest)
#        SAMPLE_ARGS (extra `moh sample` flags, e.g. "--set sampling.batch_size=1000" on a GPU)
#        TRAIN_ARGS (extra `moh train` flags for every run, e.g. "--set data.batch_size=256 --set optim.lr=1e-3"; named
#        in the protocol and in every row) MEASURE_EVERY (1: an FID at every checkpoint; N: at every N-th and the last)
#        CFG_SWEEP ("": none; e.g. "1 2 6": each run's last checkpoint also sampled at these guidance scales, same
#        interval and steps, one row each in OUT/cfg_rows.jsonl, apart from the FID-versus-steps rows)
set -euo pipefail
cd "$(dirname "$0")/../.."
MOH=${MOH:-build/moh}
OUT=${1:-docs/results/recipes}
RUNS=${RUNS:-runs/recipes}
MODELS=${MODELS:-"dit moh"} RECIPES=${RECIPES:-"ddpm flow"} SEEDS=${SEEDS:-"1 2"} EPOCHS=${EPOCHS:-4}
SAMPLES=${SAMPLES:-2000} PRECISION=${PRECISION:-auto} LIMIT=${LIMIT:-0} CKPT_EVERY=${CKPT_EVERY:-0}
MAX_STEPS=${MAX_STEPS:-0} CFG_SWEEP=${CFG_SWEEP:-} SAMPLE_ARGS=${SAMPLE_ARGS:-}
TRAIN_ARGS=${TRAIN_ARGS:-} MEASURE_EVERY=${MEASURE_EVERY:-1}
[[ "$MEASURE_EVERY" =~ ^[1-9][0-9]*$ ]] ||
  { echo "error: MEASURE_EVERY: $MEASURE_EVERY is not a count of checkpoints (1, 2, ...)" >&2; exit 2; }
[ -x "$MOH" ] || { echo "error: $MOH not found (run scripts/setup.sh first)" >&2; exit 2; }
for r in $RECIPES; do
  case $r in ddpm | flow | ddpm_ld | flow_ld | flow_repa | flow_repa_ld) ;;
  *) echo "error: RECIPES: unknown recipe $r (ddpm, flow, ddpm_ld, flow_ld, flow_repa, flow_repa_ld)" >&2; exit 2 ;;
  esac
done
for m in $MODELS; do
  case $m in dit | moh) ;; *) echo "error: MODELS: unknown model $m (dit, moh)" >&2; exit 2 ;; esac
done
for g in $CFG_SWEEP; do
  [[ "$g" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "error: CFG_SWEEP: $g is not a guidance scale (e.g. \"1 2 6\")" >&2; exit 2; }
done
mkdir -p "$OUT" "$RUNS"
JOB=${JOB:-models_${MODELS// /-}_recipes_${RECIPES// /-}_seeds_${SEEDS// /-}}
LIBTORCH=$("$MOH" --version | sed -n 2p)
# The commit the binary was built from (`moh --version`), in every row; for a binary that does not say (built outside
# git, or before it printed one) the checkout's, marked so.
COMMIT=$("$MOH" --version | sed -n '1s/.*(commit \(.*\))$/\1/p')
[ -n "$COMMIT" ] && [ "$COMMIT" != unknown ] ||
  COMMIT="checkout $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
else MACHINE=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); fi
SWEEP_NOTE=${CFG_SWEEP:+; the last checkpoints also at CFG $CFG_SWEEP (cfg_rows.jsonl)}
EXTRA_NOTE=${TRAIN_ARGS:+; every run with $TRAIN_ARGS}
[ "$MEASURE_EVERY" = 1 ] || EXTRA_NOTE+="; FID at checkpoints ${MEASURE_EVERY}, 2×${MEASURE_EVERY}, … and the last"
echo "protocol: $MACHINE, $LIBTORCH; models $MODELS; recipes $RECIPES; seeds $SEEDS; $EPOCHS epochs, FID after each" \
  "on $SAMPLES samples (classes balanced) against the Fashion-MNIST test set with the shipped MoH-ViT-Nano recipe's" \
  "classifier as the feature network; training images ${LIMIT/#0/all}; precision $PRECISION$SWEEP_NOTE$EXTRA_NOTE" |
  tee "$OUT/protocol_$JOB.txt"
ROWS=$OUT/rows.jsonl CFG_ROWS=$OUT/cfg_rows.jsonl
touch "$ROWS"
have() { grep -qF "\"id\": \"$1\"" "$2"; }

FEATURES=$RUNS/features
if [ ! -f "$FEATURES.done" ]; then
  rm -rf "$FEATURES"
  "$MOH" train configs/fashion_mnist/moh_vit_nano.yaml --run-dir "$FEATURES" >"$FEATURES.log"
  touch "$FEATURES.done"
fi
ENCODER=$RUNS/repa_encoder
if [[ " $RECIPES " == *" flow_repa"* ]] && [ ! -f "$ENCODER.done" ]; then
  rm -rf "$ENCODER"
  "$MOH" train configs/fashion_mnist/moh_vit_nano.yaml --run-dir "$ENCODER" --set train.seed=7 >"$ENCODER.log"
  touch "$ENCODER.done"
fi
STATS=$RUNS/fm_test_stats.npz
[ -f "$STATS" ] || "$MOH" ref-stats --images fashion_mnist:test --features "classifier:$FEATURES" --out "$STATS" >/dev/null

config() { [ "$1" = dit ] && echo configs/fashion_mnist/dit_pixel.yaml || echo configs/fashion_mnist/moh_dit_pixel.yaml; }
LIGHTNING_BLOCK="--set model.norm=rmsnorm --set model.mlp=swiglu --set model.pos=rope2d"
recipe_sets() {  # the training overrides of a recipe
  case $1 in
  ddpm) ;;
  flow) echo "--set diffusion.objective=flow --set sampling.sampler=heun --set sampling.steps=6" ;;
  ddpm_ld) echo "$LIGHTNING_BLOCK" ;;
  # LightningDiT's cosine term runs over channels: on one channel it is ±1 (no gradient, unbounded at 0; moh refuses
  # it), so on grey Fashion-MNIST flow_ld is its block and its logit-normal t without it.
  flow_ld) echo "$(recipe_sets flow) $LIGHTNING_BLOCK --set diffusion.t_sampling=lognormal" ;;
  flow_repa*) echo "$(recipe_sets "flow${1#flow_repa}") --set train.repa.encoder=$ENCODER --set train.repa.stage=2" \
    "--set train.repa.depth=2 --set train.repa.weight=0.5 --set train.repa.projector_dim=256" ;;
  esac
}
sampler_args() {  # RECIPE [CFG]: the FID samples' sampler, 17 network evaluations per image at CFG 4 either way
  case $1 in
  ddpm*) echo "--sampler dpm++2m --steps 12 --cfg-scale ${2:-4} --cfg-interval 0,0.5" ;;
  flow*) echo "--sampler heun --steps 6 --cfg-scale ${2:-4} --cfg-interval 0,0.5" ;;
  esac
}

# measure NAME RUN STEP MODEL RECIPE SEED [CFG]: FID of one checkpoint, one row (in CFG_ROWS when CFG is given)
measure() {
  local id=$1 ckpt=$2/checkpoints/$3 dir=$2/eval_$3${7:+_cfg$7} rows=$ROWS
  [ -n "${7:-}" ] && rows=$CFG_ROWS && touch "$rows"
  have "$id" "$rows" && return
  rm -rf "$dir"
  # shellcheck disable=SC2046,SC2086  # the sampler flags are words
  "$MOH" sample --checkpoint "$ckpt" --num-samples "$SAMPLES" --seed "$6" $(sampler_args "$5" "${7:-}") \
    $SAMPLE_ARGS --out "$dir/samples" >/dev/null
  "$MOH" fid --samples "$dir/samples/samples.npz" --ref "$STATS" --features "classifier:$FEATURES" \
    --out "$dir/fid" >/dev/null
  local encoder=""  # the REPA encoder's weights (what the run's log names with its SHA-256)
  [[ "$5" == flow_repa* ]] && encoder=$ENCODER/checkpoints/$(cat "$ENCODER/checkpoints/latest")/model.safetensors
  python3 - "$id" "$4" "$5" "$6" "$3" "$dir" "$MACHINE" "$LIBTORCH" "$STATS" "$SAMPLES" \
    "$(sampler_args "$5" "${7:-}")" "$PRECISION" "$encoder" "$COMMIT" "${7:-4}" "$TRAIN_ARGS" >>"$rows" <<'PY'
import hashlib, json, sys
name, model, recipe, seed, step, d, machine, libtorch, ref, samples, sampler, precision, encoder, commit, cfg, \
    train_args = sys.argv[1:]
rep, s = json.load(open(d + "/fid/report.json")), json.load(open(d + "/samples/sampling.json"))
on = lambda p: f'{p["device"]} ({p["device_name"]})' if p else None  # where moh ran, as it recorded it
print(json.dumps({"id": name, "model": model, "recipe": recipe, "seed": int(seed), "step": int(step),
                  "fid": rep["metrics"]["fid"], "sample_acc": rep.get("sample_accuracy", {}).get("top1"),
                  "machine": machine, "libtorch": libtorch, "commit": commit, "precision": precision,
                  "feature_sha256": rep.get("feature_net", {}).get("weights_sha256"),
                  "reference_sha256": hashlib.sha256(open(ref, "rb").read()).hexdigest(),
                  "samples": int(samples), "sampler": sampler, "cfg": float(cfg), "nfe": s["nfe_per_image"],
                  "weights_sha256": s["weights_sha256"], "sampled_on": on(s["provenance"]),
                  "trained_on": on(s.get("checkpoint_written_by")),
                  "repa_encoder_sha256": hashlib.sha256(open(encoder, "rb").read()).hexdigest() if encoder else None,
                  **({"train_args": train_args} if train_args else {})}))
PY
}

for s in $SEEDS; do
  for m in $MODELS; do
    for r in $RECIPES; do
      name=${m}_${r}_s$s run=$RUNS/${m}_${r}_s$s
      if [ ! -f "$run.done" ]; then
        # a run cut short (a killed job, a GPU call's time limit) goes on from its last checkpoint, exactly
        # shellcheck disable=SC2046,SC2086  # the recipe's overrides are words
        "$MOH" train "$(config "$m")" --run-dir "$run" --resume auto --set train.seed="$s" \
          --set train.epochs="$EPOCHS" --set train.precision="$PRECISION" --set data.limit_train="$LIMIT" \
          --set train.ckpt_every_steps="$CKPT_EVERY" --set train.max_steps="$MAX_STEPS" \
          $(recipe_sets "$r") $TRAIN_ARGS >>"$run.log"
        touch "$run.done"
      fi
      last=$(basename "$(find "$run/checkpoints" -maxdepth 1 -name '[0-9]*' | sort | tail -n1)")
      i=0
      for ckpt in "$run"/checkpoints/[0-9]*; do  # in step order
        i=$((i + 1))
        [ $((i % MEASURE_EVERY)) = 0 ] || [ "$(basename "$ckpt")" = "$last" ] || continue
        measure "${name}_$(basename "$ckpt")" "$run" "$(basename "$ckpt")" "$m" "$r" "$s"
      done
      for g in $CFG_SWEEP; do
        measure "${name}_${last}_cfg$g" "$run" "$last" "$m" "$r" "$s" "$g"
      done
    done
  done
done
cat "$ROWS"
"$MOH" plot --fid-steps "$ROWS" --out "$OUT"  # OUT/fid_steps.svg and .png: the FID-versus-steps curves
