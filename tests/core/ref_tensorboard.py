#!/usr/bin/env python3
# A run's TensorBoard event files (log.tensorboard: true) read back by the `tensorboard` package's own reader
# (EventAccumulator, as TensorBoard loads a run directory; orphaned data after a restart purged as TensorBoard does)
# and compared with the run's metrics.jsonl: every number of every line with a step as a scalar of its key, at that
# step, in that order (float32); each head-load matrix as a PNG heat map at its step (size = heads × layers cells,
# the largest share in viridis' top colour); the resolved config as text. --cut: the newest event file is first copied
# with its last record cut short (a kill during a write) and must still read up to that record.
# --grid: a sampled checkpoint's grid.png must be there byte for byte, tagged samples/..., at its step.
# usage: ref_tensorboard.py RUN_DIR [--cut] [--expect-files N] [--grid GRID_PNG --grid-step S]
import argparse, io, json, os, shutil, sys, tempfile

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto.event_pb2 import SessionLog

p = argparse.ArgumentParser()
p.add_argument("run")
p.add_argument("--cut", action="store_true")
p.add_argument("--expect-files", type=int, default=0)
p.add_argument("--grid", help="a moh sample grid.png that must be in the run's tb/ as samples/... at --grid-step")
p.add_argument("--grid-step", type=int, default=-1)
a = p.parse_args()
fails = []


def check(ok, what):
    if not ok:
        fails.append(what)


tb = os.path.join(a.run, "tb")
files = sorted(f for f in os.listdir(tb) if f.startswith("events.out.tfevents."))
if a.expect_files:
    check(len(files) == a.expect_files, f"{len(files)} event files, expected {a.expect_files}")
lines = [json.loads(l) for l in open(os.path.join(a.run, "metrics.jsonl")) if l.strip()]
lines = [l for l in lines if isinstance(l.get("step"), int)]

if a.cut:  # the newest file cut inside its last record: every whole record before it must still be read
    tmp = tempfile.mkdtemp()
    for f in files:
        shutil.copy(os.path.join(tb, f), tmp)
    path = os.path.join(tmp, files[-1])
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-7])
    tb = tmp

acc = EventAccumulator(tb, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
acc.Reload()
tags = acc.Tags()

# scalars: per key, the (step, value) sequence of metrics.jsonl
want = {}
for l in lines:
    for k, v in l.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
            want.setdefault(k, []).append((l["step"], float(np.float32(v))))
if a.cut:  # the cut record is the last scalar of the last line: drop it from what is expected
    last = [k for k, v in lines[-1].items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    if last:
        want[last[-1]].pop()
        if not want[last[-1]]:
            del want[last[-1]]
check(sorted(tags["scalars"]) == sorted(want), f"scalar tags {sorted(tags['scalars'])} != {sorted(want)}")
n_scalars = 0
for k, seq in want.items():
    if k not in tags["scalars"]:
        continue
    got = [(e.step, e.value) for e in acc.Scalars(k)]
    n_scalars += len(got)
    check(len(got) == len(seq), f"{k}: {len(got)} events, metrics.jsonl has {len(seq)}")
    for (gs, gv), (ws, wv) in zip(got, seq):
        if gs != ws or gv != wv:
            fails.append(f"{k}: ({gs}, {gv}) != ({ws}, {wv})")
            break

# a sampled checkpoint's grid
if a.grid:
    grids = [(t, e) for t in tags["images"] if t.startswith("samples/") for e in acc.Images(t)]
    png = open(a.grid, "rb").read()
    w, h = Image.open(a.grid).size
    check(len(grids) == 1 and grids[0][1].encoded_image_string == png and grids[0][1].step == a.grid_step
          and (grids[0][1].width, grids[0][1].height) == (w, h), f"grid: {[(t, e.step) for t, e in grids]}")

# head-load heat maps
loads = [(l["step"], l["head_load"]) for l in lines if "head_load" in l]
images = [e for e in acc.Images("head_load")] if "head_load" in tags["images"] else []
if not a.cut:
    check(len(images) == len(loads), f"{len(images)} head_load images, metrics.jsonl has {len(loads)}")
for e, (step, m) in zip(images, loads):
    img = np.asarray(Image.open(io.BytesIO(e.encoded_image_string)).convert("RGB"))
    rows, cols = len(m), max(len(r) for r in m)
    cell = img.shape[0] // rows
    check(img.shape == (rows * cell, cols * cell, 3) and (e.height, e.width) == img.shape[:2],
          f"head_load image {img.shape} for {rows} x {cols} shares")
    i, j = max(((i, j) for i in range(rows) for j in range(len(m[i]))), key=lambda ij: m[ij[0]][ij[1]])
    check(tuple(img[i * cell + cell // 2, j * cell + cell // 2]) == (253, 231, 37), f"step {step}: top share colour")
    check(e.step == step, f"head_load image at step {e.step}, expected {step}")

# each file: the version record first; a resumed run's file then a SessionLog START one step past its checkpoint,
# before any of its own steps (TensorBoard drops what an earlier file logged from that step on)
for k, f in enumerate(files):
    events = list(EventFileLoader(os.path.join(a.run, "tb", f)).Load())
    if a.grid and k == len(files) - 1:
        continue  # the sampling command's file: an image, no restart
    check(events and events[0].file_version == "brain.Event:2", f"{f}: no version record first")
    starts = [e for e in events if e.HasField("session_log") and e.session_log.status == SessionLog.START]
    if k == 0:
        check(not starts, f"{f}: a fresh run with a restart mark")
    else:
        steps = [e.step for e in events if e.HasField("summary") and e.summary.value[0].tag != "config"]
        check(len(starts) == 1 and events[1] is starts[0] and steps and starts[0].step <= min(steps),
              f"{f}: no START mark before the resumed steps")

# the resolved config as text
texts = acc.Tensors("config") if "config" in tags["tensors"] else []
resolved = open(os.path.join(a.run, "config.resolved.yaml")).read()
check(len(texts) >= 1, "no config text")
for t in texts:
    text = t.tensor_proto.string_val[0].decode()
    check("\n".join(l[4:] for l in text.splitlines()) == resolved.rstrip("\n"), "config text != config.resolved.yaml")

print(json.dumps({"event_files": len(files), "scalar_tags": len(want), "scalar_events": n_scalars,
                  "images": len(images), "texts": len(texts), "fails": fails[:5]}))
sys.exit(1 if fails else 0)
