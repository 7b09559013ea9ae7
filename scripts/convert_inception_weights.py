#!/usr/bin/env python3
"""Convert pytorch-fid / torch-fidelity FID-Inception weights (.pth) to safetensors for `moh fid --features inception:`.

usage: python3 scripts/convert_inception_weights.py pt_inception-2015-12-05-6726825d.pth pt_inception-2015-12-05.safetensors

Needs only PyTorch (any version that can torch.load the file; Debian: apt-get install python3-torch). The safetensors
file is written by hand (8-byte header length, JSON header, raw little-endian float32 data), so the `safetensors`
package is not required. Keys are kept exactly (Conv2d_1a_3x3.conv.weight, ..., fc.weight, fc.bias);
`num_batches_tracked` entries are dropped (moh does not need them). Expect 472 tensors, 23,850,960 parameters.
"""
import json
import struct
import sys

import torch


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    try:
        sd = torch.load(src, map_location="cpu", weights_only=False)
    except TypeError:  # torch < 1.13 has no weights_only
        sd = torch.load(src, map_location="cpu")
    if "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    tensors = {k: v.detach().contiguous().float() for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"source": src.split("/")[-1], "format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    print(f"wrote {dst}: {len(tensors)} tensors, {sum(t.numel() for t in tensors.values())} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
