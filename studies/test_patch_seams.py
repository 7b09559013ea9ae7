"""studies/patch_seams.py against images whose answer is known: flat 4x4 blocks (every step on a grid line), a
horizontal ramp (the same step everywhere: ratio 1), blocks of the other spacing, and the embedded test set's 1.04.
Run: .venv/bin/python studies/test_patch_seams.py (ctest: studies_patch_seams)."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import patch_seams  # noqa: E402


class PatchSeams(unittest.TestCase):
    def test_blocks_ramp_and_spacing(self):
        rng = np.random.default_rng(0)
        blocks = np.kron(rng.integers(0, 256, (5, 7, 7)).astype(np.float64), np.ones((4, 4)))  # (5, 28, 28)
        border, inside, _ = patch_seams.seam_ratio(blocks, 4)
        self.assertGreater(border, 0)
        self.assertEqual(inside, 0)  # flat inside every block
        ramp = np.tile(np.arange(28, dtype=np.float64), (2, 28, 1))  # step 1 across columns, 0 across rows
        self.assertAlmostEqual(patch_seams.seam_ratio(ramp, 4)[2], 1.0)
        # 2x2 blocks seen at spacing 4: every 4-px line is a 2-px line, and one interior pair in three crosses one,
        # so the ratio is 3 up to the draws' spread.
        blocks2 = np.kron(rng.integers(0, 256, (5, 14, 14)).astype(np.float64), np.ones((2, 2)))
        ratio = patch_seams.seam_ratio(blocks2, 4)[2]
        self.assertGreater(ratio, 2.7)
        self.assertLess(ratio, 3.3)

    @unittest.skipUnless(os.path.exists(patch_seams.FASHION_MNIST_TEST), "dataset-fashion-mnist not installed")
    def test_fashion_mnist_has_no_grid(self):
        self.assertAlmostEqual(patch_seams.seam_ratio(patch_seams.fashion_mnist_test(), 4)[2], 1.043, places=3)


if __name__ == "__main__":
    unittest.main()
