"""moh_torch.metrics against `moh fid` itself (the same report on the same inputs: images given as arrays, paths and
specs, stored statistics) and against numpy / scipy on feature arrays. The feature network is a tiny MoH-ViT-Nano
classifier the test trains with the `moh` program of the same build (MOH_BIN).

    MOH_BIN=build-torch2/moh .venv/bin/python -m unittest discover -s python/tests -p 'test_metrics.py'
"""
import gzip
import json
import os
import subprocess
import tempfile
import unittest
from unittest import mock

import numpy as np
import scipy.linalg
import scipy.special
import torch

from moh_torch import metrics

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MOH = os.environ.get("MOH_BIN", os.path.join(ROOT, "build-torch2", "moh"))
FASHION = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def fashion_images(count, offset=0):
    """Fashion-MNIST test images as (count, 28, 28, 1) uint8."""
    with gzip.open(FASHION) as f:
        data = np.frombuffer(f.read(), dtype=np.uint8, offset=16)
    return data.reshape(-1, 28, 28, 1)[offset:offset + count].copy()


def moh(*args):
    return subprocess.run([MOH, *args], check=True, capture_output=True, text=True, cwd=ROOT).stdout


@unittest.skipUnless(os.path.isfile(MOH), f"no moh program at {MOH}")
class SameReportAsTheCommand(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="moh_torch_metrics_")
        cls.run_dir = os.path.join(cls.tmp.name, "cls")
        moh("train", "configs/fashion_mnist/moh_vit_nano.yaml", "--run-dir", cls.run_dir, "--set", "train.max_steps=8",
            "--set", "data.limit_train=256", "--set", "data.limit_val=64", "--set", "train.processes=1",
            "--set", "train.precision=fp32")
        cls.features = f"classifier:{cls.run_dir}"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def command(self, samples, reference, *extra):
        return json.loads(moh("fid", "--samples", samples, "--ref", reference, "--features", self.features, "--json",
                              *extra))

    def assert_same_metrics(self, ours, theirs):
        self.assertEqual(sorted(ours["metrics"]), sorted(theirs["metrics"]))
        for key, value in theirs["metrics"].items():
            if isinstance(value, float):
                self.assertLessEqual(abs(ours["metrics"][key] - value), 1e-9 * max(1.0, abs(value)), key)
            else:
                self.assertEqual(ours["metrics"][key], value, key)

    def test_arrays_give_the_numbers_of_the_command_on_the_same_npz(self):
        samples, reference = fashion_images(300), fashion_images(400, offset=1000)
        rgb = lambda a: np.repeat(a, 3, axis=-1)  # noqa: E731
        np.savez(os.path.join(self.tmp.name, "s.npz"), arr_0=rgb(samples))
        np.savez(os.path.join(self.tmp.name, "r.npz"), arr_0=rgb(reference))
        theirs = self.command(os.path.join(self.tmp.name, "s.npz"), os.path.join(self.tmp.name, "r.npz"))
        ours = metrics.fid_report(torch.from_numpy(samples), reference, self.features)
        self.assert_same_metrics(ours, theirs)
        self.assertGreater(ours["metrics"]["fid"], 0)
        # in-memory samples are read from the caller's array a batch at a time, never written out
        with mock.patch.object(np, "savez", side_effect=AssertionError("the samples were written to disk")):
            streamed = metrics.fid_report(samples, os.path.join(self.tmp.name, "r.npz"), self.features)
        self.assert_same_metrics(streamed, theirs)

    def test_specs_stored_statistics_and_metric_subsets(self):
        stats = os.path.join(self.tmp.name, "ref.npz")
        moh("ref-stats", "--images", "fashion_mnist:test:500", "--out", stats, "--features", self.features)
        theirs = self.command("fashion_mnist:train:300", stats, "--metrics", "fid,is", "--is-mode", "fidelity")
        ours = metrics.fid_report("fashion_mnist:train:300", stats, self.features, metrics=["fid", "is"],
                                  is_mode="fidelity")
        self.assert_same_metrics(ours, theirs)

    def test_bad_input_is_a_value_error_with_the_command_message(self):
        with self.assertRaisesRegex(ValueError, "must be uint8 images"):
            metrics.fid_report(np.zeros((4, 28, 28), np.uint8), "fashion_mnist:test:8", self.features)
        with self.assertRaisesRegex(ValueError, "unknown metric 'fdi'"):
            metrics.fid_report("fashion_mnist:test:8", "fashion_mnist:test:8", self.features, metrics=["fdi"])
        with self.assertRaisesRegex(ValueError, "moh::fid_report: .*nonexistent"):
            metrics.fid_report("fashion_mnist:test:8", "/nonexistent.npz", self.features)


