"""safetensors interop against the real `safetensors` package (and torch.save files of the installed torch):

    ref_safetensors.py write PATH [--basic]     a file with every dtype safetensors and this torch share (F64 F32 F16
                                                BF16 I64 I32 I16 I8 U8 BOOL C64, + F8_E4M3(FNUZ) F8_E5M2(FNUZ)
                                                U16 U32 U64 unless --basic), special values, an empty and a 0-d tensor, and metadata
    ref_safetensors.py same A B                 A and B hold the same tensors: names, dtypes, shapes and bytes
    ref_safetensors.py torch-load PT ST         every tensor of torch.load(PT) equals ST's (our reader of torch.save
                                                files, on files written by this torch version)
    ref_safetensors.py strict NAME FILE...      safetensors.torch.load_file reads each FILE; files ending in
                                                model/ema/converted .safetensors load with load_state_dict(strict=True)
                                                into the reference DiT NAME (tests/fixtures/gen/make_torch.py, official
                                                parameter names)

Exit 0 when the check holds, 1 (with the reason) when not. Run by tests/pyref_test.sh.
"""
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gen"))

METADATA = {"format": "pt", "written_by": "safetensors.torch.save_file", "note": "ünïcödé ✓"}
REFERENCE_DITS = {  # name: make_torch.DiT(size, patch, in_ch, dim, depth, classes, heads, head_dim, shared, topk)
    "DiT-Pixel/4": (28, 4, 1, 128, 6, 10, [8] * 6, 16, None, None),
    "MoH-DiT-Pixel/4-75": (28, 4, 1, 128, 6, 10, [8] * 6, 16, [4] * 6, [2] * 6),
}


def tensors(basic):
    g = torch.Generator().manual_seed(3)
    special = torch.tensor([0.0, -0.0, 1.5, -2.25, float("inf"), float("-inf"), float("nan"), 1e-42, 3.4e38])
    t = {
        "f64": torch.randn(3, 5, generator=g, dtype=torch.float64),
        "f32": torch.randn(2, 3, 4, generator=g),
        "f32_special": special,
        "f16": (torch.randn(7, generator=g) * 100).half(),
        "f16_special": torch.tensor([0.0, -0.0, 65504.0, 6e-8, float("inf"), float("nan")]).half(),
        "bf16": (torch.randn(4, 4, generator=g) * 1e3).bfloat16(),
        "bf16_special": special.bfloat16(),
        "i64": torch.tensor([-(2 ** 63), 2 ** 63 - 1, 0, -1]),
        "i32": torch.tensor([-(2 ** 31), 2 ** 31 - 1, 7], dtype=torch.int32),
        "i16": torch.tensor([-32768, 32767, 5], dtype=torch.int16),
        "i8": torch.tensor([-128, 127, 0], dtype=torch.int8),
        "u8": torch.tensor([0, 255, 128], dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]),
        "empty": torch.zeros(0, 3),
        "empty_i64": torch.zeros(2, 0, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "scalar_i32": torch.tensor(-7, dtype=torch.int32),
        "c64": torch.complex(torch.randn(3, generator=g), torch.randn(3, generator=g)),
    }
    if not basic:
        t["f8_e4m3"] = torch.tensor([0.0, 1.0, -2.5, 448.0, 0.015625]).to(torch.float8_e4m3fn)
        t["f8_e5m2"] = torch.tensor([0.0, 1.0, -3.0, 57344.0, float("inf")]).to(torch.float8_e5m2)
        t["f8_e4m3fnuz"] = torch.tensor([0.0, 1.0, -2.5, 240.0]).to(torch.float8_e4m3fnuz)
        t["f8_e5m2fnuz"] = torch.tensor([0.0, 1.0, -3.0, 57344.0]).to(torch.float8_e5m2fnuz)
        t["u16"] = torch.tensor([0, 65535, 3], dtype=torch.uint16)
        t["u32"] = torch.tensor([0, 2 ** 32 - 1, 3], dtype=torch.uint32)
        t["u64"] = torch.tensor([0, 2 ** 63 + 5, 3], dtype=torch.uint64)
    return t


def raw(t):
    """The tensor's bytes (dtype-agnostic comparison: NaN payloads, -0.0 and exotic dtypes compare exactly)."""
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).tolist() if t.numel() else []


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def same(a_path, b_path):
    a, b = load_file(a_path), load_file(b_path)
    if sorted(a) != sorted(b):
        fail(f"tensor names differ: only in A {sorted(set(a) - set(b))}, only in B {sorted(set(b) - set(a))}")
    for k in sorted(a):
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            fail(f"{k}: {a[k].dtype} {tuple(a[k].shape)} vs {b[k].dtype} {tuple(b[k].shape)}")
        if raw(a[k]) != raw(b[k]):
            fail(f"{k}: bytes differ")
    print(f"same: {len(a)} tensors identical ({', '.join(sorted({str(v.dtype).split('.')[1] for v in a.values()}))})")


def torch_load(pt_path, st_path):
    ref = torch.load(pt_path, map_location="cpu", weights_only=False)
    ours = load_file(st_path)
    flat = {k: v for k, v in ref.items() if torch.is_tensor(v)}
    if sorted(flat) != sorted(ours):
        fail(f"names differ: {sorted(set(flat) ^ set(ours))}")
    for k, v in flat.items():
        if v.dtype != ours[k].dtype or v.shape != ours[k].shape or raw(v) != raw(ours[k]):
            fail(f"{k}: {v.dtype} {tuple(v.shape)} != ours {ours[k].dtype} {tuple(ours[k].shape)} or values differ")
    print(f"torch-load: {len(flat)} tensors of {os.path.basename(pt_path)} (torch {torch.__version__}) read exactly")


def strict(name, files):
    import make_torch
    for f in files:
        with safe_open(f, framework="pt") as h:
            meta = h.metadata()
        sd = load_file(f)
        line = f"{os.path.relpath(f)}: load_file ok, {len(sd)} tensors, metadata {meta}"
        if os.path.basename(f) in ("model.safetensors", "ema.safetensors", "converted.safetensors"):
            model = make_torch.DiT(*REFERENCE_DITS[name])
            result = model.load_state_dict(sd, strict=True)
            line += f"; {name}.load_state_dict(strict=True): {result}"
        print(line)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        save_file(tensors("--basic" in args), args[0], metadata=METADATA)
        print(f"wrote {args[0]} with safetensors.torch.save_file (torch {torch.__version__})")
    elif cmd == "same":
        same(*args)
    elif cmd == "torch-load":
        torch_load(*args)
    elif cmd == "strict":
        strict(args[0], args[1:])
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
