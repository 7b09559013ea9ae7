#!/usr/bin/env bash
# Command-line contract of `moh`: exit codes (0 ok, 2 user error), one-line `error: ...` messages, no stack traces.
# The `expect` cases run in moh_zygote's children when it is given (tests/zygote.sh; a share of the failing ones also
# as moh itself); the interrupted, killed and multi-process runs start moh itself.
# usage: cli_test.sh path/to/moh repo_root [path/to/moh_zygote]
set -u
MOH=$1
ROOT=$2
cd "$ROOT" || exit 1
# shellcheck source=tests/zygote.sh
source "$ROOT/tests/zygote.sh"
fails=0
pass=0
tmp=$(mktemp -d)
trap 'zygote_stop >/dev/null; rm -rf "$tmp"' EXIT
# The memory check before each run (a few measured steps; tests/memory_check_test.sh tests it) is off for the contract
# checks here and on for the interrupted-and-resumed runs, whose exactness it must not disturb.
export MOH_MEMORY_CHECK=0
zygote_start "$MOH" "${3:-}"

# expect CODE PATTERN -- args...   (PATTERN is grepped in stdout+stderr)
expect() {
  local code=$1 pattern=$2
  shift 3
  zmoh "$tmp/out" "$tmp/err" "$@"
  local rc=$?
  if [ "$rc" != "$code" ] || ! cat "$tmp/out" "$tmp/err" | grep -q -- "$pattern"; then
    echo "FAIL: moh $* -> exit $rc (want $code), pattern '$pattern'"; sed 's/^/  | /' "$tmp/out" "$tmp/err" | head -20
    fails=$((fails + 1))
    return
  fi
  if [ "$code" = 2 ]; then  # user errors: exactly one line on stderr, starting with "error: ", no backtrace
    if [ "$(grep -c . "$tmp/err")" != 1 ] || ! head -1 "$tmp/err" | grep -q '^error: '; then
      echo "FAIL: moh $* -> stderr is not one 'error:' line"; sed 's/^/  | /' "$tmp/err" | head -20
      fails=$((fails + 1))
      return
    fi
  fi
  pass=$((pass + 1))
}

# holds FILE WHAT EXPR: the Python expression EXPR (on j, the JSON in FILE) is true; WHAT names the check. The
# provenance a result file carries must be this binary's: its commit and LibTorch as `moh --version` prints them.
COMMIT=$("$MOH" --version | sed -n 's/^moh .*(commit \(.*\))$/\1/p')
LIBTORCH=$("$MOH" --version | awk '/^LibTorch/ {print $2; exit}')
CPU_NAME=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
holds() {
  if python3 - "$1" "$3" "$COMMIT" "$LIBTORCH" <<'PY'; then pass=$((pass + 1)); else echo "FAIL: $2 ($1)"; fails=$((fails + 1)); fi
import hashlib, json, sys
path, expr, commit, libtorch = sys.argv[1:]
j = json.load(open(path))
sha = lambda f: hashlib.sha256(open(f, "rb").read()).hexdigest()
ok = eval(expr)
if not ok:
    print(json.dumps(j.get("provenance"), indent=1)[:2000])
sys.exit(0 if ok else 1)
PY
}
provenance_ok='j["provenance"]["device"] == "cpu" and j["provenance"]["commit"] == commit and j["provenance"]["libtorch"] == libtorch and j["provenance"]["threads"] >= 1 and j["provenance"]["blas"] != ""'

# kill_resume NAME CONFIG FILES -- ARGS...: trains CONFIG with ARGS uninterrupted, and again killed with -9 after its
# first checkpoint then continued with --resume auto; the two runs' FILES (in checkpoint 0000024) and every logged loss
# must be byte-identical.
kill_resume() {
  local name=$1 config=$2 files=$3
  local -x MOH_MEMORY_CHECK=1
  shift 4
  "$MOH" train "$config" "$@" --run-dir "$tmp/${name}_full" >/dev/null 2>&1
  "$MOH" train "$config" "$@" --run-dir "$tmp/${name}_kill" >/dev/null 2>&1 &
  local victim=$!
  for _ in $(seq 1 12000); do [ -e "$tmp/${name}_kill/checkpoints/latest" ] && break; kill -0 $victim 2>/dev/null || break; sleep 0.05; done
  kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
  expect 0 '"steps":24' -- train "$config" "$@" --run-dir "$tmp/${name}_kill" --resume auto
  local same=1 f
  for f in $files; do
    cmp -s "$tmp/${name}_full/checkpoints/0000024/$f" "$tmp/${name}_kill/checkpoints/0000024/$f" || same=0
  done
  [ "$(grep -o '"loss":[^,]*' "$tmp/${name}_full/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$tmp/${name}_kill/metrics.jsonl")" ] || same=0
  if [ $same = 1 ]; then pass=$((pass + 1)); else
    echo "FAIL: $name: kill -9 + --resume auto: final $files or losses differ from the uninterrupted run"; fails=$((fails + 1)); fi
}

