#!/usr/bin/env bash
# The toolkit against the real Python packages (pinned in scripts/requirements-torch2.txt, from the project venv; no
# network): one case per ctest (pyref_forward, pyref_vae, pyref_safetensors, pyref_fid).
#   forward      DiT-S/2, MoH-DiT-S/2-75, MoH-DiT-Pixel/4-75, MoH-ViT-Nano-50, TransNeXt-Micro and the FID Inception:
#                `moh forward` on weights written by this torch (tests/fixtures/gen/make_torch.py and
#                transnext_torch.py re-run now) vs that torch's outputs, fp32, max rel ≤ 1e-5; the query_norm router
#                vs a plain PyTorch version of the MoH-LLaMA3 rule (tests/fixtures/gen/query_norm_ref.py);
#                our torch.save reader on this torch's zip and legacy files, bit-exact
#   vae          diffusers.AutoencoderKL (sd-vae-ft-ema and VA-VAE f16d32 configs, VA-VAE's also at other widths; random
#                weights) vs `moh forward
#                --model sd-vae / vavae-f16d32` (VA-VAE also from its LDM-named torch.save checkpoint, the naming
#                checked by diffusers' LDM converter): posterior mean, log-variance and decoded image, max rel ≤ 1e-5
#   safetensors  files written by the safetensors package (every dtype this LibTorch has, special values, empty and 0-d
#                tensors, metadata) read by us and written back bit-exactly; every file a training run writes (model,
#                ema, optimizer, rng) and `moh convert` output read by safetensors.torch.load_file, weights loaded with
#                load_state_dict(strict=True) into the reference DiT
#   fid          pytorch-fid and torch-fidelity (FID, sFID, IS, P/R, KID) on the features `moh fid --save-features`
#                stored (tests/eval/ref_fid.py)
#   solvers      diffusers' DPMSolverMultistepScheduler / EulerDiscreteScheduler and a plain Karras Algorithm 1 (Heun)
#                (tests/diffusion/ref_solvers.py) vs our ODE samplers, step by step on a closed-form model and at the
#                end of CFG / guidance-interval chains of a random DiT-Pixel/4, max rel ≤ 1e-5 (the GoogleTest
#                SolverReference.*; for this case the second argument is the moh_tests_models binary)
#   flow         flow matching (tests/diffusion/ref_flow.py): the SiT formulas written out from the paper (losses,
#                velocity and score from every prediction, both paths; fp64, ≤ 1e-10), the Euler and Heun chains
#                cross-checked there against diffusers' FlowMatchEuler/HeunDiscreteScheduler, torchdiffeq's dopri5
#                (same number of evaluations), SiT's SDE on given draws, and euler/heun/dopri5 on a random
#                DiT-Pixel/4 with CFG and a guidance interval (fp64) vs our chains, ≤ 1e-5 (the GoogleTest
#                FlowReference.*; the second argument is the moh_tests_models binary)
#   repa         REPA (tests/diffusion/ref_repa.py): the projection loss of REPA's loss.py written out in Python (two
#                encoders, a zero row) and timm's vit_base_patch14_dinov2 on random weights — loaded from its
#                safetensors file and from an official-style torch.save file with mask_token — at 98 and 224 px
#                (positions resampled as timm, and as facebookresearch/dinov2 for the official file), REPA's
#                preprocessing + DINOv2 on grey DiT inputs, and EDM2's FD-DINOv2 detector (written out) against
#                `--features dinov2:`'s network, ≤ 1e-5 (the GoogleTest RepaReference.*; the second argument is the
#                moh_tests_models binary)
#   tensorboard  a training run's TensorBoard event files (log.tensorboard) read by the tensorboard package's
#                EventAccumulator against its metrics.jsonl, killed -9 (and with the last record cut short), then
#                resumed: each step once, the head-load heat maps and the config text (tests/core/ref_tensorboard.py)
# usage: pyref_test.sh CASE path/to/moh repo_root path/to/python
set -u
CASE=$1 MOH=$2 ROOT=$3 PY=$4
cd "$ROOT" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

