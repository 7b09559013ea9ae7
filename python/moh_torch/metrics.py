"""The generative metrics of `moh fid` from Python: the whole report through the command's own code (the same feature
network, the same numbers), and the ADM-exact pieces on features a user already has.

    report = moh_torch.metrics.fid_report(samples, "ref_stats.npz", features="inception:pt_inception.safetensors")
    report["metrics"]["fid"]
"""
import json
import os
import tempfile

import numpy as np
import torch

from . import _ops  # noqa: F401

ops = torch.ops.moh
METRICS = ("fid", "sfid", "is", "pr", "kid")


def _metric_list(metrics):
    if isinstance(metrics, str):
        return metrics
    names = list(metrics)
    for name in names:
        if name not in METRICS:
            raise ValueError(f"moh_torch.metrics: unknown metric {name!r} (valid: {', '.join(METRICS)} or 'all')")
    return ",".join(names)


def _images(array, name):
    """An (N, H, W, C) uint8 array (C 1 or 3) from a tensor or array, as ADM's sample batches store it."""
    a = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    if a.dtype != np.uint8 or a.ndim != 4 or a.shape[-1] not in (1, 3) or a.shape[0] == 0:
        raise ValueError(f"moh_torch.metrics: {name} must be uint8 images (N, H, W, 1 or 3), NHWC as ADM's .npz "
                         f"batches, got {a.dtype} {list(a.shape)}")
    return a if a.shape[-1] == 3 else np.repeat(a, 3, axis=-1)


def _source(value, name, folder):
    """What `moh fid` takes for `value`: a path or spec as given, images written to an .npz (arr_0) in `folder`."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    path = os.path.join(folder, f"{name}.npz")
    np.savez(path, arr_0=_images(value, name))
    return path


def fid_report(samples, reference, features, metrics="all", is_mode="adm", resize="tf1", batch_size=64,
               device="auto"):
    """The report `moh fid --json` prints, as a dict (report["metrics"]: fid, sfid, is, precision, recall, kid...).

    samples, reference: what moh fid takes (an ADM .npz, an image folder, fashion_mnist:test[:N]; for the reference
    also stored statistics), or images as a uint8 array or tensor (N, H, W, C). features: the feature network
    (inception:WEIGHTS, classifier:RUN_DIR, dinov2:WEIGHTS). metrics: "all" or names among fid, sfid, is, pr, kid.
    is_mode: adm or fidelity; resize: tf1 or pytorch. Bad input raises ValueError with the command's message."""
    with tempfile.TemporaryDirectory(prefix="moh_torch_") as folder:
        text = ops.fid_report(_source(samples, "samples", folder), _source(reference, "reference", folder), features,
                              _metric_list(metrics), is_mode, resize, int(batch_size), device)
    return json.loads(text)


def _features(x, name):
    t = torch.as_tensor(x)
    if t.dim() != 2 or not t.is_floating_point():
        raise ValueError(f"moh_torch.metrics: {name} must be floating-point features (N, D), got {t.dtype} "
                         f"{list(t.shape)}")
    return t


def gaussian_stats(features):
    """(mu, sigma) in float64: np.mean(axis=0) and np.cov(rowvar=False) of features (N, D)."""
    return ops.gaussian_stats(_features(features, "features"))


def frechet_distance(a, b):
    """FID between two feature sets (N, D), or between two (mu, sigma) pairs, as ADM's evaluator computes it."""
    mu1, s1 = a if isinstance(a, tuple) else gaussian_stats(a)
    mu2, s2 = b if isinstance(b, tuple) else gaussian_stats(b)
    return ops.frechet_distance(mu1, s1, mu2, s2)


def inception_score(logits, mode="adm"):
    """(mean, std) of the Inception Score of classifier logits (N, classes): adm (splits of 5000, std 0) or fidelity
    (torch-fidelity's 10 shuffled splits)."""
    return ops.inception_score(_features(logits, "logits"), mode)


def precision_recall(reference, samples):
    """(precision, recall) of sample features against reference features (ADM's manifold estimator, k = 3)."""
    return ops.precision_recall(_features(reference, "reference"), _features(samples, "samples"))


def kid(a, b, subsets=100, subset_size=1000):
    """(mean, std) of the Kernel Inception Distance of two feature sets, as torch-fidelity draws its subsets."""
    return ops.kid(_features(a, "a"), _features(b, "b"), subsets, subset_size)
