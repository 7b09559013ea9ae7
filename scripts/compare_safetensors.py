#!/usr/bin/python3
"""Compares the tensors two safetensors files have in common (e.g. PyTorch reference outputs vs `moh forward`).

    python3 scripts/compare_safetensors.py REF.safetensors OUT.safetensors [--rtol 1e-5]

Prints, per shared tensor, max |a - b| / max |ref| and exits 1 if any exceeds --rtol. Needs only numpy (a tiny
safetensors reader is built in, so the `safetensors` package is not required).
"""
import argparse
import json
import struct
import sys

import numpy as np

NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
      "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        raw = data[8 + n + lo:8 + n + hi]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, NP[e["dtype"]])
        out[name] = a.reshape(e["shape"]).astype(np.float64)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("out")
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    ref, out = load(a.ref), load(a.out)
    common = sorted(set(ref) & set(out))
    if not common:
        sys.exit("error: no tensor names in common")
    worst = 0.0
    for k in common:
        if ref[k].shape != out[k].shape:
            sys.exit(f"error: {k}: shape {out[k].shape} != reference {ref[k].shape}")
        scale = max(np.abs(ref[k]).max(), 1e-30)
        err = np.abs(ref[k] - out[k]).max() / scale
        worst = max(worst, err)
        print(f"{k:12s} {str(list(ref[k].shape)):22s} max|ref| {scale:.4g}  max rel err {err:.3e}")
    print(f"worst {worst:.3e} (rtol {a.rtol:g}): {'OK' if worst <= a.rtol else 'FAIL'}")
    sys.exit(0 if worst <= a.rtol else 1)


if __name__ == "__main__":
    main()