run() {  # run CMD...: echo it, count a failure when it exits non-zero
  echo "+ ${*/#$ROOT\//}"
  "$@" || { echo "FAIL (exit $?): $*"; fails=$((fails + 1)); }
}
compare() { run "$PY" scripts/compare_safetensors.py "$1" "$2" --rtol 1e-5; }
# ref DIR SCRIPT ARGS...: runs the Python reference SCRIPT, which writes DIR from nothing but its seeded arguments.
# scripts/test.sh tests two builds against one venv and gives both a MOH_PYREF_CACHE directory (removed when it ends):
# the second build then reads the first one's DIR instead of computing the same references again (hard links: the
# references are only read, outputs go to new files).
ref() {
  local dir=$1 key
  shift
  key=$( (printf '%s\n' "$CASE" "${@//"$tmp"/TMP}"; cat "$1") | sha256sum | cut -c1-16)
  if [ -n "${MOH_PYREF_CACHE:-}" ] && [ -d "$MOH_PYREF_CACHE/$key" ]; then
    echo "+ ${*/#$ROOT\//} (this test.sh run's result, $MOH_PYREF_CACHE/$key)"
    cp -al "$MOH_PYREF_CACHE/$key" "$dir" 2>/dev/null || cp -r "$MOH_PYREF_CACHE/$key" "$dir"
    return
  fi
  local before=$fails
  run "$PY" "$@"
  if [ -n "${MOH_PYREF_CACHE:-}" ] && [ $fails = "$before" ] && [ -d "$dir" ]; then
    { cp -al "$dir" "$MOH_PYREF_CACHE/$key.$$" 2>/dev/null || cp -r "$dir" "$MOH_PYREF_CACHE/$key.$$"; } && mv -T "$MOH_PYREF_CACHE/$key.$$" "$MOH_PYREF_CACHE/$key" 2>/dev/null
    rm -rf "$MOH_PYREF_CACHE/$key.$$"
  fi
}
train_quiet() {  # train_quiet RUN_DIR CONFIG ARGS...: a few fp32 steps, output only on failure
  local dir=$1 config=$2
  shift 2
  "$MOH" train "$config" --run-dir "$dir" --set train.precision=fp32 "$@" >"$tmp/train.log" 2>&1 ||
    { echo "FAIL: moh train $config $*"; tail -5 "$tmp/train.log"; fails=$((fails + 1)); }
}

case "$CASE" in
forward)
  ref "$tmp/small" tests/fixtures/gen/make_torch.py "$tmp/small"
  ref "$tmp/large" tests/fixtures/gen/make_torch.py "$tmp/large" --large
  run "$MOH" forward --model MoH-DiT-Pixel/4-75 --weights "$tmp/small/moh_dit_pixel_fp16.pt" \
    --input "$tmp/small/moh_dit_pixel_io.safetensors" --output "$tmp/pixel.safetensors"
  compare "$tmp/small/moh_dit_pixel_io.safetensors" "$tmp/pixel.safetensors"
  run "$MOH" forward --model DiT-S/2 --weights "$tmp/large/dit_s2.pt" --input "$tmp/large/dit_s2_io.safetensors" \
    --output "$tmp/dit.safetensors"
  compare "$tmp/large/dit_s2_io.safetensors" "$tmp/dit.safetensors"
  run "$MOH" forward --model MoH-DiT-S/2-75 --weights "$tmp/large/moh_dit_s2_75_train.pt" --weights-key ema \
    --input "$tmp/large/moh_dit_s2_75_io.safetensors" --output "$tmp/moh.safetensors"
  compare "$tmp/large/moh_dit_s2_75_io.safetensors" "$tmp/moh.safetensors"
  # TransNeXt / MoH-ViT against the Python port written from the specs (official keys, native unfold path): the
  # MoH-ViT-Nano-50 (32 px: all-shared, h_s = 1 and two-stage layers) and TransNeXt-Micro (64 px, MHA, patch 4)
  ref "$tmp/vit" tests/fixtures/gen/transnext_torch.py "$tmp/vit"
  for pair in MoH-ViT-Nano-50:moh_vit_nano_50 TransNeXt-Micro:transnext_micro; do
    run "$MOH" forward --model "${pair%%:*}" --weights "$tmp/vit/${pair#*:}.safetensors" \
      --input "$tmp/vit/${pair#*:}_io.safetensors" --output "$tmp/vit/${pair#*:}_out.safetensors"
    compare "$tmp/vit/${pair#*:}_io.safetensors" "$tmp/vit/${pair#*:}_out.safetensors"
  done
  # The parameter-free query-norm router against a plain PyTorch version of the MoH-LLaMA3 rule (a dense DiT-Pixel/4
  # run as MoH-DiT-Pixel/4-75: 4 shared + top-2 of 4 routed heads)
  ref "$tmp/qn" tests/fixtures/gen/query_norm_ref.py "$tmp/qn"
  run "$MOH" forward --model MoH-DiT-Pixel/4-75 --router query_norm --weights "$tmp/qn/dense_dit_pixel.safetensors" \
    --input "$tmp/qn/query_norm_io.safetensors" --output "$tmp/qn/out.safetensors"
  compare "$tmp/qn/query_norm_io.safetensors" "$tmp/qn/out.safetensors"
  run "$MOH" forward --model fid-inception --weights "$tmp/large/inception_legacy.pth" \
    --input "$tmp/large/inception_io.safetensors" --output "$tmp/inception.safetensors"
  compare "$tmp/large/inception_io.safetensors" "$tmp/inception.safetensors"
  for fmt in zip legacy; do
    run "$MOH" convert --in "$tmp/small/mixed_$fmt.pt" --out "$tmp/mixed_$fmt.safetensors"
    run "$PY" tests/core/ref_safetensors.py torch-load "$tmp/small/mixed_$fmt.pt" "$tmp/mixed_$fmt.safetensors"
  done
  ;;
