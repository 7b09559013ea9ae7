"""`moh fid` against the real evaluator packages, on the very features `moh fid --save-features` stored:

    ref_fid.py FEATURES.npz REPORT_ADM.json REPORT_FIDELITY.json

FEATURES.npz holds pool / spatial / logits of the samples and ref_pool / ref_spatial of the reference (both read from
images, so no stored statistics are involved). Checked, with relative tolerance 1e-6:
  FID   pytorch_fid.fid_score.calculate_frechet_distance (scipy sqrtm) and torch_fidelity.metric_fid
        (eigenvalues of sigma1·sigma2) on mu / sigma from numpy (float64) — both must agree with ours;
  sFID  the same Fréchet distance on the spatial features (pytorch-fid's function; torch-fidelity has no sFID);
  IS    torch_fidelity.metric_isc.isc_features_to_metric: 10 splits shuffled with RandomState(2020) against
        `--is-mode fidelity` (mean and std), and 1 split in order against `--is-mode adm` (ADM splits every 5000
        samples in order, so for N <= 5000 the two definitions coincide);
  P/R   torch_fidelity.metric_prc.prc_features_to_metric (k = 3) must equal ours exactly: both take the radius as the
        (k+1)-th smallest distance within a set counting the point itself and test membership with <=; torch-fidelity
        uses Euclidean distances (cdist), ADM and we squared ones, the same order. Where the definitions differ: ADM
        (and we) cap the reference at its first 10,000 rows for P/R and compute distances in fp16 when finite (we:
        fp32); torch-fidelity uses every row. Here N < 10,000.
  KID   torch_fidelity.metric_kid.kid_features_to_metric (100 subsets of 1,000 drawn with RandomState(2020), cubic
        polynomial kernel, unbiased MMD²) on the same features given as float64 (as we compute): mean and std. On
        float32 features torch-fidelity's kernels are float32 and differ from float64 by more than 1e-6: printed,
        not checked.
"""
import json
import sys

import numpy as np
import torch
from pytorch_fid.fid_score import calculate_frechet_distance
from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.metric_isc import isc_features_to_metric
from torch_fidelity.metric_kid import kid_features_to_metric
from torch_fidelity.metric_prc import prc_features_to_metric

RTOL = 1e-6
failures = []


def check(name, ours, ref, rtol=RTOL):
    rel = abs(ours - ref) / max(abs(ref), 1e-30)
    ok = rel <= rtol
    print(f"{name:28s} ours {ours:.12g}  reference {ref:.12g}  rel {rel:.2e}  {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(name)


def stats(x):
    x = x.astype(np.float64)
    return np.mean(x, axis=0), np.cov(x, rowvar=False)


def main(features_path, adm_path, fidelity_path):
    f = np.load(features_path)
    adm = json.load(open(adm_path))["metrics"]
    fidelity = json.load(open(fidelity_path))["metrics"]
    pool, ref_pool = f["pool"], f["ref_pool"]
    n, d = pool.shape
    print(f"samples {n}, reference {ref_pool.shape[0]}, pool dims {d}, spatial dims {f['spatial'].shape[1]}")
    assert n > d and ref_pool.shape[0] > d, "FID needs N > d for full-rank covariances"

    (m1, s1), (m2, s2) = stats(pool), stats(ref_pool)
    check("fid vs pytorch-fid", adm["fid"], float(calculate_frechet_distance(m1, s1, m2, s2)))
    tf = fid_statistics_to_metric(fid_features_to_statistics(torch.from_numpy(pool.astype(np.float64))),
                                  fid_features_to_statistics(torch.from_numpy(ref_pool.astype(np.float64))), False)
    check("fid vs torch-fidelity", adm["fid"], tf["frechet_inception_distance"])
    (a1, b1), (a2, b2) = stats(f["spatial"]), stats(f["ref_spatial"])
    check("sfid vs pytorch-fid", adm["sfid"], float(calculate_frechet_distance(a1, b1, a2, b2)))

    logits = torch.from_numpy(f["logits"].astype(np.float64))
    isc = isc_features_to_metric(logits, splits=10, shuffle=True, rng_seed=2020)
    check("IS (fidelity) mean", fidelity["inception_score"], isc["inception_score_mean"])
    check("IS (fidelity) std", fidelity["inception_score_std"], isc["inception_score_std"])
    assert n <= 5000
    check("IS (adm, 1 split) mean", adm["inception_score"],
          isc_features_to_metric(logits, splits=1, shuffle=False)["inception_score_mean"])

    prc = prc_features_to_metric(torch.from_numpy(pool).float(), torch.from_numpy(ref_pool).float(),
                                 prc_neighborhood=3, prc_batch_size=10000, save_cpu_ram=False, verbose=False)
    # torch-fidelity returns the fraction as a float32 mean: compare the counts of points inside a ball, exactly.
    n_ref = ref_pool.shape[0]
    check("precision (samples inside)", round(adm["precision"] * n), round(prc["precision"] * n), rtol=0)
    check("recall (references inside)", round(adm["recall"] * n_ref), round(prc["recall"] * n_ref), rtol=0)
    kid_args = dict(kid_subsets=100, kid_subset_size=1000, rng_seed=2020, kid_kernel="poly", verbose=False,
                    kid_kernel_poly_degree=3, kid_kernel_poly_gamma=None, kid_kernel_poly_coef0=1)
    assert adm["kid_subset_size"] == 1000 and adm["kid_subsets"] == 100
    kid = kid_features_to_metric(torch.from_numpy(pool.astype(np.float64)),
                                 torch.from_numpy(ref_pool.astype(np.float64)), **kid_args)
    check("KID mean", adm["kid_mean"], kid["kernel_inception_distance_mean"])
    check("KID std", adm["kid_std"], kid["kernel_inception_distance_std"])
    kid32 = kid_features_to_metric(torch.from_numpy(pool), torch.from_numpy(ref_pool), **kid_args)
    print(f"{'KID mean, fidelity on fp32':28s} {kid32['kernel_inception_distance_mean']:.12g} (float32 kernels; "
          f"rel {abs(kid32['kernel_inception_distance_mean'] - adm['kid_mean']) / abs(adm['kid_mean']):.2e}, "
          "not checked)")
    if failures:
        print("FAIL:", ", ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
