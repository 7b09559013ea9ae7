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
    """An (N, H, W, C) uint8 tensor (C 1 or 3) over the caller's memory (no copy), as ADM's sample batches store it."""
    t = array.detach() if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
    if t.dtype != torch.uint8 or t.dim() != 4 or t.shape[-1] not in (1, 3) or t.shape[0] == 0:
        raise ValueError(f"moh_torch.metrics: {name} must be uint8 images (N, H, W, 1 or 3), NHWC as ADM's .npz "
                         f"batches, got {t.dtype} {list(t.shape)}")
    return t


def _source(value, name, folder):
    """What `moh fid` takes for a reference: a path or spec as given, images written to an .npz (arr_0) in `folder`."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    path = os.path.join(folder, f"{name}.npz")
    np.savez(path, arr_0=_images(value, name).cpu().numpy())
    return path


def fid_report(samples, reference, features, metrics="all", is_mode="adm", resize="tf1", batch_size=64,
               device="auto"):
    """The report `moh fid --json` prints, as a dict (report["metrics"]: fid, sfid, is, precision, recall, kid...).

    samples: what moh fid takes (an ADM .npz, an image folder, fashion_mnist:test[:N]) or images in memory, a uint8
    array or tensor (N, H, W, C): read batch_size images at a time from it, never copied whole (50,000 images of
    256 x 256 need no disk space and no second 9.8 GB). reference: the same, or stored statistics (an array is
    written to a temporary .npz). features: the feature network (inception:WEIGHTS, classifier:RUN_DIR,
    dinov2:WEIGHTS). metrics: "all" or names among fid, sfid, is, pr, kid. is_mode: adm or fidelity; resize: tf1 or
    pytorch. Bad input raises ValueError with the command's message."""
    args = (_metric_list(metrics), is_mode, resize, int(batch_size), device)
    with tempfile.TemporaryDirectory(prefix="moh_torch_") as folder:
        ref = _source(reference, "reference", folder)
        if isinstance(samples, (str, os.PathLike)):
            text = ops.fid_report(os.fspath(samples), ref, features, *args)
        else:
            text = ops.fid_report_images(_images(samples, "samples"), ref, features, *args)
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
