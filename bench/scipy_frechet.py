#!/usr/bin/env python3
# scipy side of the Frechet-distance row of docs/BENCHMARKS.md: pytorch-fid / ADM calculate_frechet_distance (scipy.linalg.sqrtm
# of sigma1 @ sigma2) at 2048-d on synthetic ReLU features of 10,000 samples (the same kind as `moh bench eval`).
# usage: OMP_NUM_THREADS=2 .venv/bin/python bench/scipy_frechet.py   (interleave with build/moh bench eval)
import warnings
warnings.filterwarnings("ignore", category=DeprecationWarning)
import time
import numpy as np, scipy, scipy.linalg
rng = np.random.default_rng(0)
d = 2048
def feats(shift):
    m = rng.standard_normal((d, d)) / np.sqrt(d)
    x = np.maximum(rng.standard_normal((10000, d)) @ m + shift, 0)
    return x.mean(0), np.cov(x, rowvar=False)
mu1, s1 = feats(0.1); mu2, s2 = feats(0.2)
t = time.perf_counter()
covmean, _ = scipy.linalg.sqrtm(s1.dot(s2), disp=False)
fd = ((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean.real)
print({"scipy": scipy.__version__, "numpy": np.__version__, "sqrtm_fd_s": time.perf_counter() - t, "fd": float(fd)})
