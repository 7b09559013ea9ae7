#!/usr/bin/env bash
# The GPU call (docs/GPU.md): everything a lent GPU machine checks and measures, as one device call under a deadline.
#   here:        scripts/gpu_call.sh --kit [DIR]     the Debian packages a bare GPU machine lacks, as .deb files, and
#                                                    the embedded Fashion-MNIST (DIR: .gpu_kit, ignored by git; <= 60 MiB)
#   on the GPU:  scripts/gpu_call.sh OUT [SECONDS]   the steps below in order, each only while its NEEDS seconds of
#                                                    the deadline (default 540) are left
# Every row is one JSON line of OUT/rows.jsonl ({"part", "label", ...}); bench/gpu_summary.py turns them into
# OUT/summary.md (the targets, met or not). At most eight files come back from a device call: rows.jsonl,
# summary.md, driver.log and logs.tar.gz are copied to OUT every 20 s and after each step.
# env: DEVICE (cuda; cpu rehearses the whole call on a CPU machine with small models), BUILD (build-gpu; a rehearsal
#      takes an existing build such as build-torch2 and skips the build step), KIT (.gpu_kit), PY (python3: the Python
#      with torch), PARTS (every step of the table, in its order)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
TABLE=(  # step    needs (s)  what
  "build   200  moh and the test binaries against the machine's LibTorch: the kit unpacked into KIT/prefix, OpenCV off"
  "parity   60  the CUDA parity tests of every fused piece, the router and the device tests (gtest, fp32 and bf16)"
  "ops      90  torch.ops.moh: moh_torch installed into WORK, its opcheck/parity tests, the ops against the official math"
  "cli      90  the moh binary end to end: classifier and DiT trained bf16, fp16, exact resume after kill -9, eval, sample, fid"
  "profile  60  DiT and MoH-DiT-90, bf16, batch 32, EMA 0.9999: one step profiled by op class, fused block off then on"
  "moh      60  DiT, MoH-DiT-90 and -75 with the fused block, three interleaved rounds (MoH / DiT ratios)"
  "sweep    45  DiT with the fused block at batch 64, 128, 256: the best batch and its MFU"
  "official 45  ours (fused) and the official-structure PyTorch step at the best batch, interleaved, two rounds"
  "vit      30  MoH-ViT-S-75 training step, bf16, batch 64: fused off, on, off, on"
  "router   45  MoH-DiT-90 with the plain and the compact router against DiT, three rounds"
  "sample   30  sampling: DDPM-250 + CFG 4 and DPM-Solver++ 12 steps, CUDA graphs off and auto"
  "precision 30 a DiT training step and a sampling chain in fp32, tf32 and bf16"
  "attention 30 attention layers alone: MoH-ViT-B-50 and MoH-DiT-XL/2 (MHA, MoH dense, MoH sparse)"
  "tests   120  the rest of ctest on the device (MOH_TEST_DEVICE), without the long command-line scripts"
)
DEVICE=${DEVICE:-cuda} KIT=$(realpath -m "${KIT:-.gpu_kit}") PY=${PY:-python3}
[[ "$PY" == */* ]] && PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # valid where a step changes directory

make_kit() {  # Debian packages the bare machine lacks; LibTorch, CUDA, the compiler and CMake are the machine's own
  local dir pkgs=(libyaml-cpp-dev libyaml-cpp0.7 libcxxopts-dev nlohmann-json3-dev libzip-dev libzip4 zlib1g-dev
                  libgloo-dev libgtest-dev libgmock-dev googletest dataset-fashion-mnist)
  dir=$(realpath -m "${1:-.gpu_kit}")
  command -v apt-get >/dev/null || { echo "error: gpu_call --kit: apt-get not found (run on the project's Debian 12)" >&2; exit 2; }
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/debs"
  if ! (cd "$dir.tmp/debs" && apt-get download "${pkgs[@]}" >../apt.log 2>&1); then
    echo "error: gpu_call --kit: apt-get download failed: $(grep -m1 '^E:' "$dir.tmp/apt.log") (apt-get update)" >&2
    rm -rf "$dir.tmp"; exit 2
  fi
  rm -f "$dir.tmp/apt.log"
  local kib; kib=$(du -sk "$dir.tmp" | cut -f1)
  [ "$kib" -le $((60 * 1024)) ] || { echo "error: gpu_call --kit: $((kib / 1024)) MiB, over 60 MiB (what travels is limited)" >&2; rm -rf "$dir.tmp"; exit 2; }
  (cd "$dir.tmp/debs" && ls) >"$dir.tmp/MANIFEST"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  echo "gpu_call: kit $dir: ${#pkgs[@]} packages, $((kib / 1024)) MiB (carry it with the working tree)"
}
if [ "${1:-}" = --kit ]; then make_kit "${2:-}"; exit 0; fi
[ $# -ge 1 ] || { echo "usage: $0 OUT [SECONDS] | $0 --kit [DIR]" >&2; exit 2; }
OUT=$(realpath -m "$1") LIMIT=${2:-540} BUILD=$(realpath -m "${BUILD:-build-gpu}")
PARTS=${PARTS:-$(printf '%s\n' "${TABLE[@]}" | awk '{printf "%s ", $1}')}
case "$DEVICE" in cuda | cpu) ;; *) echo "error: DEVICE=$DEVICE: use cuda or cpu" >&2; exit 2 ;; esac
WORK=$OUT/work ROWS=$OUT/rows.jsonl
mkdir -p "$OUT" "$WORK" && : >"$ROWS"
T0=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - T0))); }
log() { echo "[+$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/driver.log" >&2; }
collect() {
  "$PY" bench/gpu_summary.py "$ROWS" >"$OUT/summary.md" 2>>"$OUT/driver.log" || true
  (cd "$WORK" && tar -czf "$OUT/logs.tar.gz" --exclude='./*/checkpoints' --exclude='*.npz' .) 2>/dev/null || true
}
# row PART LABEL JSON [KEY=VALUE...]: JSON with part, label and the extra string fields, one line of rows.jsonl.
row() {
  "$PY" -c 'import json, sys
r = json.loads(sys.argv[3]) if sys.argv[3].strip() else {}
r = r if isinstance(r, dict) else {"rows": r}
r.update(part=sys.argv[1], label=sys.argv[2], **dict(a.split("=", 1) for a in sys.argv[4:]))
print(json.dumps(r))' "$@" >>"$ROWS"
}

# The models and sizes of a GPU call, or small stand-ins when rehearsing on a CPU (same commands, same steps).
if [ "$DEVICE" = cuda ]; then
  DIT=DiT-XL/2 MOH90=MoH-DiT-XL/2-90 MOH75=MoH-DiT-XL/2-75 VIT=MoH-ViT-S-75 VITB=MoH-ViT-B-50 PREC=(fp32 tf32 bf16)
  CLI_PREC=bf16
  BATCH=32 SWEEP=64,128,256 VIT_BATCH=64 SBATCH=64 CHAIN=250 SIZE=() STEPS=(--steps 10 --warmup 3) PEAK=(--peak-tflops 989)
  GRAPHS=(off auto) ATT=(--seqs 256,1024 --dims 1152:16 --batch 32)
else
  DIT=DiT-S/2 MOH90=MoH-DiT-S/2-90 MOH75=MoH-DiT-S/2-75 VIT=MoH-ViT-Nano-75 VITB=MoH-ViT-Nano-75 PREC=(fp32 bf16)
  CLI_PREC=fp32  # bf16 without native support is several times slower: the rehearsal checks the commands
  BATCH=2 SWEEP=2,4 VIT_BATCH=4 SBATCH=2 CHAIN=4 SIZE=(--img-size 8) STEPS=(--steps 1 --warmup 0) PEAK=()
  GRAPHS=(off) ATT=(--seqs 16 --dims 64:4 --batch 2)
fi

# bench PART LABEL KIND ARGS...: one `moh bench KIND` (train: bf16 and EMA 0.9999 as DiT's train.py unless ARGS say
# otherwise), each JSON line it prints one row.
bench() {
  local part=$1 label=$2 kind=$3 log line extra=()
  shift 3
  log=$WORK/${part}_${label//\//_}.log
  [ "$kind" = train ] && extra=(--precision bf16 --ema 0.9999 "${PEAK[@]}")
  timeout "$(left)" "$BUILD/moh" bench "$kind" --device "$DEVICE" "${extra[@]}" --json "$@" >"$log" 2>&1
  grep '^{' "$log" | while read -r line; do row "$part" "$label" "$line"; done
}
official() {  # official LABEL MODEL BATCH: the official-structure PyTorch step (bench/pytorch_moh_dit_step.py)
  local log=$WORK/official_$1.log
  timeout "$(left)" "$PY" bench/pytorch_moh_dit_step.py --model "$2" --device "$DEVICE" --precision bf16 \
    --batch "$3" --ema 0.9999 "${STEPS[@]}" >"$log" 2>&1
  row official "$1" "$(grep '^{' "$log" | tail -n1)" model="$2" batch="$3" what=official_step
}
# gtest BINARY FILTER LABEL: a test binary on the device, its counts and failures as one row.
gtest() {
  MOH_TEST_DEVICE=$DEVICE OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} timeout "$(left)" "$BUILD/tests/$1" --gtest_filter="$2" \
    --gtest_output="json:$WORK/$3.json" >"$WORK/$3.log" 2>&1
  local rc=$?
  row "$3" tests "$("$PY" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"tests": r["tests"], "failures": r["failures"], "failed": [t["classname"] + "." + t["name"]
      for s in r["testsuites"] for t in s["testsuite"] if t.get("failures")]}))' "$WORK/$3.json" 2>/dev/null)" \
    what=tests device="$DEVICE"
  return $rc
}

