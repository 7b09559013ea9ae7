#!/usr/bin/env bash
# Builds and checks the toolkit on a bare GPU machine: PyTorch (its LibTorch, CUDA and NCCL), nvcc, CMake, ninja and a
# C++ compiler present, nothing else, no network. What it lacks comes in the kit folder of scripts/gpu_kit.sh.
#   usage: scripts/gpu_check.sh [KIT_DIR] [REPORT_DIR]      (defaults: .gpu_kit, gpu_report)
#   MOH_GPU_STAGES   which stages, in order (default: "env build tests cli bench"); each appends to the report
#   MOH_GPU_PYTHON   the Python that holds torch (default python3)
#   MOH_GPU_JOBS     build parallelism (default: nproc)
#   MOH_GPU_TARGETS  build only these targets (default: all)
#   MOH_GPU_TEST_DEVICE  MOH_TEST_DEVICE of the tests stage (default cuda; cpu to rehearse on a CPU machine)
#   MOH_GPU_CTEST_EXCLUDE  ctest -E regex of the tests stage (default: format and the long command-line scripts)
#   MOH_GPU_CTEST_INCLUDE  ctest -R regex of the tests stage (default: every test not excluded)
#   MOH_GPU_BENCH  which benchmarks of the bench stage (default: "train sample attention"; also: step router sweep
#                  graphs official precision); MOH_GPU_OFFICIAL_RUNS (MODEL:BATCH ...), MOH_GPU_GRAPH_MODES
#                  (off auto) and MOH_GPU_GRAPH_CHAINS (ddpm dpm) narrow official and graphs
# Stages: env (GPU, driver, torch, compiler), build (configure against the local torch with the kit's prefix, OpenCV
# off, NCCL on, the CUDA kernels for the GPU seen), tests (ctest with MOH_TEST_DEVICE=cuda), cli (train, resume,
# sample and fid through the moh binary on the GPU), bench (training step bf16 of DiT-XL/2 and MoH-DiT-XL/2-90 with MFU
# against 989 TFLOP/s, sampling images/s, MoH-ViT attention dense vs sparse and window kernels vs im2col).
# Writes REPORT_DIR/report.json and report.md (scripts/gpu_report.py); logs beside them. A failing stage is recorded
# and the next one still runs (exit 1 at the end); a stage that cannot start (no GPU, no torch, no kit) exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
KIT=$(realpath -m "${1:-.gpu_kit}")
REPORT=$(realpath -m "${2:-gpu_report}")
PY=${MOH_GPU_PYTHON:-python3}
STAGES=${MOH_GPU_STAGES:-env build tests cli bench}
JOBS=${MOH_GPU_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}  # GNU nproc honours OMP_NUM_THREADS
BUILD=$PWD/build-gpu
PREFIX=$KIT/prefix
mkdir -p "$REPORT"
RESULTS=$REPORT/results.jsonl
: >"$RESULTS"
failed=0

die2() { echo "error: gpu_check: $1" >&2; exit 2; }
# record STAGE KEY VALUE: one JSON line of the report (VALUE is JSON: a number, true/false or a quoted string).
record() { printf '{"stage":"%s","key":"%s","value":%s}\n' "$1" "$2" "$3" >>"$RESULTS"; }
jstr() { "$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
# run_logged STAGE NAME CMD...: runs CMD with its output in REPORT/STAGE_NAME.log; records ok/seconds.
run_logged() {
  local stage=$1 name=$2 t0 rc
  shift 2
  t0=$(date +%s%N)
  "$@" >"$REPORT/${stage}_${name}.log" 2>&1
  rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  record "$stage" "$name.seconds" "$((ms / 1000)).$((ms % 1000 / 100))"
  record "$stage" "$name.ok" "$([ $rc = 0 ] && echo true || echo false)"
  [ $rc = 0 ] || { failed=1; echo "gpu_check: $stage/$name failed (exit $rc): $REPORT/${stage}_${name}.log" >&2; }
  return $rc
}

stage_env() {
  command -v nvidia-smi >/dev/null || die2 "no nvidia-smi: not a GPU machine"
  "$PY" -c 'import torch' 2>/dev/null || die2 "$PY has no torch (set MOH_GPU_PYTHON)"
  record env gpu "$(jstr "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)")"
  record env torch "$(jstr "$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')")"
  record env compiler "$(jstr "$(c++ --version | head -n1)")"
  record env cmake "$(jstr "$(cmake --version | head -n1)")"
  record env nvcc "$(jstr "$(nvcc --version | tail -n1)")"
  record env os "$(jstr "$(. /etc/os-release && echo "$PRETTY_NAME")")"
}

