#!/usr/bin/env bash
# The moh binary's GPU paths end to end on the embedded Fashion-MNIST (scripts/gpu_check.sh's cli stage; runs on a CPU
# machine too with MOH_CLI_DEVICE=cpu, which is how it is rehearsed):
#   - a MoH-ViT-Nano-75 classifier and a MoH-DiT-Pixel/4-75 trained on the device, bf16 autocast, EMA on;
#   - the same DiT in fp16 (loss scaling) for a few steps;
#   - exact resume on the device (train.deterministic): a run killed with -9 after its first checkpoint and resumed
#     equals the uninterrupted run (checkpoint hashes), beside two uninterrupted runs compared;
#   - moh eval of the classifier, moh sample (DDPM with CFG, DDIM) of the DiT, moh fid of two sample sets with the
#     trained classifier as feature network.
#   usage: scripts/gpu_cli_check.sh MOH OUT_DIR RESULTS.jsonl
set -uo pipefail
MOH=$(realpath "$1")
OUT=$(realpath -m "$2")
RESULTS=$(realpath -m "$3")
DEV=${MOH_CLI_DEVICE:-cuda}
R=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT" || exit 2
fails=0
record() { printf '{"stage":"cli","key":"%s","value":%s}\n' "$1" "$2" >>"$RESULTS"; }
# step NAME CMD...: runs a moh command, its output in NAME.log; records NAME.ok.
step() {
  local name=$1
  shift
  if "$@" >"$name.log" 2>&1; then record "$name.ok" true; else
    record "$name.ok" false; fails=$((fails + 1)); echo "FAIL: $name (exit $?)"; tail -n 5 "$name.log"; fi
}
hashes() { (cd "$1/checkpoints" && sha256sum 0*/model.safetensors 0*/optimizer.safetensors 2>/dev/null); }
last_metric() { grep '"loss"' "$1/metrics.jsonl" | tail -n1; }
# json_of LOG: the last JSON object a command printed (one line or pretty-printed), compact; null if none.
json_of() {
  python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
starts = [i for i in range(len(text)) if text[i] == "{" and (i == 0 or text[i - 1] == "\n")]
for i in reversed(starts):
    try:
        print(json.dumps(json.JSONDecoder().raw_decode(text[i:])[0], separators=(",", ":"))); break
    except ValueError:
        continue
else:
    print("null")
PY
}

CLS=(train "$R/configs/fashion_mnist/moh_vit_nano.yaml" --set train.device=$DEV --set train.processes=1 --set train.precision=bf16
     --set data.batch_size=128 --set data.limit_train=4096 --set data.limit_val=1024 --set train.epochs=2
     --set train.ema_decay=0.99 --set train.log_every_steps=8 --set train.seed=5)
DIT=(train "$R/configs/fashion_mnist/moh_dit_pixel.yaml" --set train.device=$DEV --set train.precision=bf16
     --set data.batch_size=128 --set data.limit_train=4096 --set train.epochs=2 --set train.ema_decay=0.99
     --set train.log_every_steps=8 --set train.seed=5)
step train_cls "$MOH" "${CLS[@]}" --run-dir cls
step train_dit "$MOH" "${DIT[@]}" --run-dir dit
record train_cls.last "$(last_metric cls || echo null)"
record train_dit.last "$(last_metric dit || echo null)"
if [ "$DEV" = cpu ]; then record train_dit_fp16 '"skipped: fp16 autocast needs a CUDA device"'; else
  step train_dit_fp16 "$MOH" "${DIT[@]}" --set train.precision=fp16 --set train.max_steps=12 --run-dir dit_fp16
  record train_dit_fp16.last "$(last_metric dit_fp16 || echo null)"
fi

# Determinism and exact resume (fp32, train.deterministic: the comparison the CPU tests make bit for bit).
RES=("${DIT[@]}" --set train.precision=fp32 --set train.ckpt_every_epochs=1 --set train.deterministic=true)
step resume_a "$MOH" "${RES[@]}" --run-dir res_a
step resume_b "$MOH" "${RES[@]}" --run-dir res_b
"$MOH" "${RES[@]}" --run-dir res_k >res_k.log 2>&1 &
victim=$!
for _ in $(seq 1 6000); do [ -e res_k/checkpoints/latest ] && break; sleep 0.05; done
kill -9 $victim 2>/dev/null
wait $victim 2>/dev/null
step resume_k "$MOH" "${RES[@]}" --run-dir res_k --resume auto
same() { [ "$(hashes "$1")" = "$(hashes "$2")" ] && [ -n "$(hashes "$1")" ] && echo true || echo false; }
record deterministic_two_runs "$(same res_a res_b)"
record resume_equals_uninterrupted "$(same res_a res_k)"
[ "$(same res_a res_k)" = true ] || { fails=$((fails + 1)); echo "FAIL: resume on $DEV differs from the uninterrupted run"; }

step eval_cls "$MOH" eval --checkpoint cls --device $DEV --json
record eval_cls "$(json_of eval_cls.log)"
step sample_ddpm "$MOH" sample --checkpoint dit --device $DEV --num-samples 500 --steps 50 --cfg-scale 2 --seed 1 --out s_ddpm
step sample_ddim "$MOH" sample --checkpoint dit --device $DEV --num-samples 500 --sampler ddim --steps ddim25 --cfg-scale 2 \
  --seed 2 --out s_ddim
step fid "$MOH" fid s_ddpm/samples.npz s_ddim/samples.npz --features classifier:cls --device $DEV --json
record fid "$(json_of fid.log)"
exit $((fails > 0))