step_build() {
  if [ "$DEVICE" = cpu ]; then [ -x "$BUILD/moh" ]; return; fi  # a rehearsal uses the build it is given
  row build machine "$("$PY" -c 'import json, subprocess, torch
q = lambda *c: subprocess.run(c, capture_output=True, text=True).stdout.strip().splitlines()[:1]
print(json.dumps({"gpu": q("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"),
      "torch": torch.__version__, "cuda": torch.version.cuda, "nvcc": q("nvcc", "--version")[-1:], "cxx": q("c++", "--version")}))')"
  [ -f "$KIT/MANIFEST" ] || { log "no kit in $KIT (scripts/gpu_call.sh --kit on a project machine)"; return 2; }
  local prefix=$KIT/prefix f l t torch_cmake nccl_inc
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$KIT"/debs/*.deb; do dpkg-deb -x "$f" "$prefix" 2>/dev/null ||
    (cd "$prefix" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x -J); done
  find "$prefix" -type l | while read -r l; do  # absolute symlinks (libz.so -> /lib/...) to what this machine has
    t=$(readlink "$l")
    case "$t" in /*) if [ -e "$prefix$t" ]; then ln -sf "$prefix$t" "$l"; else
      t=$(ldconfig -p | awk -v n="$(basename "$l").1" '$1 == n {print $NF; exit}'); [ -n "$t" ] && ln -sf "$t" "$l"; fi ;; esac
  done
  [ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] ||
    { mkdir -p /usr/share/datasets && cp -r "$prefix/usr/share/datasets/fashion-mnist" /usr/share/datasets/; }
  torch_cmake=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  nccl_inc=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)
  export CPATH=${nccl_inc}${CPATH:+:$CPATH}
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_cmake/Torch" -DCMAKE_PREFIX_PATH="$prefix/usr" \
    -DMOH_WITH_OPENCV=OFF -DMOH_WITH_NCCL=ON -DMOH_TORCH_OPS=ON >"$WORK/configure.log" 2>&1 || return
  cmake --build "$BUILD" -j"$(env -u OMP_NUM_THREADS nproc)" --target moh moh_tests_core moh_tests_models -- -k 0 \
    >"$WORK/compile.log" 2>&1
}
step_parity() { gtest moh_tests_models 'FusedOps.*:FusedBlock.*:WorkingCopies.*:HeadMix.*:MoHRouting.*:OnDevice.*' parity; }
step_ops() {
  local pkg=$WORK/moh_torch_pkg dtype=bf16 rc
  MOH_BUILD_DIR=$BUILD timeout "$(left)" "$PY" -m pip install --quiet --no-build-isolation --no-deps --no-index \
    --disable-pip-version-check --target "$pkg" ./python >"$WORK/ops_install.log" 2>&1 || return 1
  (cd python/tests && PYTHONPATH=$pkg timeout "$(left)" "$PY" -m unittest -v test_ops) >"$WORK/ops_tests.log" 2>&1
  rc=$?
  row ops tests "$("$PY" -c 'import json, re, sys
t = open(sys.argv[1]).read(); ran = re.search(r"Ran (\d+) test", t)
print(json.dumps({"ran": int(ran.group(1)) if ran else 0, "failed": re.findall(r"^(?:FAIL|ERROR): (.*)$", t, re.M)}))' \
    "$WORK/ops_tests.log")" what=ops_tests device="$DEVICE" exit="$rc"
  [ "$DEVICE" = cpu ] && dtype=fp32
  PYTHONPATH=$pkg timeout "$(left)" "$PY" bench/moh_torch_ops.py --device "$DEVICE" --dtype "$dtype" --rounds 1 \
    --iters 5 --out "$WORK/ops_bench.jsonl" >"$WORK/ops_bench.log" 2>&1
  [ -f "$WORK/ops_bench.jsonl" ] && while read -r l; do row ops bench "$l" what=ops_bench; done <"$WORK/ops_bench.jsonl"
  return $rc
}
# The binary on the device end to end (fp32 and train.deterministic for the resume: the CPU tests' bit-for-bit check).
step_cli() {
  local d=$WORK/cli c=() m=$BUILD/moh rc=0
  rm -rf "$d" && mkdir -p "$d" && cd "$d" || return 1
  c=(--set train.device="$DEVICE" --set train.precision="$CLI_PREC" --set data.batch_size=128 --set data.limit_train=4096
     --set train.epochs=2 --set train.ema_decay=0.99 --set train.log_every_steps=8 --set train.seed=5)
  run() { local n=$1; shift; timeout "$(left)" "$m" "$@" >"$n.log" 2>&1; local r=$?; row cli "$n" "" ok="$([ $r = 0 ] && echo 1 || echo 0)"; [ $r = 0 ] || rc=1; }
  run train_cls train "$OLDPWD/configs/fashion_mnist/moh_vit_nano.yaml" "${c[@]}" --set data.limit_val=1024 --run-dir cls
  run train_dit train "$OLDPWD/configs/fashion_mnist/moh_dit_pixel.yaml" "${c[@]}" --run-dir dit
  [ "$DEVICE" = cuda ] && run train_fp16 train "$OLDPWD/configs/fashion_mnist/moh_dit_pixel.yaml" "${c[@]}" \
    --set train.precision=fp16 --set train.max_steps=12 --run-dir fp16
  c+=(--set train.precision=fp32 --set train.ckpt_every_epochs=1 --set train.deterministic=true)
  run resume_a train "$OLDPWD/configs/fashion_mnist/moh_dit_pixel.yaml" "${c[@]}" --run-dir res_a
  "$m" train "$OLDPWD/configs/fashion_mnist/moh_dit_pixel.yaml" "${c[@]}" --run-dir res_k >res_k0.log 2>&1 &
  local victim=$!
  for _ in $(seq 1 6000); do [ -e res_k/checkpoints/latest ] && break; sleep 0.05; done
  kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
  run resume_k train "$OLDPWD/configs/fashion_mnist/moh_dit_pixel.yaml" "${c[@]}" --run-dir res_k --resume auto
  h() { (cd "$1/checkpoints" && sha256sum 0*/model.safetensors 0*/optimizer.safetensors 2>/dev/null); }
  [ -n "$(h res_a)" ] && [ "$(h res_a)" = "$(h res_k)" ] && row cli resume_equal "" ok=1 || { row cli resume_equal "" ok=0; rc=1; }
  run eval eval --checkpoint cls --device "$DEVICE" --json
  run sample_ddpm sample --checkpoint dit --device "$DEVICE" --num-samples 500 --steps 50 --cfg-scale 2 --seed 1 --out s1
  run sample_ddim sample --checkpoint dit --device "$DEVICE" --num-samples 500 --sampler ddim --steps ddim25 --cfg-scale 2 --seed 2 --out s2
  run fid fid s1/samples.npz s2/samples.npz --features classifier:cls --device "$DEVICE" --json
  cd "$OLDPWD" || return 1
  return $rc
}
step_profile() {
  local m f
  for m in "$DIT" "$MOH90"; do for f in off on; do
    bench profile "${m}_$f" train --model "$m" --batch "$BATCH" --fused "$f" "${SIZE[@]}" "${STEPS[@]}" --profile 12; done; done
}
step_moh() {
  local round m
  for round in 1 2 3; do for m in "$DIT" "$MOH90" "$MOH75"; do
    bench moh "${m}_r$round" train --model "$m" --batch "$BATCH" --fused on "${SIZE[@]}" "${STEPS[@]}"; done; done
}
step_sweep() { bench sweep "$DIT" train --model "$DIT" --batch "$SWEEP" --fused on "${SIZE[@]}" --steps 5 --warmup 2; }
step_official() {
  local best round
  best=$("$PY" -c 'import json, sys
s = [r for r in map(json.loads, open(sys.argv[1])) if r.get("what") == "train_batch_sweep" and "best_batch" in r]
print(s[-1]["best_batch"] if s else sys.argv[2])' "$ROWS" "${SWEEP%%,*}")
  [ "$DEVICE" = cpu ] && best=2  # the official step's latents are 32x32 whatever the rehearsal's size
  for round in 1 2; do
    bench official "ours_b${best}_r$round" train --model "$DIT" --batch "$best" --fused on \
      $([ "$DEVICE" = cuda ] || echo --img-size 32) "${STEPS[@]}"
    official "pytorch_b${best}_r$round" "$DIT" "$best"
  done
}
step_vit() {
  local f round
  for round in 1 2; do for f in off on; do
    bench vit "${VIT}_${f}_r$round" train --model "$VIT" --batch "$VIT_BATCH" --fused "$f" "${STEPS[@]}"; done; done
}
step_router() {
  local round r
  for round in 1 2 3; do
    bench router "dense_r$round" train --model "$DIT" --batch "$BATCH" "${SIZE[@]}" "${STEPS[@]}"
    for r in plain compact; do
      bench router "${r}_r$round" train --model "$MOH90" --batch "$BATCH" --router "$r" "${SIZE[@]}" "${STEPS[@]}"; done
  done
}
step_sample() {
  local g
  for g in "${GRAPHS[@]}"; do
    bench sample "ddpm_graphs_$g" sample --model "$DIT" --precision bf16 --batch "$SBATCH" --chain "$CHAIN" --cfg-scale 4 \
      --cuda-graph "$g" "${SIZE[@]}" --steps 1 --warmup 1
    bench sample "dpm_graphs_$g" sample --model "$DIT" --precision bf16 --batch "$SBATCH" --sampler dpm++2m --chain 12 \
      --cfg-scale 4 --cfg-interval 0,0.5 --cuda-graph "$g" "${SIZE[@]}" --steps 3 --warmup 1
  done
}
step_precision() {
  local p
  for p in "${PREC[@]}"; do
    bench precision "train_$p" train --model "$DIT" --precision "$p" --batch "$BATCH" "${SIZE[@]}" --steps 5 --warmup 2
    bench precision "sample_$p" sample --model "$DIT" --precision "$p" --batch "$SBATCH" --sampler dpm++2m --chain 12 \
      --cfg-scale 4 "${SIZE[@]}" --steps 3 --warmup 1
  done
}
step_attention() {
  local dt
  for dt in bf16 fp32; do
    timeout "$(left)" "$BUILD/moh" bench vit-attention --model "$VITB" --device "$DEVICE" --dtype "$dt" --batch 2 \
      --runs 3 --warmup 1 --json >"$WORK/att_vit_$dt.json" 2>"$WORK/att_vit_$dt.log" &&
      row attention "vit_$dt" "$(cat "$WORK/att_vit_$dt.json")" what=vit_attention
    timeout "$(left)" "$BUILD/moh" bench attention --device "$DEVICE" --dtype "$dt" --scopes module "${ATT[@]}" \
      --actives 0.75,0.9 --runs 3 --warmup 1 --json >"$WORK/att_dit_$dt.json" 2>"$WORK/att_dit_$dt.log" &&
      row attention "dit_$dt" "$(cat "$WORK/att_dit_$dt.json")" what=dit_attention
  done
}
step_tests() {
  MOH_TEST_DEVICE=$DEVICE OMP_NUM_THREADS=2 timeout "$(left)" ctest --test-dir "$BUILD" -j8 --timeout 300 \
    -E '^(format|cli|bad_input|readme|demo_quick|sampling|scale_check|nocv|pyref_.*)$' --output-junit "$WORK/ctest.xml" \
    >"$WORK/ctest.log" 2>&1
  local rc=$?
  row tests ctest "$("$PY" -c 'import json, sys, xml.etree.ElementTree as ET
c = ET.parse(sys.argv[1]).getroot().findall(".//testcase"); st = lambda x: x.get("status") or "run"
print(json.dumps({"tests": len(c), "failed": [x.get("name") for x in c if st(x) == "fail"]}))' "$WORK/ctest.xml" 2>/dev/null)" \
    what=ctest device="$DEVICE"
  return $rc
}

(while sleep 20; do collect; done) &
COPIER=$!
trap 'kill $COPIER 2>/dev/null' EXIT
log "device $DEVICE, build $BUILD, deadline $LIMIT s; steps: $PARTS"
for s in "${TABLE[@]}"; do
  read -r name needs _ <<<"$s"
  case " $PARTS " in *" $name "*) ;; *) continue ;; esac
  if [ "$(left)" -lt "$needs" ]; then log "$name skipped: $(left) s left, needs $needs"; continue; fi
  log "$name"
  "step_$name"
  rc=$?
  log "$name exit $rc"
  collect
  if [ "$name" = build ] && [ $rc != 0 ]; then log "no build: stopping"; exit 1; fi
done
log "finished"
collect