# sigint_resume NAME CONFIG FILES -- ARGS...: trains CONFIG with ARGS, interrupted by SIGINT (Ctrl-C) once its second
# metrics line is written (inside an epoch or at its end): it must exit 130 after saving a checkpoint and print the
# command that resumes it; that command must finish the run with FILES (checkpoint 0000024) byte-identical to the
# uninterrupted run NAME_full (written by kill_resume NAME before).
sigint_resume() {
  local name=$1 config=$2 files=$3
  local -x MOH_MEMORY_CHECK=1
  shift 4
  "$MOH" train "$config" "$@" --run-dir "$tmp/${name}_int" >"$tmp/int_out" 2>"$tmp/int_err" &
  local victim=$!
  for _ in $(seq 1 12000); do
    [ "$(cat "$tmp/${name}_int/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break; kill -0 $victim 2>/dev/null || break; sleep 0.02
  done
  kill -INT $victim
  wait $victim
  local rc=$? cmd
  cmd=$(sed -n 's/^resume with: //p' "$tmp/int_err")
  if [ $rc != 130 ] || [ -z "$cmd" ] || ! grep -q "^stopped at step [0-9]*: checkpoint $tmp/${name}_int/checkpoints/" "$tmp/int_err"; then
    echo "FAIL: $name: SIGINT -> exit $rc (want 130), no checkpoint line or resume command"; sed 's/^/  | /' "$tmp/int_err" | tail -5
    fails=$((fails + 1)); return
  fi
  case "$cmd" in "$MOH train $config "*" --resume auto") ;; *) echo "FAIL: $name: resume command '$cmd'"; fails=$((fails + 1)); return ;; esac
  eval "$cmd" >"$tmp/int_out" 2>"$tmp/int_err"
  rc=$?
  local same=1 f
  for f in $files; do
    cmp -s "$tmp/${name}_full/checkpoints/0000024/$f" "$tmp/${name}_int/checkpoints/0000024/$f" || same=0
  done
  if [ $rc = 0 ] && grep -q '"steps":24' "$tmp/int_out" && [ $same = 1 ]; then pass=$((pass + 1)); else
    echo "FAIL: $name: SIGINT + printed resume command -> exit $rc; final $files differ from the uninterrupted run or steps != 24"
    sed 's/^/  | /' "$tmp/int_out" "$tmp/int_err" | tail -5; fails=$((fails + 1)); fi
}

expect 0 "LibTorch [0-9]" -- --version
expect 0 "BLAS: " -- --version
expect 0 "usage: moh" -- --help
expect 2 "unknown command 'confg'" -- confg
expect 2 "did you mean 'config'" -- confg
expect 0 "name: MoH-ViT-Nano" -- config configs/fashion_mnist/moh_vit_nano.yaml
expect 0 "lr: 0.0005" -- config configs/fashion_mnist/moh_vit_nano.yaml --set optim.lr=5e-4
expect 2 "unknown key 'optim.lrr' (did you mean 'optim.lr'?)" -- config configs/fashion_mnist/moh_vit_nano.yaml --set optim.lrr=1
expect 2 "error: config configs/imagenet/moh_vit_s_75.yaml: unknown key 'optim.lrr'" -- config configs/imagenet/moh_vit_s_75.yaml --set optim.lrr=1
expect 2 "optim.lr: -1 is outside \\[0, 10\\]" -- config configs/imagenet/moh_vit_s_75.yaml --set optim.lr=-1
expect 2 "optim.lr: expected a number, got \"fast\"" -- config configs/imagenet/moh_vit_s_75.yaml --set optim.lr=fast
expect 2 "data.root data/imagenet: has no 'train' folder" -- train configs/imagenet/moh_vit_s_75.yaml --run-dir "$tmp/inet"
[ ! -e "$tmp/inet" ] && pass=$((pass + 1)) || { echo "FAIL: a refused ImageNet run created its run dir"; fails=$((fails + 1)); }
expect 2 "file not found" -- config configs/does_not_exist.yaml
expect 2 "missing CONFIG.yaml" -- config
expect 2 "error: moh config" -- config --no-such-flag
expect 0 "optim.lr (number in \\[0, 10\\]) = 0.001" -- config --schema
expect 0 '"params": 675666464' -- info --model MoH-DiT-XL/2-90 --json
expect 0 '"params": 32963360' -- info --model DiT-S/2 --json
expect 0 "MoH-DiT-S/2-75" -- info --list
expect 2 "unknown model variant" -- info --model DiT-XXL/2
# moh config applies every rule of the model's family, with the message moh train gives.
expect 0 "attention_path: sparse" -- config configs/fashion_mnist/moh_vit_nano.yaml --set model.attention_path=sparse
expect 2 "train.accum_steps: must be 1 for diffusion training" -- config configs/fashion_mnist/moh_dit_pixel.yaml --set train.accum_steps=2
expect 2 "(vae: sd or vavae) trains from pre-extracted latents" -- config configs/imagenet/dit_s_2.yaml --set data.dataset=image_folder
expect 2 "did you mean 'MoH-ViT-S-75'" -- info --model MoH-ViT-S-7
expect 0 '"params": 90020632' -- info --model MoH-ViT-B-75 --json
expect 0 '"params": 12809304' -- info --model TransNeXt-Micro --json
expect 0 '"mode": "sparse"' -- bench attention --seqs 32 --dims 32:4 --actives 0.5 --runs 1 --warmup 0 --json
expect 2 "unknown benchmark" -- bench nothing