class FeaturePieces(unittest.TestCase):
    """The pieces on feature arrays, against numpy / scipy (pytorch-fid's formula)."""

    def setUp(self):
        g = np.random.default_rng(0)
        self.a = g.normal(size=(400, 16))
        self.b = g.normal(loc=0.2, size=(300, 16)) @ g.normal(size=(16, 16)) * 0.3

    def test_gaussian_stats_and_frechet_distance(self):
        mu, sigma = metrics.gaussian_stats(torch.from_numpy(self.a))
        np.testing.assert_allclose(mu.numpy(), self.a.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sigma.numpy(), np.cov(self.a, rowvar=False), rtol=1e-10, atol=1e-12)
        m1, s1, m2, s2 = self.a.mean(0), np.cov(self.a, rowvar=False), self.b.mean(0), np.cov(self.b, rowvar=False)
        covmean = scipy.linalg.sqrtm(s1 @ s2).real
        want = ((m1 - m2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean)
        got = metrics.frechet_distance(torch.from_numpy(self.a), torch.from_numpy(self.b))
        self.assertAlmostEqual(got, want, delta=1e-8 * abs(want))

    def test_precision_recall_and_kid_ranges(self):
        p, r = metrics.precision_recall(torch.from_numpy(self.a).float(), torch.from_numpy(self.a).float())
        self.assertEqual((p, r), (1.0, 1.0))  # every point lies in its own set's balls
        mean, std = metrics.kid(torch.from_numpy(self.a), torch.from_numpy(self.b), subsets=10, subset_size=100)
        self.assertGreater(mean, 0)
        self.assertGreater(std, 0)
        with self.assertRaisesRegex(ValueError, r"features \(N, D\)"):
            metrics.kid(torch.zeros(5), torch.zeros(5, 2))

    def test_kid_and_inception_score_against_torch_fidelity(self):
        """KID and IS (fidelity mode) equal torch-fidelity's own functions on the same arrays (its subsets and splits
        from numpy RandomState, as ours are drawn); IS in ADM's mode equals ADM's formula written here in numpy."""
        from torch_fidelity.metric_isc import isc_features_to_metric
        from torch_fidelity.metric_kid import kid_features_to_metric
        a, b = torch.from_numpy(self.a), torch.from_numpy(self.b)
        want = kid_features_to_metric(a, b, kid_subsets=7, kid_subset_size=150, rng_seed=2020, verbose=False)
        got = metrics.kid(a, b, subsets=7, subset_size=150)
        self.assertAlmostEqual(got[0], want["kernel_inception_distance_mean"], delta=1e-9 * abs(got[0]))
        self.assertAlmostEqual(got[1], want["kernel_inception_distance_std"], delta=1e-9 * abs(got[1]))
        logits = torch.from_numpy(np.random.default_rng(1).normal(scale=3.0, size=(700, 12)))
        want = isc_features_to_metric(logits, splits=10, shuffle=True, rng_seed=2020)
        got = metrics.inception_score(logits, mode="fidelity")
        self.assertAlmostEqual(got[0], want["inception_score_mean"], delta=1e-9 * got[0])
        self.assertAlmostEqual(got[1], want["inception_score_std"], delta=1e-9 * got[0])
        p = scipy.special.softmax(logits.numpy(), axis=1)  # ADM evaluator: one split (N < 5000), exp(E[KL(p || mean p)])
        adm = np.exp(np.mean(np.sum(p * (np.log(p) - np.log(p.mean(0, keepdims=True))), 1)))
        self.assertAlmostEqual(metrics.inception_score(logits, mode="adm")[0], adm, delta=1e-9 * adm)


if __name__ == "__main__":
    unittest.main()