# The kit's .deb files unpacked into PREFIX (never into /), with its absolute symlinks (libz.so -> /lib/...) pointed
# at what this machine has; Fashion-MNIST where the toolkit looks for it, if absent.
unpack_kit() {
  [ -f "$KIT/MANIFEST" ] || die2 "$KIT: no kit here (make one with scripts/gpu_kit.sh on a project machine)"
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  local f l t
  for f in "$KIT"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$PREFIX"
    else (cd "$PREFIX" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x -J 2>/dev/null ||
          ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x); fi
  done
  find "$PREFIX" -type l | while read -r l; do
    t=$(readlink "$l")
    case "$t" in /*)
      if [ -e "$PREFIX$t" ]; then ln -sf "$PREFIX$t" "$l"; else
        t=$(ldconfig -p | awk -v n="$(basename "$l").1" '$1 == n {print $NF; exit}')
        [ -n "$t" ] && ln -sf "$t" "$l"
      fi ;; esac
  done
  if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
    mkdir -p /usr/share/datasets && cp -r "$PREFIX/usr/share/datasets/fashion-mnist" /usr/share/datasets/
  fi
}

stage_build() {
  unpack_kit
  local torch_cmake nccl_inc
  torch_cmake=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  nccl_inc=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)
  export CPATH=${nccl_inc}${CPATH:+:$CPATH}
  run_logged build configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_cmake/Torch" \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DMOH_WITH_OPENCV=OFF -DMOH_WITH_NCCL=ON -DMOH_TORCH_OPS=ON || return
  local targets=()
  for t in ${MOH_GPU_TARGETS:-}; do targets+=(--target "$t"); done
  run_logged build compile cmake --build "$BUILD" -j"$JOBS" "${targets[@]}" -- -k 0 || return  # every error at once
  record build moh "$(jstr "$("$BUILD/moh" --version 2>&1 | head -n1)")"
}

stage_tests() {
  [ -x "$BUILD/moh" ] || { record tests skipped '"no build"'; failed=1; return; }
  # Left out by default: format (needs clang-format) and the long command-line scripts, which run the CPU path in CI
  # and take 15+ minutes one after another (cli, bad_input, readme, demo_quick, sampling, scale_check; a build without
  # OpenCV does not register them); the cli stage below runs the binary on the GPU instead. ddp and multihost stay.
  local exclude=${MOH_GPU_CTEST_EXCLUDE-'^(format|cli|bad_input|readme|demo_quick|sampling|scale_check)$'}
  local include=${MOH_GPU_CTEST_INCLUDE:-}
  record tests excluded "$(jstr "$exclude")"
  record tests included "$(jstr "${include:-all}")"
  # A few LibTorch threads per test: ctest runs 8 at once.
  run_logged tests ctest env OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" MOH_TEST_DEVICE="${MOH_GPU_TEST_DEVICE:-cuda}" \
    ctest --test-dir "$BUILD" --output-on-failure -j8 --timeout 300 ${exclude:+-E "$exclude"} ${include:+-R "$include"} --output-junit "$REPORT/ctest.xml"
  "$PY" - "$REPORT/ctest.xml" >>"$RESULTS" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = root.findall('.//testcase')
st = lambda c: c.get('status') or ('fail' if c.find('failure') is not None else 'run')
for name, n in (('passed', sum(st(c) in ('run', 'pass') for c in cases)), ('failed', [c.get('name') for c in cases if st(c) == 'fail']),
                ('skipped', [c.get('name') for c in cases if st(c) in ('notrun', 'disabled')])):
    print(json.dumps({'stage': 'tests', 'key': name, 'value': n}))
EOF
}

stage_cli() {
  [ -x "$BUILD/moh" ] || { record cli skipped '"no build"'; failed=1; return; }
  run_logged cli smoke bash scripts/gpu_cli_check.sh "$BUILD/moh" "$REPORT/cli_runs" "$RESULTS"
}

stage_bench() {
  [ -x "$BUILD/moh" ] || { record bench skipped '"no build"'; failed=1; return; }
  local m what dt b g
  for what in ${MOH_GPU_BENCH:-train sample attention}; do
    case "$what" in
      train | sample) for m in DiT-XL/2 MoH-DiT-XL/2-90; do "bench_$what" "$m"; done ;;
      attention) for dt in bf16 fp32; do bench_attention "$dt"; done ;;
      step) for m in DiT-XL/2 MoH-DiT-XL/2-90; do bench_step "$m"; done ;;
      router) bench_router ;;
      sweep) bench_sweep none 32,64,128,256; bench_sweep blocks 64,128,256,512 ;;
      graphs) for g in ${MOH_GPU_GRAPH_MODES:-off auto}; do bench_graphs "$g"; done ;;
      official) for b in ${MOH_GPU_OFFICIAL_RUNS:-DiT-XL/2:64 DiT-XL/2:128}; do bench_official "$b"; done ;;
      precision) for dt in fp32 tf32 bf16; do bench_precision "$dt"; done ;;
      *) die2 "MOH_GPU_BENCH: unknown benchmark $what (the header of scripts/gpu_check.sh lists them)" ;;
    esac
  done
}
bench_train() {
  local key=train_${1//\//_}
  run_logged bench "$key" "$BUILD/moh" bench train --model "$1" --device cuda --precision bf16 --batch 32 \
    --steps 10 --warmup 3 --peak-tflops 989 --json
  record bench "$key" "$(tail -n1 "$REPORT/bench_$key.log" | grep '^{' || echo null)"
}
bench_sample() {
  local key=sample_${1//\//_}
  run_logged bench "$key" "$BUILD/moh" bench sample --model "$1" --device cuda --precision bf16 --batch 64 \
    --chain 250 --cfg-scale 4 --steps 2 --warmup 1 --json
  record bench "$key" "$(tail -n1 "$REPORT/bench_$key.log" | grep '^{' || echo null)"
}
# Where a training step's time goes, before and after the multi-tensor optimizer: a DiT-XL/2-shaped step (bf16,
# batch 32, EMA 0.9999 as DiT's train.py) with AdamW + EMA per tensor (for_loop, the old path) and as the run picks
# them (auto: fused), each with a profile of one step by op class (Kineto kernels), then the official-structure
# PyTorch step (bench/pytorch_moh_dit_step.py: PyTorch's default multi-tensor AdamW, DiT's update_ema) on the same GPU.
bench_step() {
  local key=${1//\//_} impl
  for impl in for_loop auto; do
    run_logged bench "step_${key}_$impl" "$BUILD/moh" bench train --model "$1" --device cuda --precision bf16 \
      --batch 32 --ema 0.9999 --optim-impl "$impl" --steps 10 --warmup 3 --peak-tflops 989 --profile 12 --json
    record bench "step_${key}_$impl" "$(tail -n1 "$REPORT/bench_step_${key}_$impl.log" | grep '^{' || echo null)"
  done
  run_logged bench "step_${key}_pytorch" "$PY" bench/pytorch_moh_dit_step.py --model "$1" --device cuda \
    --precision bf16 --batch 32 --ema 0.9999 --steps 10 --warmup 3
  record bench "step_${key}_pytorch" "$(tail -n1 "$REPORT/bench_step_${key}_pytorch.log" | grep '^{' || echo null)"
}
# MoH's router as the official op sequence (plain) and compact, against the dense step: MoH-DiT-XL/2-90 with each and
# DiT-XL/2, interleaved in three rounds (bf16, batch 32, EMA 0.9999, the run's optimizer); the last compact step
# profiled by op class.
bench_router() {
  local round r key
  for round in 1 2 3; do
    for r in plain compact dense; do
      key=router_${r}_$round
      if [ "$r" = dense ]; then
        run_logged bench "$key" "$BUILD/moh" bench train --model DiT-XL/2 --device cuda --precision bf16 --batch 32 \
          --ema 0.9999 --steps 10 --warmup 3 --peak-tflops 989 --json
      else
        run_logged bench "$key" "$BUILD/moh" bench train --model MoH-DiT-XL/2-90 --device cuda --precision bf16 \
          --batch 32 --ema 0.9999 --router "$r" --steps 10 --warmup 3 --peak-tflops 989 --json \
          $([ "$round" = 3 ] && echo --profile 12)
      fi
      record bench "$key" "$(tail -n1 "$REPORT/bench_$key.log" | grep '^{' || echo null)"
    done
  done
}
# The best batch that fits a GPU, without and with activation checkpointing (DiT-XL/2, bf16, EMA): one JSON line per
# batch, then the sweep's summary.
bench_sweep() {
  run_logged bench "sweep_$1" "$BUILD/moh" bench train --model DiT-XL/2 --device cuda --precision bf16 --batch "$2" \
    --ema 0.9999 --grad-checkpoint "$1" --steps 5 --warmup 2 --peak-tflops 989 --json
  record bench "sweep_$1" "$(grep '"train_batch_sweep"' "$REPORT/bench_sweep_$1.log" | tail -n1 || echo null)"
}
# Our step and the official-structure PyTorch step (bench/pytorch_moh_dit_step.py) side by side, one MODEL:BATCH after
# the other (MOH_GPU_OFFICIAL_RUNS), both with the EMA of DiT's train.py: the ratio at the sweep's best batch and for MoH.
bench_official() {
  local model=${1%:*} batch=${1##*:} key
  key=official_${model//\//_}_b$batch
  run_logged bench "${key}_ours" "$BUILD/moh" bench train --model "$model" --device cuda --precision bf16 \
    --batch "$batch" --ema 0.9999 --steps 10 --warmup 3 --peak-tflops 989 --json
  record bench "${key}_ours" "$(tail -n1 "$REPORT/bench_${key}_ours.log" | grep '^{' || echo null)"
  run_logged bench "${key}_pytorch" "$PY" bench/pytorch_moh_dit_step.py --model "$model" --device cuda \
    --precision bf16 --batch "$batch" --ema 0.9999 --steps 10 --warmup 3
  record bench "${key}_pytorch" "$(tail -n1 "$REPORT/bench_${key}_pytorch.log" | grep '^{' || echo null)"
}
# Sampling with and without CUDA graphs: DDPM-250 + CFG 4 (batch 64) and DPM-Solver++ 12 steps + CFG 4 in [0, 0.5].
bench_graphs() {
  case " ${MOH_GPU_GRAPH_CHAINS:-ddpm dpm} " in *" ddpm "*) ;; *) bench_graphs_dpm "$1"; return ;; esac
  run_logged bench "graphs_$1_ddpm" "$BUILD/moh" bench sample --model DiT-XL/2 --device cuda --precision bf16 \
    --batch 64 --chain 250 --cfg-scale 4 --cuda-graph "$1" --steps 1 --warmup 1 --json
  record bench "graphs_$1_ddpm" "$(tail -n1 "$REPORT/bench_graphs_$1_ddpm.log" | grep '^{' || echo null)"
  case " ${MOH_GPU_GRAPH_CHAINS:-ddpm dpm} " in *" dpm "*) bench_graphs_dpm "$1" ;; esac
}
bench_graphs_dpm() {
  run_logged bench "graphs_$1_dpm" "$BUILD/moh" bench sample --model DiT-XL/2 --device cuda --precision bf16 \
    --batch 64 --sampler dpm++2m --chain 12 --cfg-scale 4 --cfg-interval 0,0.5 --cuda-graph "$1" --steps 3 \
    --warmup 1 --json
  record bench "graphs_$1_dpm" "$(tail -n1 "$REPORT/bench_graphs_$1_dpm.log" | grep '^{' || echo null)"
}
# The network's precision: a DiT-XL/2 training step (batch 32) and DPM-Solver++ 12 steps + CFG 4 (batch 64) in strict
# fp32, tf32 (what the official train.py and sample.py run) and bf16 autocast.
bench_precision() {
  run_logged bench "precision_train_$1" "$BUILD/moh" bench train --model DiT-XL/2 --device cuda --precision "$1" \
    --batch 32 --steps 5 --warmup 2 --peak-tflops 989 --json
  record bench "precision_train_$1" "$(tail -n1 "$REPORT/bench_precision_train_$1.log" | grep '^{' || echo null)"
  run_logged bench "precision_sample_$1" "$BUILD/moh" bench sample --model DiT-XL/2 --device cuda --precision "$1" \
    --batch 64 --sampler dpm++2m --chain 12 --cfg-scale 4 --steps 3 --warmup 1 --json
  record bench "precision_sample_$1" "$(tail -n1 "$REPORT/bench_precision_sample_$1.log" | grep '^{' || echo null)"
}
# Attention layers on the GPU, one value per shape and mode, in ms (forward, forward + backward):
#   vit_attention_DTYPE: MoH-ViT-B-50's routed layers (224 px, batch 32): MHA, MoH dense, MoH sparse and dense without
#     the window kernels (the official im2col path);
#   dit_attention_DTYPE: MoH-DiT-XL/2's layer (1152 wide, 16 heads) at 256 and 512 px (256 and 1,024 tokens, batch
#     32 and 8), MHA vs MoH dense vs MoH sparse at 75 % and 90 % active heads.
bench_attention() {
  local json=$REPORT/bench_vit_attention_$1.json
  run_logged bench "vit_attention_$1" bash -c '"$0" bench vit-attention --model MoH-ViT-B-50 --device cuda \
    --dtype "$1" --batch 32 --runs 10 --warmup 2 --json >"$2"' "$BUILD/moh" "$1" "$json"
  record bench "vit_attention_$1" "$(attention_summary "$json" stage mode)"
  json=$REPORT/bench_dit_attention_$1.json
  run_logged bench "dit_attention_$1" bash -c '"$0" bench attention --device cuda --dtype "$1" --scopes module \
    --seqs 256,1024 --dims 1152:16 --actives 0.75,0.9 --batch 32 --runs 10 --warmup 2 --json >"$2"' \
    "$BUILD/moh" "$1" "$json"
  record bench "dit_attention_$1" "$(attention_summary "$json" seq mode active_actual)"
}
# attention_summary JSON FIELD...: {"<FIELD values>_fwd_ms": ..., "..._fwdbwd_ms": ...} of a benchmark's rows; null if none.
attention_summary() {
  "$PY" -c '
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("null"); sys.exit()
out = {}
for r in rows:
    name = "_".join(str(round(r[f], 3) if isinstance(r[f], float) else r[f]) for f in sys.argv[2:])
    for t in ("fwd", "fwdbwd"):
        out["%s_%s_ms" % (name, t)] = round(r[t + "_ms"], 3)
print(json.dumps(out))' "$@"
}

for s in $STAGES; do
  case "$s" in env|build|tests|cli|bench) echo "gpu_check: stage $s"; "stage_$s" ;;
    *) die2 "MOH_GPU_STAGES: unknown stage $s (env build tests cli bench)" ;; esac
done
"$PY" scripts/gpu_report.py "$RESULTS" "$REPORT" || failed=1
exit $failed