vae)
  # The SD-VAE from diffusers-named safetensors; VA-VAE from the same and from its LDM-named torch.save checkpoint;
  # VA-VAE's layout at other widths, read from the LDM-named file (tests/scale_check.sh loads an SD layout at other
  # widths that diffusers wrote).
  ref "$tmp/vae" tests/diffusion/ref_sd_vae.py "$tmp/vae"
  ref "$tmp/vavae" tests/diffusion/ref_sd_vae.py "$tmp/vavae" --vavae
  ref "$tmp/vasmall" tests/diffusion/ref_sd_vae.py "$tmp/vasmall" --vavae --widths 32,32,64,64,96
  ref_torch=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
  our_torch=$("$MOH" --version | grep -o 'LibTorch [0-9.]*' | cut -d' ' -f2)
  for c in "sd-vae vae vae.safetensors" "vavae-f16d32 vavae vae.safetensors" "vavae-f16d32 vavae vae_ldm.pt" \
    "vavae-f16d32 vasmall vae_ldm.pt"; do
    read -r model dir weights <<<"$c"
    key=()
    [[ $weights == *.pt ]] && key=(--weights-key state_dict)
    run "$MOH" forward --model "$model" --weights "$tmp/$dir/$weights" "${key[@]}" --input "$tmp/$dir/io.safetensors" \
      --output "$tmp/$dir/out_${weights%%.*}.safetensors"
    # Same LibTorch as the reference torch (the pip build): ≤ 1e-5 (measured: bit-identical). Another LibTorch
    # (Debian's 1.13): within twice diffusers' own fp32-vs-fp64 error at this input (the decoder amplifies kernel
    # rounding to ~1.5e-5 of max |recon|), and never looser than 1e-5 is asked of the same version.
    rtol=1e-5
    if [ "$ref_torch" != "$our_torch" ]; then
      rtol=$("$PY" -c "import json; f = json.load(open('$tmp/$dir/fp32_noise_floor.json')); print('%.3g' % max(1e-5, 2 * max(f.values())))")
      echo "$model, LibTorch $our_torch vs torch $ref_torch: diffusers' fp32 noise floor $(cat "$tmp/$dir/fp32_noise_floor.json"); rtol $rtol"
    fi
    run "$PY" scripts/compare_safetensors.py "$tmp/$dir/io.safetensors" "$tmp/$dir/out_${weights%%.*}.safetensors" --rtol "$rtol"
  done
  ;;
