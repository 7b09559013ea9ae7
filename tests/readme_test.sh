#!/usr/bin/env bash
# Runs every `build/moh ...` command of the bash blocks of README.md and docs/COMMANDS.md, in order, in a scratch
# directory, so that a renamed subcommand, flag, config key or file breaks this test. The commands run as written, with only size
# reductions appended or substituted (a few steps, a few images):
#   - on the embedded dataset and on models the commands build themselves, each must succeed (exit 0);
#   - those needing files this machine cannot have (ImageNet, sd-vae-ft-ema, DiT-XL-2-256x256.pt) must fail as a user
#     error about that missing input: exit 2 and one `error: ...` line naming it.
# usage: readme_test.sh MOH REPO
set -uo pipefail
MOH=$(realpath "$1")
REPO=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
ln -s "$REPO/configs" configs
export OMP_NUM_THREADS=1

# Commands: the lines of ```bash blocks, continuation lines joined, comments dropped, those starting with build/moh;
# a command both documents show runs once (the second would find its run directory taken).
mapfile -t CMDS < <(awk '
  /^```bash/ { inb = 1; next }
  /^```/ { inb = 0; next }
  inb {
    line = $0
    sub(/[ \t]+#.*$/, "", line)
    if (line ~ /^#/) next
    if (line ~ /\\$/) { sub(/\\$/, "", line); acc = acc line; next }
    line = acc line; acc = ""
    gsub(/[ \t]+/, " ", line)
    if (line ~ /^build\/moh / && !seen[line]++) print line
  }' "$REPO/README.md" "$REPO/docs/COMMANDS.md")

fails=0 ran=0 refused=0
for cmd in "${CMDS[@]}"; do
  sub=$(echo "$cmd" | awk '{ print ($2 == "launch") ? $6 : $2 }')
  args=${cmd#build/moh }
  case "$sub" in
    train) args="$args --set train.max_steps=2 --set data.limit_train=128 --set data.limit_val=64" ;;
    eval) args="$args --set data.limit_val=64" ;;
    sample)  # a 2-step chain: a respacing for DDPM / DDIM, a step count for the ODE and SDE solvers; dopri5 loose
      case "$args" in
        *"--sampler dpm++2m"* | *"--sampler euler"* | *"--sampler heun"* | *"--sampler sde"*)
          args="$args --num-samples 10 --steps 2" ;;
        *"--sampler dopri5"*) args="$args --num-samples 10 --set sampling.rtol=0.1 --set sampling.atol=0.01" ;;
        *) args="$args --num-samples 10 --steps ddim2" ;;
      esac ;;
    export-images | ref-stats) args=$(echo "$args" | sed -E 's/fashion_mnist:train( |$)/fashion_mnist:train:200\1/; s/fashion_mnist:test( |$)/fashion_mnist:test:100\1/') ;;
    bench)
      case "$args" in
        "bench attention"*) args="$args --seqs 196 --dims 128:4 --runs 1" ;;
        "bench vit-attention"*) args=$(echo "$args" | sed -E 's/--batch [0-9]+/--batch 1/')" --runs 1 --warmup 0" ;;
        "bench data"*) args=$(echo "$args" | sed -E 's/--images [0-9]+/--images 64/; s/--python [^ ]+//')" --batch 16 --rounds 1" ;;
        "bench sample"*) args=$(echo "$args" | sed -E 's/--chain ddim[0-9]+/--chain ddim2/')" --steps 1 --warmup 0" ;;
        *) args="$args --steps 1 --warmup 0" ;;
      esac ;;
  esac
  # Inputs that cannot exist here: ImageNet trees, the SD-VAE, official checkpoints.
  missing=""
  case "$cmd" in
    *imagenet* | *DiT-XL-2-256x256.pt*) missing=1 ;;
  esac
  # shellcheck disable=SC2086
  "$MOH" $args >out.txt 2>err.txt </dev/null
  rc=$?
  if [ -z "$missing" ]; then
    ran=$((ran + 1))
    if [ $rc -ne 0 ]; then
      echo "FAIL (exit $rc): $cmd"; tail -5 out.txt; tail -3 err.txt; fails=$((fails + 1))
    else
      echo "ok: $cmd"
    fi
  else
    refused=$((refused + 1))
    lines=$(grep -c . err.txt)
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -q '^error: .*\(imagenet\|weights\|DiT-XL-2-256x256\|in\.safetensors\|latents\)' err.txt; then
      echo "ok (refused: $(cat err.txt)): $cmd"
    else
      echo "FAIL (expected exit 2 + one error line about the missing input, got exit $rc, $lines lines): $cmd"
      head -3 err.txt; fails=$((fails + 1))
    fi
  fi
done
echo "README + COMMANDS commands: ${#CMDS[@]} ($ran run, $refused refused for missing inputs), $fails failed"
[ ${#CMDS[@]} -ge 20 ] || { echo "FAIL: only ${#CMDS[@]} commands found in README.md and docs/COMMANDS.md"; exit 1; }
[ $fails -eq 0 ]
