"""fp32 GEMM rate at MoH-DiT-S/2's shapes against a 2048^3 product, on the PyTorch that runs this script.

Shows how close the DiT step's matrix products already are to the machine's GEMM peak (docs/BENCHMARKS.md,
"Against the official-structure PyTorch step"): (4096 tokens = 16 latents of 256) x 384 x {1152 qkv, 384 proj,
1536 fc1}, and 4096 x 1536 x 384 (fc2), as F.linear calls them. Best of 5 after one warm-up, 2 threads.
usage: python bench/gemm_shapes.py        (.venv/bin/python for torch 2.x, /usr/bin/python3 for Debian's 1.13)
"""
import time

import torch


def best(f, n=5):
    f()
    t = 1e9
    for _ in range(n):
        s = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - s)
    return t


def main():
    torch.set_num_threads(2)
    with torch.no_grad():
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        print(f"torch {torch.__version__}: 2048^3 {2 * 2048 ** 3 / best(lambda: a @ b) / 1e9:.0f} GFLOP/s")
        for m, k, n in [(4096, 384, 1152), (4096, 384, 384), (4096, 384, 1536), (4096, 1536, 384)]:
            x, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
            t = best(lambda: torch.nn.functional.linear(x, w, bias))
            print(f"  linear {m}x{k}x{n}: {2 * m * k * n / t / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
