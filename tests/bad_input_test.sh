#!/usr/bin/env bash
# The bad-input contract, case by case: a malformed config, flag, file, image, npz, checkpoint or output path must end
# with exit code 2 and exactly one stderr line `error: ...` (no library or progress lines before it), must leave every
# file already on disk untouched (not written, replaced or removed: the fixture tree's listing with inodes and
# change times after every case) and must create nothing where it was refused.
# The cases run in moh_zygote's children when it is given (tests/zygote.sh; a share of them also as moh itself).
# usage: bad_input_test.sh path/to/moh repo_root [path/to/moh_zygote]
set -u
MOH=$1
ROOT=$2
cd "$ROOT" || exit 1
# shellcheck source=tests/zygote.sh
source "$ROOT/tests/zygote.sh"
tmp=$(mktemp -d)
trap 'zygote_stop >/dev/null; chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
pass=0
NANO=configs/fashion_mnist/moh_vit_nano.yaml
DIT=configs/fashion_mnist/moh_dit_pixel.yaml
TINY=(--set data.limit_train=128 --set data.limit_val=64 --set data.batch_size=32 --set train.epochs=1
      --set train.max_steps=2 --set train.processes=1)
F=$tmp/fx   # fixtures: must not change
O=$tmp/out  # where refused commands were pointed: must stay empty
mkdir -p "$F" "$O"
# fixtures are made without the memory check (a few measured steps per run; tests/memory_check_test.sh tests it)
setup() { MOH_MEMORY_CHECK=0 "$@" >"$tmp/setup.log" 2>&1 || { echo "setup failed: $*"; cat "$tmp/setup.log"; exit 1; }; }

# ---- fixtures ------------------------------------------------------------------------------------------------------
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  echo "SKIP: no Fashion-MNIST (apt-get install dataset-fashion-mnist)"; exit 0
fi
setup "$MOH" train $NANO "${TINY[@]}" --run-dir "$F/run"
setup "$MOH" train $DIT --set data.limit_train=32 --set data.batch_size=16 --set train.max_steps=2 --run-dir "$F/dit"
setup "$MOH" train $DIT --set data.limit_train=32 --set data.batch_size=16 --set train.max_steps=2 \
  --set diffusion.objective=flow --set sampling.sampler=euler --set sampling.steps=4 --run-dir "$F/flow"
setup "$MOH" train configs/fashion_mnist/dit_pixel.yaml --set data.limit_train=32 --set data.batch_size=16 \
  --set train.max_steps=1 --run-dir "$F/ddense"
setup "$MOH" train $DIT --set data.limit_train=32 --set data.batch_size=16 --set train.max_steps=2 \
  --set 'train.phema.sigma_rels=[0.05,0.1]' --set train.phema.snapshot_every=2 --run-dir "$F/phema"
setup "$MOH" ref-stats --images fashion_mnist:train:64 --out "$F/ref.npz" --features "classifier:$F/run"
setup "$MOH" export-images --images fashion_mnist:train:60 --format jpg --out "$F/tree/train"
setup "$MOH" export-images --images fashion_mnist:test:30 --format jpg --out "$F/tree/val"
# SD-style latents (no channel statistics) shaped like VA-VAE's: 32 channels, 16x16
mkdir -p "$F/sdlat" && printf '%s\n' '{"format": "moh-latents", "version": 1, "count": 1, "shards": [1], "channels": 32,
 "size": 16, "image_size": 256, "scale": 1.0, "classes": ["a"], "vae": "x", "vae_sha256": "", "source": "x"}' \
  >"$F/sdlat/meta.json"
# a tree where 10 of the 60 training JPEGs are cut short (OpenCV would grey-fill them and call them good)
cp -r "$F/tree" "$F/cut"
for f in $(find "$F/cut/train" -name '*.jpg' | sort | head -10); do head -c 300 "$f" >"$f.x" && mv "$f.x" "$f"; done
# a tree whose val split has one class folder more (an empty one): every later label would shift
# a tree whose training JPEGs are all cut short (the streaming loader meets one in its first batch)
cp -r "$F/tree" "$F/allcut"
for f in $(find "$F/allcut/train" -name '*.jpg'); do head -c 300 "$f" >"$f.x" && mv "$f.x" "$f"; done
cp -r "$F/tree" "$F/shift" && mkdir -p "$F/shift/val/00_a_extra"
# a tree whose val split is all cut short (the training split loads first, fine)
cp -r "$F/tree" "$F/valcut"
for f in $(find "$F/valcut/val" -name '*.jpg'); do head -c 300 "$f" >"$f.x" && mv "$f.x" "$f"; done
# a folder of sample images with one truncated PNG
setup "$MOH" export-images --images fashion_mnist:test:8 --out "$F/pngs"
mkdir -p "$F/samples" && find "$F/pngs" -name '*.png' -exec cp {} "$F/samples/" \;
p=$(find "$F/samples" -name '*.png' | sort | head -1) && head -c 100 "$p" >"$p.x" && mv "$p.x" "$p"
# a sampling directory left with parts of the same plan from other weights at the same path and step (a run trained
# again): only weights_sha256 differs, so nothing but the weights' bytes can refuse it
SPARTS=(--checkpoint "$F/dit" --num-samples 4 --steps ddim2)
setup "$MOH" sample "${SPARTS[@]}" --out "$tmp/s0"
mkdir -p "$F/sparts/parts" && python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["weights_sha256"] = "0" * 64
json.dump({k: j[k] for k in ("checkpoint", "count", "labels", "labels_hash", "model", "sampling", "step", "weights",
                             "weights_sha256")}, open(sys.argv[2], "w"))' "$tmp/s0/sampling.json" "$F/sparts/parts/plan.json"