safetensors)
  # Float8 needs LibTorch ≥ 2.1 and uint16/32/64 ≥ 2.3; an older LibTorch must refuse them with a clean error.
  version=$("$MOH" --version | grep -o 'LibTorch [0-9]*\.[0-9]*' | head -1 | cut -d' ' -f2)
  run "$PY" tests/core/ref_safetensors.py write "$tmp/all.safetensors"
  run "$PY" tests/core/ref_safetensors.py write "$tmp/basic.safetensors" --basic
  if "$PY" -c "import sys; sys.exit(0 if tuple(map(int, '$version'.split('.'))) >= (2, 3) else 1)"; then
    run "$MOH" convert --in "$tmp/all.safetensors" --out "$tmp/all_ours.safetensors"
    run "$PY" tests/core/ref_safetensors.py same "$tmp/all.safetensors" "$tmp/all_ours.safetensors"
  else
    "$MOH" convert --in "$tmp/all.safetensors" --out "$tmp/all_ours.safetensors" >"$tmp/out" 2>&1
    rc=$?
    if [ $rc = 2 ] && grep -q "^error: .*unsupported dtype F8_E4M3.*LibTorch" "$tmp/out"; then
      echo "LibTorch $version: F8/U16-U64 refused cleanly: $(cat "$tmp/out")"
    else
      echo "FAIL: LibTorch $version: convert of F8/U16-U64 tensors: exit $rc: $(cat "$tmp/out")"; fails=$((fails + 1))
    fi
  fi
  run "$MOH" convert --in "$tmp/basic.safetensors" --out "$tmp/basic_ours.safetensors"
  run "$PY" tests/core/ref_safetensors.py same "$tmp/basic.safetensors" "$tmp/basic_ours.safetensors"
  train_quiet "$tmp/dit" configs/fashion_mnist/moh_dit_pixel.yaml --set train.max_steps=3 --set data.batch_size=8 \
    --set data.limit_train=64 --set train.ema_decay=0.99
  run "$MOH" convert --in "$tmp/dit" --key ema --out "$tmp/conv/converted.safetensors"
  ckpt=$(ls -d "$tmp"/dit/checkpoints/[0-9]* | tail -1)
  run "$PY" tests/core/ref_safetensors.py strict MoH-DiT-Pixel/4-75 "$ckpt"/model.safetensors \
    "$ckpt"/ema.safetensors "$ckpt"/optimizer.safetensors "$ckpt"/rng.safetensors "$tmp/conv/converted.safetensors"
  ;;
fid)
  train_quiet "$tmp/cls" configs/fashion_mnist/moh_vit_nano.yaml --set train.max_steps=20 --set data.limit_train=640 \
    --set data.limit_val=100
  common=(--samples fashion_mnist:train:1500 --ref fashion_mnist:test:1200 --features "classifier:$tmp/cls")
  run "$MOH" fid "${common[@]}" --save-features "$tmp/features.npz" --out "$tmp/adm"
  run "$MOH" fid "${common[@]}" --metrics is --is-mode fidelity --out "$tmp/fidelity"
  run "$PY" tests/eval/ref_fid.py "$tmp/features.npz" "$tmp/adm/report.json" "$tmp/fidelity/report.json"
  ;;
solvers | flow | repa)
  script=ref_solvers.py filter='SolverReference.*' want=1 var=MOH_SOLVER_REF
  if [ "$CASE" = flow ]; then script=ref_flow.py filter='FlowReference.*' want=3 var=MOH_FLOW_REF; fi
  if [ "$CASE" = repa ]; then script=ref_repa.py filter='RepaReference.*' want=3 var=MOH_REPA_REF; fi
  ref "$tmp/ref" tests/diffusion/$script "$tmp/ref"
  echo "+ $var=... moh_tests_models --gtest_filter='$filter'"
  env "$var=$tmp/ref" "$MOH" --gtest_filter="$filter" >"$tmp/gtest.log" 2>&1
  rc=$?
  grep "^max rel" "$tmp/gtest.log"
  tail -2 "$tmp/gtest.log"
  # Skipped would also exit 0: every test must have run and passed.
  if [ $rc != 0 ] || ! grep -q "^\[  PASSED  \] $want test" "$tmp/gtest.log" || grep -q SKIPPED "$tmp/gtest.log"; then
    grep -B2 -A3 "Failure\|SKIPPED" "$tmp/gtest.log" | head -40
    echo "FAIL: $filter (exit $rc)"; fails=$((fails + 1))
  fi
  ;;
