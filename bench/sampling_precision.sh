#!/usr/bin/env bash
# sampling.precision on this machine: the seconds and the FID of N samples of one checkpoint per precision (fp32, bf16
# autocast, tf32), interleaved rounds with sampling seed 1, then paired FIDs (bf16 against fp32 with the same noise)
# for more sampling seeds. DPM-Solver++ 12 steps, CFG 4, batch 500. JSON rows to $OUT, a Markdown table to stdout.
#   usage: bash bench/sampling_precision.sh CHECKPOINT FEATURE_RUN REF_STATS [MOH_BINARY ...]
#          (binaries default to build/moh build-torch2/moh, those that exist)
#   N (2000), ROUNDS (2), SEEDS ("2 3 4": the paired seeds), OUT (docs/results/bench_sampling_precision_cpu.jsonl)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: $0 CHECKPOINT FEATURE_RUN REF_STATS [MOH_BINARY ...]" >&2; exit 2; }
CKPT=$1 FEATURES=$2 REF=$3
shift 3
N=${N:-2000} ROUNDS=${ROUNDS:-2} SEEDS=${SEEDS:-"2 3 4"} OUT=${OUT:-docs/results/bench_sampling_precision_cpu.jsonl}
bins=("$@")
[ ${#bins[@]} -gt 0 ] || for b in build/moh build-torch2/moh; do [ -x "$b" ] && bins+=("$b"); done
[ ${#bins[@]} -gt 0 ] || { echo "error: no moh binary built (scripts/setup.sh)" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# one BIN PRECISION SEED ROUND: sample, measure, append a row
one() {
  local d=$work/s
  rm -rf "$d"
  "$1" sample --checkpoint "$CKPT" --num-samples "$N" --seed "$3" --sampler dpm++2m --steps 12 --cfg-scale 4 \
    --batch 500 --precision "$2" --out "$d" >"$work/log" 2>&1
  "$1" fid --samples "$d/samples.npz" --ref "$REF" --features "classifier:$FEATURES" --out "$d/fid" >>"$work/log" 2>&1
  python3 - "$d" "$2" "$3" "$4" "$CKPT" >>"$OUT" <<'PY'
import json, sys
d, p, seed, rnd, ckpt = sys.argv[1:]
s, f = json.load(open(d + "/sampling.json")), json.load(open(d + "/fid/report.json"))
print(json.dumps({"precision": p, "as_computed": s["precision"], "seed": int(seed), "round": int(rnd),
                  "seconds": s["seconds"], "fid": f["metrics"]["fid"], "checkpoint": ckpt,
                  "samples": s["count"], "feature_sha256": f["feature_net"]["weights_sha256"],
                  "reference_sha256": f["reference"]["sha256"], **s["provenance"]}))
PY
}

for bin in "${bins[@]}"; do
  for r in $(seq "$ROUNDS"); do for p in fp32 bf16 tf32; do one "$bin" "$p" 1 "$r"; done; done
  for s in $SEEDS; do for p in fp32 bf16; do one "$bin" "$p" "$s" 0; done; done
done
python3 - "$OUT" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| LibTorch | precision | seconds (seed 1, median of rounds) | / fp32 | FID seed 1 | FID − fp32 per sampling seed (1, then SEEDS; same noise) |")
print("|---|---|---|---|---|---|")
for lt in sorted({r["libtorch"] for r in rows}):
    mine = [r for r in rows if r["libtorch"] == lt]
    sec = {p: st.median(r["seconds"] for r in mine if r["precision"] == p and r["seed"] == 1) for p in ("fp32", "bf16", "tf32")}
    fid = {(r["precision"], r["seed"]): r["fid"] for r in mine}
    for p in ("fp32", "bf16", "tf32"):
        diffs = [fid[(p, s)] - fid[("fp32", s)] for (q, s) in fid if q == "fp32" and (p, s) in fid]
        d = ", ".join(f"{x:+.2f}" for x in diffs)
        print(f"| {lt} | {p} | {sec[p]:.1f} | {sec[p] / sec['fp32']:.2f} | {fid[(p, 1)]:.2f} | {d} |")
PY