# run directories with damaged resume state
ck=$(cat "$F/run/checkpoints/latest")
for r in missing outside empty nolatest rng; do cp -r "$F/run" "$F/run_$r"; done
echo "0000999" >"$F/run_missing/checkpoints/latest"
echo "../../../etc" >"$F/run_outside/checkpoints/latest"
: >"$F/run_empty/checkpoints/latest"
rm "$F/run_nolatest/checkpoints/latest"
cp "$F/run/checkpoints/$ck/model.safetensors" "$F/run_rng/checkpoints/$ck/rng.safetensors"
# configs
printf 'version: 1\nmodel:\n  name: MoH-ViT-Nano\n  num_classes: 10\nmodel:\n  name: DiT-S/2\n' >"$F/dup.yaml"
printf 'version: 1\nmodel:\n  name: MoH-ViT-Nano\n  name: MoH-ViT-Nano\n' >"$F/dup_inner.yaml"
printf 'version: 1\nmodel: [name: x\n' >"$F/syntax.yaml"
printf 'version: 1\ndata:\n  batch_size: 8\n' >"$F/no_model.yaml"
# hostile configs, outside $F (nothing refers to them but their own cases): aliases nine levels deep with nine
# references each ("billion laughs": 9^9 nodes expanded), maps nested 200 deep, 100 MB, a NUL byte, a binary file
Y=$tmp/yaml && mkdir -p "$Y"
{ printf 'a: &a [x, x, x, x, x, x, x, x, x]\n'; p=a
  for k in b c d e f g h i; do printf '%s: &%s [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n' $k $k $p $p $p $p $p $p $p $p $p; p=$k; done
} >"$Y/bomb.yaml"
{ for k in $(seq 200); do printf '%*sk:\n' $((2 * k - 2)) ''; done; printf '%*sv: 1\n' 400 ''; } >"$Y/deep.yaml"
truncate -s 100M "$Y/big.yaml"
printf 'version: 1\nmodel:\n  name: MoH-ViT-Nano\0\n' >"$Y/nul.yaml"
head -c 4096 "$(command -v ls)" >"$Y/binary.yaml"
printf 'version: 1\nmodel:\n  name: MoH-ViT-Nano \xff\xfe\n' >"$Y/latin.yaml"
# safetensors: truncated, header not JSON, a dimension above INT64_MAX
head -c 200 "$F/run/checkpoints/$ck/model.safetensors" >"$F/trunc.safetensors"
st() {  # st FILE JSON: a safetensors file with this header and no data
  local n=${#2} i b=""
  for i in 0 1 2 3 4 5 6 7; do b+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
  printf "$b" >"$1" && printf '%s' "$2" >>"$1"
}
st "$F/garbage.safetensors" 'this is not json'
st "$F/hugedim.safetensors" '{"w":{"dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0]}}'
echo "a file" >"$F/afile"
mkdir -p "$F/dir.safetensors"
ln -s "$F/loop" "$F/loop"
mkdir -p "$F/readonly" && chmod 555 "$F/readonly"
mkdir -p "$F/tbrun" && echo "a file" >"$F/tbrun/tb"

# For the newer features' cases: a directory, a named pipe and a dangling link where files go; a sweep folder with a
# damaged sweep.json; reference statistics whose meta is a JSON list; a run with a damaged diverged mark.
mkdir -p "$F/adir" && mkfifo "$F/fifo" && ln -s "$F/nowhere" "$F/dangling"
mkdir -p "$F/sweep_damaged" && echo '[1, 2' >"$F/sweep_damaged/sweep.json"
python3 - "$F/ref.npz" "$F/meta_list.npz" <<'PYEOF'
import struct, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
data = b"[1, 2]"  # meta as .npy: a uint8 vector of JSON bytes (moh ref-stats writes an object)
header = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % len(data)
header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data
with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
    for item in a.infolist():
        b.writestr(item.filename, npy if item.filename == "meta.npy" else a.read(item.filename))
PYEOF
cp -r "$F/run" "$F/run_diverged" && echo 'garbage{' >"$F/run_diverged/diverged.json"

# Every file's path, size, inode and modification and change times: a write, a replacement (rename) or a truncation
# shows in the change time, which no program can set back; cheaper than hashing the whole tree after every case.
snapshot() { (cd "$F" && find . -type f -printf '%p %s %i %T@ %C@\n' | LC_ALL=C sort); }
reference=$(snapshot)
zygote_start "$MOH" "${3:-}"

# bad PATTERN -- ARGS...: exit 2, one stderr line "error: ..." containing PATTERN, fixtures unchanged, $O empty.
BAD_ENV=()  # environment variables of the next case (bad_env)
bad() {
  local pattern=$1
  shift 2
  if [ ${#BAD_ENV[@]} = 0 ]; then zmoh "$tmp/o" "$tmp/e" "$@"; else
    timeout 300 env "${BAD_ENV[@]}" "$MOH" "$@" >"$tmp/o" 2>"$tmp/e"; fi
  local rc=$? why=""
  [ "$rc" = 2 ] || why="exit $rc"
  [ "$(grep -c '' "$tmp/e")" = 1 ] && head -1 "$tmp/e" | grep -q '^error: ' || why="$why; stderr is not one error line"
  grep -qF -- "$pattern" "$tmp/e" || why="$why; no '$pattern'"
  [ -z "$(ls -A "$O")" ] || why="$why; created $(ls -A "$O" | head -3 | tr '\n' ' ')"
  [ "$(snapshot)" = "$reference" ] || why="$why; a pre-existing file changed"
  if [ -z "$why" ]; then pass=$((pass + 1)); return; fi
  echo "FAIL: moh $* -> ${why#; }"; sed 's/^/  | /' "$tmp/e" | head -8
  fails=$((fails + 1))
  rm -rf "${O:?}"/* && reference=$(snapshot)
}

# 1. Numbers: finite, in range, before anything runs (config keys and --set alike).
for kv in optim.lr=.inf optim.lr=1e39 schedule.min_lr=.nan train.moh_loss_coeff=.inf optim.clip_grad=.nan \
          schedule.warmup_epochs=.nan model.drop_path=.nan sampling.cfg_scale=.inf sampling.eta=.inf optim.eps=.inf \
          optim.weight_decay=-.inf train.label_smoothing=.nan schedule.warmup_lr=.inf data.max_bad_fraction=.nan \
          'optim.betas=[.nan,0.999]' 'augment.scale=[0.08,.inf]'; do
  bad "${kv%%=*}" -- train $NANO "${TINY[@]}" --set "$kv" --run-dir "$O/r"
done
bad "model.img_size: 100000 is outside [0, 8192]" -- train $NANO "${TINY[@]}" --set model.img_size=100000 --run-dir "$O/r"
bad "needs at least" -- train configs/imagenet/moh_vit_s_75.yaml --set model.img_size=8192 --run-dir "$O/r"
# A model the embedded data cannot feed: refused when the config is checked, not at the first step (a LibTorch error)
# or after `precision: auto` has timed the model (minutes on a machine without the cached verdict).
t0=$SECONDS
bad "MoH-ViT-S-75 takes 3 channels, the data has 1" -- train $NANO --set model.name=MoH-ViT-S-75 --run-dir "$O/r"
MOH_CPU_PRECISION_CACHE=$tmp/fresh_precision_cache.json \
  bad "MoH-DiT-S/2-90 takes 32 px images, the data is 28 px" -- train $DIT --set model.name=MoH-DiT-S/2-90 \
  --set train.precision=auto --run-dir "$O/r"
if [ $((SECONDS - t0)) -gt 30 ]; then
  echo "FAIL: the two shape refusals took $((SECONDS - t0)) s (checked before any work: seconds)"; fails=$((fails + 1))
fi
bad "data.num_workers: 100000 is outside [0, 256]" -- train $NANO "${TINY[@]}" --set data.num_workers=100000 --run-dir "$O/r"
bad "the training data has labels up to 9" -- train $NANO "${TINY[@]}" --set model.num_classes=3 --run-dir "$O/r"
bad "larger than the training set (128 examples)" -- train $NANO "${TINY[@]}" --set data.batch_size=4096 --run-dir "$O/r"
bad "optim.betas: expected two numbers" -- train $NANO "${TINY[@]}" --set 'optim.betas=[0.9]' --run-dir "$O/r"
bad "train.epochs: 0 is outside [1, 1000000]" -- config $NANO --set train.epochs=0
bad "data.batch_size: expected an integer" -- config $NANO --set data.batch_size=lots
bad "unsupported version 2" -- config $NANO --set version=2
bad "key 'model' appears twice" -- train "$F/dup.yaml" --run-dir "$O/r"
bad "log.tensorboard: expected true or false" -- config $NANO --set log.tensorboard=maybe
bad "tbrun/tb is a file, not a directory" -- train $NANO "${TINY[@]}" --set log.tensorboard=true --run-dir "$F/tbrun"
bad "key 'model.name' appears twice" -- config "$F/dup_inner.yaml"
bad "key 'lr' appears twice" -- config $NANO --set 'optim={lr: 1e-3, lr: 2e-3}'
bad "YAML syntax error at line" -- config "$F/syntax.yaml"
bad "missing required key 'model.name'" -- config "$F/no_model.yaml"
bad "unknown key 'optim.lrr' (did you mean 'optim.lr'?)" -- train $NANO --set optim.lrr=1 --run-dir "$O/r"
bad "model.router: query_norm routes the heads of MoH layers" -- train configs/fashion_mnist/dit_pixel.yaml --set model.router=query_norm --run-dir "$O/r"
bad "model.router: query_norm routes the heads of MoH layers" -- config configs/fashion_mnist/mha_vit_nano.yaml --set model.router=query_norm
# Hostile configs are refused before anything walks them: each within 10 s (a hang was > 300 s; measured times in
# the log, the goal is < 1 s).
timed_bad() {
  local t0=$(date +%s%N)
  bad "$@"
  local ms=$((($(date +%s%N) - t0) / 1000000))
  echo "  $ms ms: moh ${*:3}"
  [ "$ms" -lt 10000 ] || { echo "FAIL: took $ms ms"; fails=$((fails + 1)); }
}
timed_bad "YAML nodes once aliases are expanded" -- train "$Y/bomb.yaml" --run-dir "$O/r"
timed_bad "YAML nodes once aliases are expanded" -- config $NANO --set "model.x=$(cat "$Y/bomb.yaml" | tr '\n' ',' | sed 's/^/{/; s/,$/}/')"
timed_bad "nested deeper than 64 levels" -- config "$Y/deep.yaml"
timed_bad "over the limit of 1 MiB" -- train "$Y/big.yaml" --run-dir "$O/r"
timed_bad "a NUL byte at offset" -- config "$Y/nul.yaml"
timed_bad "a NUL byte at offset" -- config "$Y/binary.yaml"
timed_bad "not UTF-8 text" -- config "$Y/latin.yaml"
bad "sampling.cfg_scale: expected a number, got \"nan\"" -- sample --checkpoint "$F/dit" --cfg-scale nan --out "$O/s"
bad "sampling.cfg_scale: must be finite" -- sample --checkpoint "$F/dit" --cfg-scale .inf --out "$O/s"
bad "sampling.seed: expected an integer" -- sample --checkpoint "$F/dit" --seed abc --out "$O/s"
bad "--num-samples: must be > 0" -- sample --checkpoint "$F/dit" --num-samples 0 --out "$O/s"
bad "'99' is not a class index below 10" -- sample --checkpoint "$F/dit" --labels 1,99 --out "$O/s"
bad "sampling.precision: auto is a training setting" -- sample --checkpoint "$F/dit" --precision auto --out "$O/s"
bad "sampling.precision" -- sample --checkpoint "$F/dit" --precision fp64 --out "$O/s"
bad "fp16 autocast needs a CUDA device" -- sample --checkpoint "$F/dit" --precision fp16 --device cpu --out "$O/s"
# a sampler of the other objective (flow matching vs DDPM), and the flow keys' rules
bad "sde does not run on a DDPM model" -- sample --checkpoint "$F/dit" --sampler sde --steps 50 --out "$O/s"
bad "dopri5 does not run on a DDPM model" -- sample --checkpoint "$F/dit" --sampler dopri5 --out "$O/s"
bad "holds parts of another sampling run (weights_sha256: \"000" -- sample "${SPARTS[@]}" --out "$F/sparts"
bad "ddpm does not run on a flow model (diffusion.objective: flow) (use euler, heun, dopri5 or sde)" -- \
  sample --checkpoint "$F/flow" --sampler ddpm --out "$O/s"
bad "ddim does not run on a flow model" -- train $DIT --set diffusion.objective=flow --run-dir "$O/r"
bad "diffusion.t_lognormal: expected [m, s] with s > 0" -- train $DIT --set diffusion.objective=flow \
  --set sampling.sampler=sde --set diffusion.t_sampling=lognormal --set "diffusion.t_lognormal=[0, 0]" --run-dir "$O/r"
bad "mse+cosine compares velocities" -- train $DIT --set diffusion.objective=flow --set sampling.sampler=sde \
  --set diffusion.loss=mse+cosine --set diffusion.prediction=noise --run-dir "$O/r"
bad "mse+cosine compares velocities over channels; MoH-DiT-Pixel/4-75 has 1" -- train $DIT \
  --set diffusion.objective=flow --set sampling.sampler=heun --set sampling.steps=6 --set diffusion.loss=mse+cosine \
  --run-dir "$O/r"
bad "LightningDiT's block options are for DiT models" -- train $NANO --set model.mlp=swiglu --run-dir "$O/r"
bad "overlapping output windows are for DiT models" -- train $NANO --set model.overlap_output=true --run-dir "$O/r"
bad "sampling.atol: must be > 0" -- sample --checkpoint "$F/flow" --sampler dopri5 --set sampling.atol=0 --out "$O/s"
# LightningDiT's timestep shift: fixed-grid flow samplers only; VA-VAE's weights and channel statistics
bad "sampling.timestep_shift: warps the grid of the flow euler and heun samplers only" -- sample --checkpoint \
  "$F/flow" --sampler sde --steps 10 --set sampling.timestep_shift=0.3 --out "$O/s"
bad "sampling.timestep_shift: -1 is outside [0, 1000]" -- sample --checkpoint "$F/flow" --set sampling.timestep_shift=-1 \
  --out "$O/s"
bad "sampling.timestep_shift: warps the grid" -- sample --checkpoint "$F/dit" --set sampling.timestep_shift=0.3 \
  --out "$O/s"
bad "vae weights $F/vavae.pt: no such file (download hustvl/vavae-imagenet256-f16d32-dinov2" -- extract-latents \
  configs/imagenet/lightningdit_xl_1.yaml --set diffusion.vae_weights="$F/vavae.pt" --out "$O/lat"
bad "latents $F/sdlat: meta.json has no channel statistics (vae: vavae standardises them)" -- train \
  configs/imagenet/lightningdit_xl_1.yaml --set data.root="$F/sdlat" --run-dir "$O/r"
# REPA: the encoder file, its kind and its token grid, the block, a classifier
bad "train.repa.encoder: no such file" -- train $DIT --set train.repa.encoder="$F/dinov2.safetensors" \
  --set train.repa.depth=2 --run-dir "$O/r"
bad "not DINOv2 ViT weights: no tensor 'cls_token'" -- train $DIT "${TINY[@]}" --set train.repa.depth=2 \
  --set train.repa.encoder="$F/dit/checkpoints/$(cat "$F/dit/checkpoints/latest")/model.safetensors" --run-dir "$O/r"
bad "stage-4 token grid 2×2 cannot map to the DiT's 7×7 grid" -- train $DIT --set train.repa.encoder="$F/run" \
  --set train.repa.depth=2 --run-dir "$O/r"
bad "train.repa.depth: 7 is not a block of MoH-DiT-Pixel/4-75 (1..6)" -- train $DIT --set train.repa.encoder="$F/run" \
  --set train.repa.stage=2 --set train.repa.depth=7 --run-dir "$O/r"
bad "train.repa.weight: -1 is outside [0, 1000000]" -- train $DIT --set train.repa.weight=-1 --run-dir "$O/r"
bad "REPA aligns a diffusion model's tokens" -- train $NANO --set train.repa.encoder="$F/run" --run-dir "$O/r"
# FD-DINOv2 and KID: a missing DINOv2 file, a metric the network cannot give, an unknown metric
bad "--features dinov2:$F/dinov2.pth: no such weights file" -- fid --samples fashion_mnist:train:16 \
  --ref fashion_mnist:test:16 --features "dinov2:$F/dinov2.pth" --out "$O/f"
bad "not DINOv2 ViT weights" -- fid --samples fashion_mnist:train:16 --ref fashion_mnist:test:16 \
  --features "dinov2:$F/dit/checkpoints/$(cat "$F/dit/checkpoints/latest")/model.safetensors" --out "$O/f"
bad "unknown metric 'kd' (did you mean 'kid'?)" -- fid --samples fashion_mnist:train:16 --ref fashion_mnist:test:16 \
  --features "classifier:$F/run" --metrics fid,kd --out "$O/f"

# 2. Validation before the run dir is touched; output paths checked before any work.
bad "already holds a run" -- train $NANO "${TINY[@]}" --run-dir "$F/run"
bad "optim.lr: -1 is outside [0, 10]" -- train $NANO "${TINY[@]}" --set optim.lr=-1 --run-dir "$F/run" --resume auto
bad "model.attention differs from the checkpoint's" -- train configs/fashion_mnist/mha_vit_nano.yaml "${TINY[@]}" --run-dir "$F/run" --resume auto
bad "data.batch_size differs from the checkpoint's (32 -> 64)" -- train $NANO "${TINY[@]}" --set data.batch_size=64 --run-dir "$F/run" --resume auto
bad "not a directory" -- train $NANO "${TINY[@]}" --run-dir "$F/afile/run"
bad "symbolic link" -- train $NANO "${TINY[@]}" --run-dir "$F/loop/run"
if [ "$(id -u)" != 0 ]; then bad "cannot create anything in" -- train $NANO "${TINY[@]}" --run-dir "$F/readonly/run"; fi
bad "cannot create anything in /proc" -- sample --checkpoint "$F/dit" --out /proc/moh_samples
bad "not a directory" -- sample --checkpoint "$F/dit" --out "$F/afile/s"
bad "not a directory" -- fid --samples fashion_mnist:test:16 --ref "$F/ref.npz" --features "classifier:$F/run" --out "$F/afile/rep"
bad "not a directory" -- ref-stats --images fashion_mnist:test:16 --features "classifier:$F/run" --out "$F/afile/r.npz"
bad "not a directory" -- eval $NANO --checkpoint "$F/run" --out "$F/afile/ev"
bad "not a directory" -- export-images --images fashion_mnist:test:4 --out "$F/afile/tree"
bad "is a directory" -- convert --in "$F/run" --out "$F/dir.safetensors"
bad "not a directory" -- forward --model DiT-Pixel/4 --weights "$F/run" --input "$F/ref.npz" --output "$F/afile/o.safetensors"
bad "not a directory" -- extract-latents configs/imagenet/dit_s_2.yaml --out "$F/afile/lat"

# 3./4. Library errors as one line; resume never silently starts over.
bad "checkpoints/latest names '0000999', which is missing" -- train $NANO "${TINY[@]}" --run-dir "$F/run_missing" --resume auto
bad "not a checkpoint of this run" -- train $NANO "${TINY[@]}" --run-dir "$F/run_outside" --resume auto
bad "checkpoints/latest names ''" -- train $NANO "${TINY[@]}" --run-dir "$F/run_empty" --resume auto
bad "holds checkpoints but no checkpoints/latest" -- train $NANO "${TINY[@]}" --run-dir "$F/run_nolatest" --resume auto
bad "is not a CPU generator state" -- train $NANO "${TINY[@]}" --run-dir "$F/run_rng" --resume auto
bad "not a checkpoint or run directory" -- train $NANO "${TINY[@]}" --run-dir "$O/r" --resume "$F/nothing"
bad "header length" -- convert --in "$F/trunc.safetensors" --out "$O/c.safetensors"
bad "header is not valid JSON" -- eval $NANO --weights "$F/garbage.safetensors"
bad "dimension above INT64_MAX" -- convert --in "$F/hugedim.safetensors" --out "$O/c.safetensors"
bad "missing tensor 'patch_embed1.proj.weight'" -- eval $NANO --weights "$F/dit/checkpoints/0000002/model.safetensors"
bad "holds a MoH-ViT-Nano model, not a DiT" -- sample --checkpoint "$F/run" --out "$O/s"
# Dense → MoH conversion (moh convert --to-moh): what the weights, target and flags must be, before any work.
CT=configs/fashion_mnist/continue_vit_nano_75.yaml
bad "the weights are already MoH" -- convert --to-moh $DIT --in "$F/dit" --out "$O/c"
bad "has no place in MoH-ViT-Nano-75" -- convert --to-moh $CT --in "$F/ddense" --out "$O/c"
bad "has no MoH layer to convert into" -- convert --to-moh configs/fashion_mnist/dit_pixel.yaml --in "$F/dit" --out "$O/c"
bad "--shared-heads best: unknown choice" -- convert --to-moh $CT --in "$F/run" --out "$O/c" --shared-heads best
bad "model.shared_heads / model.topk" -- convert --to-moh $CT --in "$F/run" --out "$O/c" --set 'model.shared_heads=[2]' --set 'model.topk=[1]'
bad "exists and is not empty" -- convert --to-moh $CT --in "$F/run" --out "$F"
bad "--calib-batches and --mask-steps must be" -- convert --to-moh $CT --in "$F/run" --out "$O/c" --calib-batches 0
bad "sampling.topk: 5 is outside 0 … 4" -- sample --checkpoint "$F/dit" --topk 5 --out "$O/s"
bad "sampling.topk: -2 is outside [-1, 4096]" -- sample --checkpoint "$F/dit" --topk -2 --out "$O/s"
bad "--head-load: sampling.topk 0 runs the shared heads alone" -- sample --checkpoint "$F/dit" --topk 0 --head-load --out "$O/s"
bad "no routed MoH layer whose K could change" -- sample --checkpoint "$F/ddense" --topk 1 --out "$O/s"
bad 'sampling.sampler: expected one of ddpm|ddim|dpm++2m|euler|heun|dopri5|sde, got "dpm"' -- sample --checkpoint "$F/dit" --sampler dpm --out "$O/s"
bad "sampling.steps: heun takes 2 … 1000 steps" -- sample --checkpoint "$F/dit" --sampler heun --steps 1 --out "$O/s"
bad "\"ddim50\" is not a step count for dpm++2m" -- sample --checkpoint "$F/dit" --sampler dpm++2m --steps ddim50 --out "$O/s"
bad "sampling.cfg_interval: expected [lo, hi] with 0 <= lo <= hi <= 1" -- sample --checkpoint "$F/dit" --cfg-interval 0.8,0.2 --out "$O/s"
bad "sampling.cfg_interval[1]: 1.5 is outside [0, 1]" -- sample --checkpoint "$F/dit" --cfg-interval 0,1.5 --out "$O/s"
bad "sampling.topk_schedule[1]: 9 is outside 0 … 4" -- sample --checkpoint "$F/dit" --set 'sampling.topk_schedule=[2,9]' --out "$O/s"
bad "sampling.guide_topk: sets the unconditional branch of CFG, and guidance is off" -- sample --checkpoint "$F/dit" --guide-topk 1 --cfg-scale 1 --out "$O/s"

# 6. Image loaders count damaged files exactly and obey data.max_bad_fraction in both loaders; class lists match.
IMG=(--set data.dataset=image_folder --set data.batch_size=8 --set train.max_steps=1 --set train.processes=1)
bad "10 of 60 images are unreadable" -- train $NANO "${IMG[@]}" --set data.root="$F/cut" --set data.max_bad_fraction=0.1 --run-dir "$O/r"
bad "unreadable images in an epoch of 60" -- train $NANO "${IMG[@]}" --set data.root="$F/allcut" --set data.loader=stream --set data.max_bad_fraction=0 --run-dir "$O/r"
bad "train and val have different class folders" -- train $NANO "${IMG[@]}" --set data.root="$F/shift" --run-dir "$O/r"
bad "has no 'train' folder" -- train $NANO "${IMG[@]}" --set data.root="$F/nothing" --run-dir "$O/r"
# the training split's info line waits until every input is accepted: a refused run says one line
bad "30 of 30 images are unreadable" -- train $NANO "${IMG[@]}" --set data.root="$F/valcut" --run-dir "$O/r"
bad "the training data has labels up to 9" -- train $NANO "${IMG[@]}" --set data.root="$F/tree" --set model.num_classes=5 --run-dir "$O/r"
bad "truncated PNG" -- fid --samples "$F/samples" --ref "$F/ref.npz" --features "classifier:$F/run"

# 7. Evaluator inputs.
bad "precision/recall need more than k = 3 images" -- fid --samples fashion_mnist:test:3 --ref "$F/ref.npz" --features "classifier:$F/run" --metrics pr
bad "FID needs at least 2 images, got 1" -- fid --samples fashion_mnist:test:1 --ref "$F/ref.npz" --features "classifier:$F/run" --metrics fid
bad "error: npz" -- fid --samples tests/fixtures/npz/truncated.npz --ref "$F/ref.npz" --features "classifier:$F/run"
bad "expected uint8" -- fid --samples tests/fixtures/npz/wrong_dtype.npz --ref "$F/ref.npz" --features "classifier:$F/run"
bad "--batch: must be at least 1" -- fid --samples fashion_mnist:test:8 --ref "$F/ref.npz" --features "classifier:$F/run" --batch 0
bad "unknown metric 'fdi'" -- fid --samples fashion_mnist:test:8 --ref "$F/ref.npz" --features "classifier:$F/run" --metrics fdi
# checks before work: labels that do not fit the network are refused before a feature is extracted (no progress line)
bad "labels (arr_1) range over 0..12, the feature network has 10 classes" -- fid --samples tests/fixtures/npz/labels_out_of_range.npz --ref "$F/ref.npz" --features "classifier:$F/run"
bad "labels (arr_1) range over -1..7" -- fid --samples tests/fixtures/npz/labels_negative.npz --ref "$F/ref.npz" --features "classifier:$F/run"

# Post-hoc EMA (train.phema, moh ema): the profiles' range, snapshots that exist, before any work.
bad "train.phema.sigma_rels: 0.5 is outside" -- config $DIT --set 'train.phema.sigma_rels=[0.5]' --set train.phema.snapshot_every=1
bad "train.phema.sigma_rels: lists 0.1 twice" -- config $DIT --set 'train.phema.sigma_rels=[0.1,0.1]' --set train.phema.snapshot_every=1
bad "train.phema.snapshot_every: must be >= 1" -- config $DIT --set 'train.phema.sigma_rels=[0.05]'
bad "has no post-hoc EMA snapshots" -- ema reconstruct "$F/dit" --sigma-rel 0.07 --out "$O/e"
bad "--sigma-rel: 0.5 is outside" -- ema reconstruct "$F/phema" --sigma-rel 0.5 --out "$O/e"
bad "is before the run's first snapshot (step 2)" -- ema reconstruct "$F/phema" --sigma-rel 0.07 --step 1 --out "$O/e"
bad "exists and is not empty" -- ema reconstruct "$F/phema" --sigma-rel 0.07 --out "$F/run"
bad "unknown subcommand 'recon'" -- ema recon "$F/phema" --sigma-rel 0.07 --out "$O/e"
FIDARGS=(--ref "$F/ref.npz" --features "classifier:$F/run")
bad 'is a dit run, which `-- eval` does not measure' -- ema sweep "$F/phema" --out "$O/s" -- eval
bad '--metric fdi: is not a metric of the reports (one of fid, sfid' -- ema sweep "$F/phema" --metric fdi --out "$O/s" -- fid "${FIDARGS[@]}"
bad '--metric top1: is not computed by `-- fid`' -- ema sweep "$F/phema" --metric top1 --out "$O/s" -- fid "${FIDARGS[@]}"
bad "--metric fid: is not in \`-- eval\`'s report" -- ema sweep "$F/phema" --metric fid --out "$O/s" -- eval
bad '--metric sfid: is not among the metrics `-- fid --metrics` computes (add sfid' -- ema sweep "$F/phema" --metric sfid --out "$O/s" -- fid "${FIDARGS[@]}" --metrics fid
bad "has no post-hoc EMA snapshots" -- ema sweep "$F/run" --out "$O/s" -- eval
bad 'needs `-- eval [FLAGS]`' -- ema sweep "$F/phema" --out "$O/s"
bad 'needs `-- eval [FLAGS]`' -- ema sweep "$F/phema" --out "$O/s" -- sample --steps 4
bad "is not a measuring command" -- ema sweep "$F/phema" --out "$O/s" -- plot
bad "fid --out: is set by the sweep" -- ema sweep "$F/phema" --out "$O/s" -- fid "${FIDARGS[@]}" --out "$O/f"
bad "sample --raw: is set by the sweep" -- ema sweep "$F/phema" --out "$O/s" -- fid "${FIDARGS[@]}" -- sample --raw
bad "unknown flag --cfg-scal" -- ema sweep "$F/phema" --out "$O/s" -- fid "${FIDARGS[@]}" -- sample --cfg-scal 4
bad "--sigma-rels: 0.34 is outside" -- ema sweep "$F/phema" --sigma-rels 0.02:0.5:4 --out "$O/s" -- fid "${FIDARGS[@]}"
bad "--sigma-rels: lists 0.1 twice" -- ema sweep "$F/phema" --sigma-rels 0.1,0.10 --out "$O/s" -- fid "${FIDARGS[@]}"
bad "nope.npz: does not exist" -- ema sweep "$F/phema" --out "$O/s" -- fid --ref "$F/nope.npz" --features "classifier:$F/run"
bad "exists, is not empty and holds no sweep.json" -- ema sweep "$F/phema" --out "$F/run" -- fid "${FIDARGS[@]}"
bad "holds no post-hoc EMA profile for sigma_rel" -- train $DIT --set data.limit_train=32 --set data.batch_size=16 \
  --set train.max_steps=4 --set 'train.phema.sigma_rels=[0.05]' --set train.phema.snapshot_every=2 --resume "$F/dit" --run-dir "$O/r"
# Commands and flags.
bad "unknown command 'trian'" -- trian $NANO
bad "error: moh train" -- train $NANO --no-such-flag
bad "unknown model variant" -- info --model MoH-ViT-Huge
bad "file not found" -- train "$F/none.yaml" --run-dir "$O/r"
bad "--format tif: unknown image format" -- export-images --images fashion_mnist:test:4 --format tif --out "$O/t"
# several machines: the place of this one must make sense before anything starts
bad "elastic ranges are not supported" -- launch --nnodes 1:4 -- train $NANO --run-dir "$O/r"
bad "--node_rank 2: must be in 0 … 1" -- launch --nnodes 2 --node_rank 2 -- train $NANO --run-dir "$O/r"
bad "--nnodes two: must be a number of machines" -- launch --nnodes two -- train $NANO --run-dir "$O/r"
bad "--max-restarts -1: must be in 0..1000" -- launch --max-restarts -1 -- train $NANO --run-dir "$O/r"

# The newer features' inputs: a sigma_rel whose arithmetic leaves the finite range, numbers with trailing text, a named
# pipe where a weights file goes (refused before it is opened: an open would wait for a writer), damaged JSON records
# (a sweep's, a reference's meta, a run's diverged mark), a width that cannot be allocated, a feature network of the
# wrong kind before any point is measured, and the silent cases (a command without its subcommand).
bad "--sigma-rel: 1e-200 is outside" -- ema reconstruct "$F/phema" --sigma-rel 1e-200 --out "$O/e"
bad "--sigma-rel: \"0.07abc\" is not a number" -- ema reconstruct "$F/phema" --sigma-rel 0.07abc --out "$O/e"
bad "--sigma-rels: 1e-200 is outside" -- ema sweep "$F/phema" --sigma-rels 1e-200,0.05 --out "$O/s" -- fid "${FIDARGS[@]}"
bad "train.phema.sigma_rels: 1e-200 is outside" -- config $DIT --set 'train.phema.sigma_rels=[1.0e-200]' \
  --set train.phema.snapshot_every=2
bad "--tol: \"1e-3x\" is not a number" -- compare "$F/run" "$F/run" --tol 1e-3x
bad "no subcommand given" -- ema
bad "no command given" --
bad "not a regular file (a named pipe" -- train configs/fashion_mnist/moh_sit_pixel.yaml --set train.repa.depth=2 \
  --set train.repa.encoder="$F/fifo" --run-dir "$O/r"
bad "train.repa.projector_dim: 1000000000 is outside" -- train configs/fashion_mnist/moh_sit_pixel.yaml \
  --set train.repa.depth=2 --set train.repa.encoder="$F/run" --set train.repa.projector_dim=1000000000 --run-dir "$O/r"
bad "sweep.json: is not valid JSON" -- ema sweep "$F/phema" --sigma-rels 0.05 --out "$F/sweep_damaged" -- fid \
  "${FIDARGS[@]}"
bad "member meta: is not the statistics' record" -- fid --samples fashion_mnist:test:8 --ref "$F/meta_list.npz" \
  --features "classifier:$F/run"
bad "diverged.json: is not valid JSON" -- train $NANO "${TINY[@]}" --run-dir "$F/run_diverged" --resume auto
bad "holds a MoH-DiT-Pixel/4-75 model, not a classifier" -- ema sweep "$F/phema" --sigma-rels 0.05 --out "$O/s" -- fid \
  --ref "$F/ref.npz" --features "classifier:$F/dit"
bad_env() {  # bad_env PATTERN VAR=VALUE... -- ARGS: as bad, with these environment variables set
  local pattern=$1
  shift
  while [ "$1" != "--" ]; do BAD_ENV+=("$1"); shift; done
  bad "$pattern" "$@"
  BAD_ENV=()
}
bad_env "environment RANK: 5 is not below WORLD_SIZE 1" RANK=5 WORLD_SIZE=1 -- config $NANO
# A rank that is not its machine's first, failing before it meets the others, still says why (with its rank).
bad_env "error: rank 1: config" RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 -- config "$F/syntax.yaml"

# ---- the derived corpus (tests/bad_input_corpus.py): every config key, every flag of the main commands, every
# environment variable, each given what it must refuse. A case passes with exit 2, one error line naming one of its
# |-separated patterns, nothing created and no fixture changed.
corpus=0
while IFS=$'\t' read -r patterns envv rest; do
  IFS=$'\t' read -r -a args <<<"$rest"
  corpus=$((corpus + 1))
  if [ "$envv" = - ]; then zmoh "$tmp/o" "$tmp/e" "${args[@]}"; else
    timeout 300 env "$envv" "$MOH" "${args[@]}" >"$tmp/o" 2>"$tmp/e"; fi
  rc=$? why="" found=0
  [ "$rc" = 2 ] || why="exit $rc"
  [ "$(grep -c '' "$tmp/e")" = 1 ] && head -1 "$tmp/e" | grep -q '^error: ' || why="$why; stderr is not one error line"
  IFS='|' read -r -a alts <<<"$patterns"
  for a in "${alts[@]}"; do grep -qF -- "$a" "$tmp/e" && found=1; done
  [ $found = 1 ] || why="$why; names none of '$patterns'"
  [ -z "$(ls -A "$O")" ] || why="$why; created $(ls -A "$O" | head -3 | tr '\n' ' ')"
  [ "$(snapshot)" = "$reference" ] || why="$why; a pre-existing file changed"
  if [ -z "$why" ]; then pass=$((pass + 1)); continue; fi
  echo "FAIL: ${envv/#-/} moh ${args[*]} -> ${why#; }"; sed 's/^/  | /' "$tmp/e" | head -4
  fails=$((fails + 1))
  rm -rf "${O:?}"/* && reference=$(snapshot)
done < <(python3 tests/bad_input_corpus.py "$MOH" "$F" "$O")
echo "derived corpus: $corpus cases"
zygote_stop
fails=$((fails + ZYG_DIFFERED))

echo "$pass passed, $fails failed"
[ "$pass" -ge 60 ] || { echo "FAIL: the corpus must hold at least 60 cases"; exit 1; }
[ "$corpus" -ge 250 ] || { echo "FAIL: the derived corpus must hold at least 250 cases"; exit 1; }
[ "$fails" = 0 ]