# Interop: torch.save files in (zip and legacy), safetensors out, one forward pass against PyTorch's outputs.
FX=tests/fixtures/torch
expect 0 "out \[4, 2, 28, 28\]" -- forward --model MoH-DiT-Pixel/4-75 --weights $FX/moh_dit_pixel_fp16.pt --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/fwd/out.safetensors"
expect 0 "wrote $tmp/conv.safetensors: 9 tensors" -- convert --in $FX/nested_legacy.pt --key ema --out "$tmp/conv.safetensors"
expect 0 "wrote $tmp/conv2.safetensors: 90 tensors, 1885088 values" -- convert --in $FX/moh_dit_pixel_fp16.pt --out "$tmp/conv2.safetensors"
expect 0 "out \[4, 2, 28, 28\]" -- forward --model MoH-DiT-Pixel/4-75 --weights "$tmp/conv2.safetensors" --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/fwd/out2.safetensors"
cmp -s "$tmp/fwd/out.safetensors" "$tmp/fwd/out2.safetensors" && pass=$((pass + 1)) || { echo "FAIL: converted weights give other outputs"; fails=$((fails + 1)); }
expect 2 "holds a nested checkpoint, not a state_dict (choose an entry with --weights-key" -- convert --in $FX/nested_zip.pt --out "$tmp/c3.safetensors"
expect 2 "no entry 'emma'" -- convert --in $FX/nested_zip.pt --key emma --out "$tmp/c3.safetensors"
expect 2 "must end in .safetensors" -- convert --in $FX/nested_zip.pt --key ema --out "$tmp/c3.pt"
expect 2 "truncated.pt" -- convert --in $FX/truncated.pt --key ema --out "$tmp/c3.safetensors"
expect 2 "unsupported pickle opcode 0x82" -- convert --in $FX/unsupported_opcode.pt --out "$tmp/c3.safetensors"
[ ! -e "$tmp/c3.safetensors" ] && pass=$((pass + 1)) || { echo "FAIL: a failed convert left a file"; fails=$((fails + 1)); }
expect 2 "unknown model variant or network" -- forward --model MoH-DiT-Pixel/9 --weights $FX/moh_dit_pixel_fp16.pt --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/f.safetensors"
expect 2 "unexpected tensor 'blocks.0.attn.wg.weight'" -- forward --model DiT-Pixel/4 --weights $FX/moh_dit_pixel_fp16.pt --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/f.safetensors"
expect 2 "unexpected tensor 'ema.0.bias'" -- forward --model MoH-DiT-Pixel/4-75 --weights $FX/moh_dit_pixel_fp16.pt --input $FX/nested_expected.safetensors --output "$tmp/f.safetensors"
expect 2 "unexpected tensor 'out'" -- forward --model fid-inception --weights $FX/ddp_prefix.pt --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/f.safetensors"
expect 2 "model.router: query_norm routes the heads of MoH layers; this variant has none" -- forward --model DiT-Pixel/4 --router query_norm --weights $FX/moh_dit_pixel_fp16.pt --allow-missing --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/f.safetensors"
expect 2 "ddp_prefix.pt: missing tensor '" -- forward --model DiT-Pixel/4 --weights $FX/ddp_prefix.pt --input $FX/moh_dit_pixel_io.safetensors --output "$tmp/f.safetensors"

# Latent DiT (SD-VAE): bad inputs of extract-latents and of training from latents.
expect 2 "vae weights weights/sd-vae-ft-ema/diffusion_pytorch_model.safetensors: no such file" -- extract-latents configs/imagenet/dit_s_2.yaml --out "$tmp/lat"
expect 2 "missing tensor 'encoder.conv_in.weight'" -- extract-latents configs/imagenet/dit_s_2.yaml --set diffusion.vae_weights=$FX/nested_expected.safetensors --out "$tmp/lat"
expect 2 "latents data/imagenet256_latents: no meta.json (create it with \`moh extract-latents" -- train configs/imagenet/moh_dit_s_2_75.yaml --run-dir "$tmp/lat_run"
expect 2 "(vae: sd or vavae) trains from pre-extracted latents" -- train configs/imagenet/dit_s_2.yaml --set data.dataset=image_folder --run-dir "$tmp/lat_run"
expect 2 "expected a comma-separated list" -- bench attention --seqs abc
expect 0 '"what":"train_step"' -- bench train --model MoH-ViT-Nano --batch 2 --steps 1 --warmup 0 --profile 3 --json
# bf16's MFU peak: the bf16 product where the CPU has native bf16, else the fp32 one (the fallback is no peak)
peak='"peak_source":"measured fp32 GEMM (no native bf16 on this CPU)"'
grep -q -E 'avx512_bf16|amx_bf16' /proc/cpuinfo && peak='"peak_source":"measured GEMM"'
expect 0 "$peak" -- bench train --model MoH-DiT-Pixel/4-75 --batch 2 --steps 1 --warmup 0 --precision bf16 --attention-path sparse --json
expect 0 '"what":"sample"' -- bench sample --model DiT-Pixel/4 --batch 2 --chain ddim2 --steps 1 --warmup 0 --json
expect 2 "unknown DiT variant" -- bench sample --model MoH-ViT-Nano --batch 2
# --device cuda where no GPU is visible (CI, this machine; a CPU-only or a CUDA LibTorch): one error line, no crash.
if ! "$MOH" --version | grep -q "GPU: [0-9]* visible"; then
  expect 2 "error: device cuda: .*(use device: cpu" -- bench train --model DiT-Pixel/4 --batch 2 --steps 1 --device cuda
  expect 2 "error: device cuda:0: " -- fid --samples fashion_mnist:test:8 --ref fashion_mnist:test:8 --features classifier:runs/none --device cuda:0
fi
expect 2 "--model is required" -- bench train --batch 2
# The input pipeline on a generated ImageNet-like JPEG tree: train and eval rows, one core and all cores.
expect 0 '"pipeline":"eval"' -- bench data --images 64 --batch 16 --rounds 1 --workers 2 --json
expect 2 "needs at least two batches" -- bench data --images 8 --batch 16
expect 2 "--python /nonexistent/python: not an executable" -- bench data --images 64 --python /nonexistent/python
expect 2 "expected one of fp32|tf32|bf16|fp16" -- bench train --model MoH-ViT-Nano --precision fp8

