#!/usr/bin/env bash
# FID versus compute (issue 36, docs/SAMPLING.md): samples one trained DiT / MoH-DiT run over a list of sampling
# settings (sampler, steps, CFG scale, guidance interval, head budget) and measures each with `moh fid`:
# FID / sFID / IS / precision / recall, the accuracy of the samples on their classes, network evaluations per image
# (NFE, counted by moh sample) and the seconds the sampling took. One JSON line per setting in OUT/curve.jsonl (a
# setting already there is skipped when the script is started again), OUT/curve.md as a table, and
# `moh plot --fid-curve` draws FID against NFE and against seconds (OUT/fid_curve.png).
#
# usage: studies/fid_curve/run.sh RUN_DIR OUT_DIR REF_STATS FEATURES [SETTINGS_FILE]
#   REF_STATS  reference statistics (moh ref-stats), FEATURES  the feature network (e.g. classifier:runs/nano)
#   SETTINGS_FILE  lines "name | moh sample flags"; default: the list below (DDPM-250 + CFG is the baseline)
# env: SAMPLES (2000) CFG (4: the scale of every guided setting) LABEL (the run dir's name: the series name)
#      MOH (build/moh) DEVICE (auto) SAMPLE_ARGS (more moh sample flags for every setting, e.g.
#      "--set sampling.batch_size=1000" on a GPU: the batch changes which noise each image gets, not the protocol)
#      EXTRA_SETTINGS (a file of more settings after the list, e.g. head budgets --topk K for a MoH model)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 4 ] || { echo "usage: $0 RUN_DIR OUT_DIR REF_STATS FEATURES [SETTINGS_FILE]" >&2; exit 2; }
RUN=$1 OUT=$2 REF=$3 FEATURES=$4 SETTINGS=${5:-}
MOH=${MOH:-build/moh} SAMPLES=${SAMPLES:-2000} CFG=${CFG:-4} LABEL=${LABEL:-$(basename "$RUN")} DEVICE=${DEVICE:-auto}
SAMPLE_ARGS=${SAMPLE_ARGS:-} EXTRA=${EXTRA_SETTINGS:-}
[ -x "$MOH" ] || { echo "error: $MOH not found (run scripts/setup.sh first)" >&2; exit 2; }
[ -d "$RUN" ] || { echo "error: $RUN: not a run directory" >&2; exit 2; }
[ -f "$REF" ] || { echo "error: $REF: no reference statistics (moh ref-stats)" >&2; exit 2; }

default_settings() {  # the list measured in docs/results/fid_curve/README.md
  cat <<EOF
ddpm250 | --sampler ddpm --steps 250 --cfg-scale $CFG
ddim50 | --sampler ddim --steps ddim50 --cfg-scale $CFG
dpm++2m_25 | --sampler dpm++2m --steps 25 --cfg-scale $CFG
dpm++2m_20 | --sampler dpm++2m --steps 20 --cfg-scale $CFG
dpm++2m_12 | --sampler dpm++2m --steps 12 --cfg-scale $CFG
dpm++2m_10 | --sampler dpm++2m --steps 10 --cfg-scale $CFG
dpm++2m_20_int0.5 | --sampler dpm++2m --steps 20 --cfg-scale $CFG --cfg-interval 0,0.5
dpm++2m_15_int0.5 | --sampler dpm++2m --steps 15 --cfg-scale $CFG --cfg-interval 0,0.5
dpm++2m_12_int0.5 | --sampler dpm++2m --steps 12 --cfg-scale $CFG --cfg-interval 0,0.5
euler_25 | --sampler euler --steps 25 --cfg-scale $CFG
heun_12 | --sampler heun --steps 12 --cfg-scale $CFG
heun_7 | --sampler heun --steps 7 --cfg-scale $CFG
EOF
}
settings() {
  if [ -n "$SETTINGS" ]; then grep -v '^\s*\(#\|$\)' "$SETTINGS"; else default_settings; fi
  if [ -n "$EXTRA" ]; then grep -v '^\s*\(#\|$\)' "$EXTRA"; fi
}

mkdir -p "$OUT"
ROWS=$OUT/curve.jsonl
touch "$ROWS"
jget() {  # jget FILE KEY...: a number from a JSON file (null when absent)
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d.get(k) if isinstance(d, dict) else None
print('null' if d is None else json.dumps(d))" "$@"
}
settings | while IFS='|' read -r name flags; do
  name=$(echo "$name" | xargs) flags=$(echo "$flags" | xargs)
  id="$LABEL/$name"
  grep -qF "\"id\": \"$id\"" "$ROWS" && continue
  dir=$OUT/$LABEL/$name
  rm -rf "$dir" && mkdir -p "$OUT/$LABEL"
  # shellcheck disable=SC2086  # the flags are words
  "$MOH" sample --checkpoint "$RUN" --num-fid-samples "$SAMPLES" --labels balanced --device "$DEVICE" $flags $SAMPLE_ARGS \
    --out "$dir" >"$dir.sample.log" 2>&1 || { echo "error: moh sample $flags failed: $(tail -1 "$dir.sample.log")" >&2; exit 1; }
  "$MOH" fid --samples "$dir/samples.npz" --ref "$REF" --features "$FEATURES" --out "$dir/fid" >"$dir.fid.log" 2>&1 ||
    { echo "error: moh fid for $name failed: $(tail -1 "$dir.fid.log")" >&2; exit 1; }
  m=$dir/fid/report.json s=$dir/sampling.json
  echo "{\"id\": \"$id\", \"label\": \"$LABEL\", \"setting\": \"$name\", \"flags\": \"$flags\"," \
    "\"samples\": $SAMPLES, \"nfe\": $(jget "$s" nfe_per_image), \"seconds\": $(jget "$s" seconds)," \
    "\"fid\": $(jget "$m" metrics fid), \"sfid\": $(jget "$m" metrics sfid)," \
    "\"inception_score\": $(jget "$m" metrics inception_score), \"precision\": $(jget "$m" metrics precision)," \
    "\"recall\": $(jget "$m" metrics recall), \"sample_accuracy\": $(jget "$m" sample_accuracy top1)}" >>"$ROWS"
  echo "$id: $(tail -1 "$ROWS")"
  rm -f "$dir/samples.npz"  # the report keeps the numbers; 2,000 images per setting add up
done
python3 - "$ROWS" >"$OUT/curve.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | setting | NFE / image | seconds | FID | sFID | IS | precision | recall | sample acc. |")
print("|---|---|---|---|---|---|---|---|---|---|")
f = lambda v, d: "–" if v is None else f"{v:.{d}f}"
for r in rows:
    print(f"| {r['label']} | {r['setting']} | {r['nfe']} | {f(r['seconds'], 0)} | {f(r['fid'], 2)} | {f(r['sfid'], 2)} "
          f"| {f(r['inception_score'], 2)} | {f(r['precision'], 3)} | {f(r['recall'], 3)} | {f(r['sample_accuracy'], 2)} |")
EOF
"$MOH" plot --fid-curve "$ROWS" --out "$OUT/plots" >/dev/null && echo "wrote $OUT/curve.md, $OUT/plots/fid_curve.png"