tensorboard)
  # A classifier run with log.tensorboard killed (-9) between checkpoints, read back by the tensorboard package
  # (also with its last record cut short), then resumed: the steps logged past the checkpoint come again, and
  # TensorBoard must show each once (tests/core/ref_tensorboard.py).
  run_dir=$tmp/tbrun
  set_args=(--set log.tensorboard=true --set data.limit_train=1024 --set data.limit_val=256 --set train.epochs=3
    --set train.log_every_steps=1 --set train.ckpt_every_steps=4 --set train.precision=fp32)
  echo "+ moh train configs/fashion_mnist/moh_vit_nano.yaml ${set_args[*]} (killed -9 after step 10)"
  "$MOH" train configs/fashion_mnist/moh_vit_nano.yaml --run-dir "$run_dir" "${set_args[@]}" >"$tmp/train.log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do  # up to 120 s
    grep -q '"step":1[0-9]' "$run_dir/metrics.jsonl" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  ckpt=$("$PY" -c 'import json, sys; d = sys.argv[1] + "/checkpoints/"; print(json.load(open(d + open(d + "latest").read().strip() + "/trainer_state.json"))["step"])' "$run_dir" 2>/dev/null)
  last=$("$PY" -c 'import json, sys; print(max(json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()))' "$run_dir/metrics.jsonl" 2>/dev/null)
  echo "killed at step ${last:-?}, latest checkpoint at step ${ckpt:-?}"
  if [ -z "$ckpt" ] || [ -z "$last" ] || [ "$last" -le "$ckpt" ]; then
    echo "FAIL: the kill must fall after a checkpoint and after later steps were logged"; tail -3 "$tmp/train.log"
    fails=$((fails + 1))
  fi
  run "$PY" tests/core/ref_tensorboard.py "$run_dir" --expect-files 1
  run "$PY" tests/core/ref_tensorboard.py "$run_dir" --cut
  train_quiet "$run_dir" configs/fashion_mnist/moh_vit_nano.yaml "${set_args[@]}" --resume auto
  run "$PY" tests/core/ref_tensorboard.py "$run_dir" --expect-files 2
  # a DiT run's checkpoint sampled: its grid.png into the run's tb/ at the checkpoint's step
  train_quiet "$tmp/tbdit" configs/fashion_mnist/moh_dit_pixel.yaml --set log.tensorboard=true \
    --set data.limit_train=64 --set data.batch_size=16 --set train.max_steps=3
  run "$MOH" sample --checkpoint "$tmp/tbdit" --set sampling.per_class=2 --set sampling.steps=ddim3 --out "$tmp/tbs"
  run "$PY" tests/core/ref_tensorboard.py "$tmp/tbdit" --expect-files 2 --grid "$tmp/tbs/grid.png" --grid-step 3
  # a run directory the grid cannot be added to (tb/ replaced by a file): the samples stand, one warning line
  rm -rf "$tmp/tbdit/tb" && echo "a file" >"$tmp/tbdit/tb"
  "$MOH" sample --checkpoint "$tmp/tbdit" --set sampling.per_class=2 --set sampling.steps=ddim3 --out "$tmp/tbs2" \
    >"$tmp/s2.log" 2>&1
  rc=$?
  echo "+ moh sample (tb/ a file): exit $rc, $(grep -c '^warning: the grid was not added' "$tmp/s2.log") warning"
  if [ $rc != 0 ] || [ ! -f "$tmp/tbs2/samples.npz" ] || [ "$(grep -c '^warning: the grid was not added' "$tmp/s2.log")" != 1 ]; then
    echo "FAIL: sampling into a run whose tb/ is a file"; tail -3 "$tmp/s2.log"; fails=$((fails + 1))
  fi
  ;;
*)
  echo "unknown case $CASE"; exit 2 ;;
esac
if [ $fails -gt 0 ]; then echo "pyref $CASE: $fails failure(s)"; exit 1; fi
echo "pyref $CASE: all checks passed"