# Training: a tiny real run, then bad inputs that must exit 2 with one line and leave the run's files untouched.
if [ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  NANO=configs/fashion_mnist/moh_vit_nano.yaml
  TINY=(--set data.limit_train=128 --set data.limit_val=64 --set data.batch_size=32 --set train.epochs=1 --set train.max_steps=2
        --set train.processes=1)
  expect 0 '"steps":2' -- train $NANO "${TINY[@]}" --run-dir "$tmp/run"
  # The run's first log line says what it runs on: device, CPU, threads and BLAS kernel, LibTorch, commit.
  grep -qF "commit $COMMIT, LibTorch $LIBTORCH) on cpu ($CPU_NAME, " "$tmp/run/log.txt" &&
    pass=$((pass + 1)) || { echo "FAIL: log.txt does not say where the run ran: $(head -3 "$tmp/run/log.txt")"; fails=$((fails + 1)); }
  sums=$(cd "$tmp/run" && find . -type f | sort | xargs sha256sum)
  expect 2 "already holds a run" -- train $NANO "${TINY[@]}" --run-dir "$tmp/run"
  expect 0 '"steps":2' -- train $NANO "${TINY[@]}" --set model.weights="$tmp/run" --run-dir "$tmp/run_init"
  expect 2 "not a torch.save file" -- train $NANO "${TINY[@]}" --set model.weights=configs/base/imagenet_classification.yaml --run-dir "$tmp/run5"
  expect 2 "nonexistent.pth: no such file" -- train $NANO "${TINY[@]}" --set model.weights=/nonexistent.pth --run-dir "$tmp/run5"
  # `moh config --precision`: what the run would train in here, `auto` measured once as the run measures it, so that
  # the run (each of its two 1-thread ranks where data parallel is built) finds that verdict in the cache.
  expect 0 "^fp32$" -- config $NANO --set train.precision=fp32 --precision
  expect 2 "optim.lr: -1 is outside \\[0, 10\\]" -- config $NANO --set optim.lr=-1 --precision
  ranks=1
  "$MOH" --version | grep -q '^data parallel: c10d' && ranks=2
  said=$(MOH_CPU_PRECISION_CACHE="$tmp/pc.json" "$MOH" config $NANO "${TINY[@]}" --set train.processes=$ranks \
    --precision 2>&1)
  MOH_CPU_PRECISION_CACHE="$tmp/pc.json" "$MOH" train $NANO "${TINY[@]}" --set train.processes=$ranks \
    --run-dir "$tmp/run_prec" >/dev/null 2>&1
  line=$(grep -m1 '^model ' "$tmp/run_prec/log.txt" 2>/dev/null)
  if [[ "$said" =~ ^(fp32|bf16)\ \(auto:\  ]] && [[ "$line" == *", ${said%% *} (auto: "* ]] &&
    [[ "$line" != *"measured now"* ]]; then pass=$((pass + 1)); else
    echo "FAIL: moh config --precision said '$said'; the $ranks-rank run's log: '$line'"; fails=$((fails + 1)); fi
  # One writer per run dir: while a run holds its directory, a second `moh train` there is refused at once.
  "$MOH" train $NANO --set data.limit_train=2048 --set data.batch_size=16 --set train.epochs=1 --set train.processes=1 \
    --run-dir "$tmp/run_busy" >/dev/null 2>&1 &
  busy=$!
  for _ in $(seq 1 12000); do [ -e "$tmp/run_busy/metrics.jsonl" ] && break; sleep 0.05; done
  expect 2 "is in use by another training process" -- train $NANO "${TINY[@]}" --run-dir "$tmp/run_busy" --resume auto
  kill -9 $busy 2>/dev/null; wait $busy 2>/dev/null
  # the lock dies with its process (kill -9): the run continues
  expect 0 '"steps":2' -- train $NANO "${TINY[@]}" --run-dir "$tmp/run_busy" --resume auto
  # kill -9 during classifier training, then --resume auto: final weights (model and EMA) and losses equal an
  # uninterrupted run's, byte for byte.
  kill_resume cls $NANO "model.safetensors ema.safetensors" -- --set train.processes=1 --set data.limit_train=64 --set data.limit_val=32 \
    --set data.batch_size=16 --set train.epochs=6 --set train.log_every_steps=1 --set train.ema_decay=0.9 \
    --set train.eval_every_epochs=1 --set train.ckpt_every_epochs=1
  # Ctrl-C: a checkpoint at the next step (inside the epoch), the resume command printed, exact continuation.
  sigint_resume cls $NANO "model.safetensors ema.safetensors" -- --set train.processes=1 --set data.limit_train=64 --set data.limit_val=32 \
    --set data.batch_size=16 --set train.epochs=6 --set train.log_every_steps=1 --set train.ema_decay=0.9 \
    --set train.eval_every_epochs=1 --set train.ckpt_every_epochs=1
  # The config's own train.processes: 2 (two data-parallel processes started by moh train): killing moh train with -9
  # takes both ranks along; --resume auto restores every rank's generator and ends equal to an uninterrupted run.
  if "$MOH" --version | grep -q "data parallel: c10d"; then
    kill_resume cls2 $NANO "model.safetensors rng.safetensors" -- --set data.limit_train=64 --set data.limit_val=32 \
      --set data.batch_size=16 --set train.epochs=6 --set train.log_every_steps=1 --set model.drop_path=0.1 \
      --set train.eval_every_epochs=1 --set train.ckpt_every_epochs=1
    # Ctrl-C reaches the launcher, which forwards it once to both ranks: they stop at the same step together.
    sigint_resume cls2 $NANO "model.safetensors rng.safetensors" -- --set data.limit_train=64 --set data.limit_val=32 \
      --set data.batch_size=16 --set train.epochs=6 --set train.log_every_steps=1 --set model.drop_path=0.1 \
      --set train.eval_every_epochs=1 --set train.ckpt_every_epochs=1
  fi
  # Classifier EMA (evaluated beside the model, kept in ema.safetensors) and mixed precision (bf16 autocast on CPU).
  expect 0 '"top1_ema"' -- train $NANO "${TINY[@]}" --set train.ema_decay=0.99 --run-dir "$tmp/run_ema"
  expect 0 "top-1" -- eval $NANO --set data.limit_val=64 --checkpoint "$tmp/run_ema" --ema
  # Curves and a table across runs; every metrics line carries a wall-clock time; log.txt mirrors the console.
  expect 0 "| run_ema | MoH-ViT-Nano | 80.95 % | 2 |" -- plot "$tmp/run" "$tmp/run_ema" --out "$tmp/plot"
  [ -s "$tmp/plot/curves.png" ] && [ -s "$tmp/plot/curves.svg" ] && [ -s "$tmp/plot/summary.md" ] && grep -q '"time":"20' "$tmp/run_ema/metrics.jsonl" &&
    grep -q "epoch 1: top-1" "$tmp/run_ema/log.txt" && pass=$((pass + 1)) || { echo "FAIL: plot files, metrics time or log.txt"; fails=$((fails + 1)); }
  expect 2 "has no metrics.jsonl" -- plot "$tmp/run_ema/checkpoints"
  # FID against steps from studies/recipes/run.sh's rows: two seeds of one recipe, one of another; a second model's
  # lines dashed (one line style per model, one colour per recipe)
  printf '%s\n' '{"model": "moh", "recipe": "flow", "seed": 1, "step": 10, "fid": 30}' \
    '{"model": "moh", "recipe": "flow", "seed": 2, "step": 10, "fid": 34}' \
    '{"model": "moh", "recipe": "ddpm", "seed": 1, "step": 20, "fid": 50}' 'not json' >"$tmp/rows.jsonl"
  expect 0 "fid_steps.svg" -- plot --fid-steps "$tmp/rows.jsonl" --out "$tmp/fsteps"
  grep -q "moh ddpm" "$tmp/fsteps/fid_steps.svg" && grep -q "moh flow" "$tmp/fsteps/fid_steps.svg" &&
    ! grep -q "stroke-dasharray" "$tmp/fsteps/fid_steps.svg" &&
    pass=$((pass + 1)) || { echo "FAIL: fid_steps.svg without its series, or dashed with one model"; fails=$((fails + 1)); }
  echo '{"model": "dit", "recipe": "flow", "seed": 1, "step": 10, "fid": 28}' >>"$tmp/rows.jsonl"
  expect 0 "fid_steps.svg" -- plot --fid-steps "$tmp/rows.jsonl" --out "$tmp/fsteps2m"
  [ "$(grep -c 'stroke-dasharray' "$tmp/fsteps2m/fid_steps.svg")" = 2 ] && pass=$((pass + 1)) ||
    { echo "FAIL: fid_steps.svg of two models: the second model's two legend rows not dashed (one point per series: no line)"; fails=$((fails + 1)); }
  expect 2 "holds no JSON line with numbers step and fid" -- plot --fid-steps "$tmp/run_ema/metrics.jsonl" \
    --out "$tmp/fsteps2"
  expect 2 "unknown flag --chekpoint (did you mean --checkpoint?)" -- eval --chekpoint "$tmp/run"
  expect 2 "unexpected argument 'train.epochs=1'" -- train $NANO train.epochs=1 --run-dir "$tmp/run_stray"
  expect 0 "top-1" -- eval --ckpt "$tmp/run" --set data.limit_val=64 --batch 32
  expect 2 "has no EMA weights" -- eval $NANO --set data.limit_val=64 --checkpoint "$tmp/run" --ema
  expect 0 '"steps":2' -- train $NANO "${TINY[@]}" --set train.precision=bf16 --run-dir "$tmp/run_bf16"
  # A diverging run (optim.lr 10 with weight decay 100: each step multiplies the weights by 1 - 1000) stops itself: exit 1, one error line naming the non-finite batches, nothing
  # non-finite written.
  expect 1 'error: training diverged: non-finite loss or gradients in batches' -- train $NANO --set data.limit_train=512 \
    --set data.batch_size=32 --set train.epochs=2 --set train.processes=1 --set optim.lr=10 --set optim.weight_decay=100 --set train.precision=fp32 \
    --run-dir "$tmp/run_diverged"
  [ "$(grep -c '^error:' "$tmp/err")" = 1 ] && [ ! -e "$tmp/run_diverged/checkpoints/latest" ] &&
    pass=$((pass + 1)) || { echo "FAIL: the diverged run: $(cat "$tmp/err")"; fails=$((fails + 1)); }
  # The ImageNet-style streaming ImageFolder path with the whole augmentation recipe, on PNG trees of Fashion-MNIST.
  expect 0 "wrote 96 images" -- export-images --images fashion_mnist:train:96 --out "$tmp/tree/train"
  expect 0 "wrote 48 images" -- export-images --images fashion_mnist:test:48 --out "$tmp/tree/val"
  STREAM=(--set data.dataset=image_folder --set data.root="$tmp/tree" --set data.loader=stream --set data.batch_size=16
          --set augment.rand_augment=rand-m9-mstd0.5-inc1 --set augment.erase_prob=0.25 --set augment.mixup=0.8
          --set augment.cutmix=1.0 --set augment.repeated=3 --set train.epochs=1 --set train.max_steps=3 --set train.processes=1)
  expect 0 '"steps":3' -- train $NANO "${STREAM[@]}" --run-dir "$tmp/run_stream"
  expect 0 "top-1" -- eval $NANO "${STREAM[@]}" --checkpoint "$tmp/run_stream"
  expect 2 "augment.rand_augment: applies to data.loader: stream" -- train $NANO "${TINY[@]}" --set augment.rand_augment=rand-m9 --run-dir "$tmp/run5"
  expect 2 "unknown RandAugment part 'q1'" -- train $NANO "${STREAM[@]}" --set augment.rand_augment=rand-m9-q1 --run-dir "$tmp/run5"
  expect 2 "data.batch_size must be even" -- train $NANO "${STREAM[@]}" --set data.batch_size=15 --run-dir "$tmp/run5"
  expect 0 '"steps":2' -- train $NANO "${TINY[@]}" --set model.attention_path=sparse --run-dir "$tmp/run_sparse"
  expect 2 "fp16 autocast needs a CUDA device" -- train $NANO "${TINY[@]}" --set train.precision=fp16 --run-dir "$tmp/run5"
  expect 2 "unknown model variant or network" -- train $NANO "${TINY[@]}" --set model.name=MoH-ViT-X --run-dir "$tmp/run"
  expect 2 "optim.lr: -1 is outside \\[0, 10\\]" -- train $NANO "${TINY[@]}" --set optim.lr=-1 --run-dir "$tmp/run"
  expect 2 "apt-get install dataset-fashion-mnist" -- train $NANO "${TINY[@]}" --set data.root=/nonexistent --run-dir "$tmp/run2"
  expect 0 "top-1" -- eval $NANO --set data.limit_val=64 --checkpoint "$tmp/run" --out "$tmp/evrep"
  grep -q "| top1 |" "$tmp/evrep/report.md" && pass=$((pass + 1)) || { echo "FAIL: eval report"; fails=$((fails + 1)); }
  holds "$tmp/evrep/report.json" "eval report's provenance and weights" \
    "$provenance_ok and j['weights_sha256'] == sha('$tmp/run/checkpoints/$(cat "$tmp/run/checkpoints/latest")/model.safetensors')"
  # Head loads side by side (e.g. right after conversion and after continue-tuning): a directory or the file itself.
  expect 0 "| stage3.block0 | 0." -- plot --head-load "before=$tmp/evrep" "after=$tmp/evrep/head_load.json" --out "$tmp/hlc"
  expect 2 'has no layer with an "overall" load' -- plot --head-load "$tmp/evrep/report.json" --out "$tmp/hlc2"
  # The same weights through moh convert and --weights give the same top-1.
  expect 0 "wrote $tmp/nano.safetensors" -- convert --in "$tmp/run" --out "$tmp/nano.safetensors"
  top_ck=$("$MOH" eval $NANO --set data.limit_val=64 --checkpoint "$tmp/run" --json | grep '"top1"')
  top_w=$("$MOH" eval $NANO --set data.limit_val=64 --weights "$tmp/nano.safetensors" --json | grep '"top1"')
  [ -n "$top_ck" ] && [ "$top_ck" = "$top_w" ] && pass=$((pass + 1)) || { echo "FAIL: eval --weights '$top_w' != '$top_ck'"; fails=$((fails + 1)); }
  expect 2 "missing --checkpoint PATH" -- eval $NANO
  ck=$(cat "$tmp/run/checkpoints/latest")
  mkdir -p "$tmp/bad" && cp -r "$tmp/run/checkpoints/$ck" "$tmp/bad/ck"
  truncate -s 100 "$tmp/bad/ck/model.safetensors"
  expect 2 "safetensors" -- eval $NANO --checkpoint "$tmp/bad/ck"
  expect 2 "not a checkpoint or run directory" -- train $NANO "${TINY[@]}" --run-dir "$tmp/run3" --resume "$tmp/bad/nothing"
  # Generative metrics with the tiny classifier as feature net: report files, stored reference stats, bad inputs.
  FEAT=(--features "classifier:$tmp/run")
  expect 0 "FID " -- fid --samples fashion_mnist:test:64 --ref fashion_mnist:train:64 "${FEAT[@]}" --out "$tmp/rep"
  [ -s "$tmp/rep/report.json" ] && [ -s "$tmp/rep/report.md" ] && pass=$((pass + 1)) || { echo "FAIL: no report files"; fails=$((fails + 1)); }
  expect 0 "wrote $tmp/ref.npz" -- ref-stats --images fashion_mnist:train:64 --out "$tmp/ref.npz" "${FEAT[@]}"
  holds "$tmp/rep/report.json" "FID report's provenance, no file hash for a dataset reference" \
    "$provenance_ok and j['reference']['sha256'] is None and j['samples']['sampling'] is None"
  expect 0 '"statistics": "stored"' -- fid --samples fashion_mnist:test:64 --ref "$tmp/ref.npz" "${FEAT[@]}" --json --out "$tmp/rep2"
  holds "$tmp/rep2/report.json" "FID report names its reference file by SHA-256" \
    "j['reference']['sha256'] == sha('$tmp/ref.npz') and j['reference']['statistics'] == 'stored'"
  expect 2 "error: npz" -- fid --samples tests/fixtures/npz/truncated.npz --ref "$tmp/ref.npz" "${FEAT[@]}"
  expect 2 "expected uint8" -- fid --samples tests/fixtures/npz/wrong_dtype.npz --ref "$tmp/ref.npz" "${FEAT[@]}"
  expect 2 "is not (N, H, W, 3)" -- fid --samples tests/fixtures/npz/wrong_rank.npz --ref "$tmp/ref.npz" "${FEAT[@]}"
  expect 2 "missing --features" -- fid --samples fashion_mnist:test:64 --ref "$tmp/ref.npz"
  expect 2 "unknown metric 'fdi' (did you mean 'fid'?)" -- fid --samples a.npz --ref b.npz "${FEAT[@]}" --metrics fdi
  expect 2 "pt_inception-2015-12-05" -- fid --samples fashion_mnist:test:64 --ref "$tmp/ref.npz" --features inception:/nonexistent.safetensors
  # Diffusion: a tiny pixel MoH-DiT run, CFG samples as an ADM .npz + grid, sample accuracy through moh fid.
  DIT=configs/fashion_mnist/moh_dit_pixel.yaml
  expect 0 '"steps":2' -- train $DIT --set data.limit_train=32 --set data.batch_size=16 --set train.max_steps=2 --run-dir "$tmp/dit"
  # Initialised from a state_dict written by PyTorch's torch.save (fp16, zip), official key names.
  expect 0 '"steps":2' -- train $DIT --set data.limit_train=32 --set data.batch_size=16 --set train.max_steps=2 --weights tests/fixtures/torch/moh_dit_pixel_fp16.pt --run-dir "$tmp/dit_init"
  expect 2 "unexpected tensor 'blocks.0.attn.wg.weight'" -- train configs/fashion_mnist/dit_pixel.yaml --set train.max_steps=2 --set model.weights=tests/fixtures/torch/moh_dit_pixel_fp16.pt --run-dir "$tmp/dit_init2"
  # kill -9 in the middle of a run, then --resume auto: the final EMA weights equal an uninterrupted run's, byte for byte.
  kill_resume dit $DIT "ema.safetensors" -- --set data.limit_train=64 --set data.batch_size=16 --set train.epochs=6 \
    --set train.log_every_steps=1
  sigint_resume dit $DIT "ema.safetensors" -- --set data.limit_train=64 --set data.batch_size=16 --set train.epochs=6 \
    --set train.log_every_steps=1
  FAST=(--set sampling.per_class=2 --set sampling.steps=ddim3)
  expect 0 "wrote $tmp/s/samples.npz (20 images) from the ema weights of step 2" -- sample --checkpoint "$tmp/dit" "${FAST[@]}" --out "$tmp/s"
  # train.ema_decay: 0 keeps no EMA: the checkpoint has no ema.safetensors and sampling uses the trained weights.
  expect 0 '"steps":2' -- train $DIT --set data.limit_train=32 --set data.batch_size=16 --set train.max_steps=2 --set train.ema_decay=0 --run-dir "$tmp/dit_noema"
  [ ! -e "$tmp/dit_noema/checkpoints/0000002/ema.safetensors" ] && pass=$((pass + 1)) || { echo "FAIL: ema.safetensors without an EMA"; fails=$((fails + 1)); }
  expect 0 "from the model weights of step 2" -- sample --checkpoint "$tmp/dit_noema" "${FAST[@]}" --num-samples 2 --out "$tmp/s6"
  grep -q '"weights": "model"' "$tmp/s6/sampling.json" && pass=$((pass + 1)) || { echo "FAIL: sampling.json does not say which weights"; fails=$((fails + 1)); }
  holds "$tmp/s6/sampling.json" "sampling.json's provenance, weights and where they were trained" \
    "$provenance_ok and j['weights_sha256'] == sha('$tmp/dit_noema/checkpoints/0000002/model.safetensors') and j['checkpoint_written_by']['commit'] == commit"
  holds "$tmp/dit/checkpoints/0000002/trainer_state.json" "a checkpoint records where it was trained" \
    "j['written_by']['device'] == 'cpu' and j['written_by']['commit'] == commit and j['written_by']['libtorch'] == libtorch"
  expect 0 "wrote" -- sample configs/fashion_mnist/moh_dit_pixel.yaml --checkpoint "$tmp/dit" --cfg-scale 3 --steps ddim3 --num-samples 4 --labels 1,7 --seed 5 --out "$tmp/s3"
  expect 0 "wrote" -- sample configs/fashion_mnist/moh_dit_pixel.yaml --checkpoint "$tmp/dit" --cfg-scale 3 --steps ddim3 --num-samples 4 --labels 1,7 --seed 5 --out "$tmp/s4"
  cmp -s "$tmp/s3/samples.npz" "$tmp/s4/samples.npz" && cmp -s "$tmp/s3/grid.png" "$tmp/s4/grid.png" && pass=$((pass + 1)) || { echo "FAIL: same seed, different samples"; fails=$((fails + 1)); }
  expect 2 "was trained as MoH-DiT-Pixel/4-75, the config describes DiT-Pixel/4" -- sample configs/fashion_mnist/dit_pixel.yaml --checkpoint "$tmp/dit" --out "$tmp/s2"
  expect 2 "sampling.cfg_scale: -1 is outside \\[1, 1000\\]" -- sample --checkpoint "$tmp/dit" --cfg-scale -1 --out "$tmp/s2"
  expect 2 "unknown model variant or network (did you mean 'MoH-DiT-Pixel/4-75'?)" -- train $DIT --set model.name=MoH-DiT-Pixel/4-7 --run-dir "$tmp/dit2"
  [ -s "$tmp/s/grid.png" ] && [ -s "$tmp/s/sampling.json" ] && pass=$((pass + 1)) || { echo "FAIL: no grid/sampling.json"; fails=$((fails + 1)); }
  expect 0 "sample accuracy" -- fid --samples "$tmp/s/samples.npz" --ref "$tmp/ref.npz" "${FEAT[@]}" --metrics fid,is --out "$tmp/rep3"
  # The FID report carries how its samples were made (the sampling.json beside them), unless that record is older.
  holds "$tmp/rep3/report.json" "FID report embeds the samples' sampling.json" \
    "j['samples']['sampling']['weights_sha256'] == sha('$tmp/dit/checkpoints/0000002/ema.safetensors') and j['samples']['sampling']['count'] == 20"
  cp -r "$tmp/s" "$tmp/s_stale" && touch -d '+1 minute' "$tmp/s_stale/samples.npz"
  expect 0 "FID " -- fid --samples "$tmp/s_stale/samples.npz" --ref "$tmp/ref.npz" "${FEAT[@]}" --metrics fid --out "$tmp/rep4"
  holds "$tmp/rep4/report.json" "no sampling record older than its samples" "j['samples']['sampling'] is None"
  expect 0 "wrote $tmp/u/samples.npz" -- sample $DIT --untrained "${FAST[@]}" --set sampling.sampler=ddpm --out "$tmp/u"
  # Routing analytics of a MoH-DiT while it samples: head load by timestep and class, entropy, top-K changes.
  expect 0 "head load: 6 routed layers, 3 network evaluations" -- sample $DIT --untrained "${FAST[@]}" --head-load --out "$tmp/hl"
  grep -q '"topk_change_share"' "$tmp/hl/head_load.json" && pass=$((pass + 1)) || { echo "FAIL: no head_load.json"; fails=$((fails + 1)); }
  expect 2 "model DiT-Pixel/4 has no routed MoH layers" -- sample configs/fashion_mnist/dit_pixel.yaml --untrained --head-load --out "$tmp/s2"
  expect 2 "not a DiT" -- sample --checkpoint "$tmp/run" --out "$tmp/s2"
  expect 2 "MoH-DiT-S/2-75 samples 4-channel latents, but diffusion.vae is none" -- sample $DIT --untrained --set model.name=MoH-DiT-S/2-75 --out "$tmp/s2"
  expect 2 "only sampling.\\* can be changed" -- sample --checkpoint "$tmp/dit" --set model.name=DiT-Pixel/4 --out "$tmp/s2"
  expect 2 "needs at least 3 channels" -- sample --checkpoint "$tmp/dit" --set sampling.cfg_channels=three --out "$tmp/s2"
  expect 2 "missing --checkpoint" -- sample --out "$tmp/s2"
  [ ! -e "$tmp/s2" ] && pass=$((pass + 1)) || { echo "FAIL: failing sample commands wrote output"; fails=$((fails + 1)); }
  [ "$sums" = "$(cd "$tmp/run" && find . -type f | sort | xargs sha256sum)" ] && pass=$((pass + 1)) ||
    { echo "FAIL: run files changed by failing commands"; fails=$((fails + 1)); }

  # moh ema sweep: each point is what `moh ema reconstruct` + `moh eval` give by hand, the baselines are the run's
  # own raw and fixed-decay EMA weights, and a second start measures nothing again.
  "$MOH" train $NANO "${TINY[@]}" --set train.max_steps=6 --set train.ema_decay=0.9 \
    --set 'train.phema.sigma_rels=[0.05,0.1]' --set train.phema.snapshot_every=2 --run-dir "$tmp/ph" >/dev/null 2>&1
  expect 0 "Best post-hoc EMA by top1" -- ema sweep "$tmp/ph" --sigma-rels 0.04,0.15 --baselines --out "$tmp/phs" -- eval
  "$MOH" ema reconstruct "$tmp/ph" --sigma-rel 0.15 --out "$tmp/ph15" >/dev/null
  row() { python3 -c 'import json,sys; r={r["id"]: r for r in json.load(open(sys.argv[1]))["rows"]}[sys.argv[2]]; print(r["metrics"]["loss"], r["metrics"]["top1"])' "$tmp/phs/sweep.json" "$1"; }
  by_hand() { "$MOH" eval "$@" --json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["loss"], j["top1"])'; }
  for pair in "sigma_0.15:--checkpoint $tmp/ph15" "raw:--checkpoint $tmp/ph" "fixed_ema:--checkpoint $tmp/ph --ema"; do
    # shellcheck disable=SC2086  # the flags are words
    if [ "$(row "${pair%%:*}")" = "$(by_hand ${pair#*:})" ] && [ -n "$(row "${pair%%:*}")" ]; then pass=$((pass + 1)); else
      echo "FAIL: ema sweep row ${pair%%:*} ($(row "${pair%%:*}")) differs from moh eval ${pair#*:} ($(by_hand ${pair#*:}))"
      fails=$((fails + 1)); fi
  done
  [ "$(row sigma_0.04)" != "$(row sigma_0.15)" ] && pass=$((pass + 1)) || { echo "FAIL: ema sweep points all equal"; fails=$((fails + 1)); }
  expect 0 "(4 points resumed)" -- ema sweep "$tmp/ph" --sigma-rels 0.04,0.15 --baselines --out "$tmp/phs" -- eval
  ! grep -q '^\[' "$tmp/out" && pass=$((pass + 1)) || { echo "FAIL: a resumed ema sweep measured again"; fails=$((fails + 1)); }
  expect 2 "holds a sweep of another run, step or measure" -- ema sweep "$tmp/ph" --sigma-rels 0.04 --out "$tmp/phs" -- eval --batch 8
  # The metric a sweep picks its best point by is read from the measured rows: choosing another resumes, not remeasures.
  expect 0 "Best post-hoc EMA by loss" -- ema sweep "$tmp/ph" --sigma-rels 0.04,0.15 --baselines --out "$tmp/phs" --metric loss -- eval
  grep -q "(4 points resumed)" "$tmp/out" && pass=$((pass + 1)) || { echo "FAIL: ema sweep --metric loss measured again"; fails=$((fails + 1)); }
fi

# Every shipped experiment file (bases excepted) validates.
for f in configs/*/*.yaml; do
  case $f in configs/base/*) continue ;; esac
  if "$MOH" config "$f" >/dev/null 2>"$tmp/cfgerr"; then pass=$((pass + 1)); else echo "FAIL: $f: $(cat "$tmp/cfgerr")"; fails=$((fails + 1)); fi
done

# The attention-path table of README.md is `moh info --attention-paths`.
for f in README.md; do
  if diff <(sed -n '/^<!-- moh info --attention-paths: begin -->$/,/^<!-- moh info --attention-paths: end -->$/p' "$f" | sed '1d;$d') \
          <("$MOH" info --attention-paths) >/dev/null; then pass=$((pass + 1)); else
    echo "FAIL: the attention-path table of $f differs from moh info --attention-paths (run scripts/gen_attention_paths_md.sh)"
    fails=$((fails + 1)); fi
done
# docs/CONFIG.md is generated from the schema: fail when they drift apart.
if diff <(tail -n +7 docs/CONFIG.md) <("$MOH" config --schema --markdown) >/dev/null; then pass=$((pass + 1)); else
  echo "FAIL: docs/CONFIG.md differs from moh config --schema --markdown (run scripts/gen_config_md.sh)"; fails=$((fails + 1)); fi

# Nothing on disk is touched by a failing command.
cp configs/fashion_mnist/moh_vit_nano.yaml "$tmp/c.yaml"
before=$(sha256sum "$tmp/c.yaml")
"$MOH" config "$tmp/c.yaml" --set optim.lrr=1 >/dev/null 2>&1
[ "$before" = "$(sha256sum "$tmp/c.yaml")" ] && pass=$((pass + 1)) || { echo "FAIL: config file modified"; fails=$((fails + 1)); }

zygote_stop
fails=$((fails + ZYG_DIFFERED))
echo "$pass passed, $fails failed"
[ "$fails" = 0 ]
