"""studies/stats.py against known answers: Student-t critical values from printed tables (e.g. NIST/SEMATECH's), an
interval worked by hand, the paired differences, and the verdict rule on each side of the goal. Run:
.venv/bin/python studies/test_stats.py (ctest: studies_stats)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stats  # noqa: E402


class Stats(unittest.TestCase):
    def test_t_critical_matches_the_printed_table(self):
        for df, t in [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (10, 2.228), (20, 2.086),
                      (30, 2.042), (100, 1.984)]:
            self.assertAlmostEqual(stats.t_critical(df), t, places=3, msg=f"df {df}")
        # Not the normal quantile: a 10-30-row table's interval is wider than 1.96 sigma/sqrt(n).
        self.assertGreater(stats.t_critical(15), 2.13)
        self.assertAlmostEqual(stats.t_critical(10 ** 7), 1.95996, places=4)

    def test_interval_by_hand(self):
        m, h = stats.interval([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3: h = t(2) / sqrt(3)
        self.assertEqual(m, 2.0)
        self.assertAlmostEqual(h, 4.302653 / 3 ** 0.5, places=5)
        self.assertEqual(stats.interval([5.0]), (5.0, None))
        m99, h99 = stats.interval([1.0, 2.0, 3.0], confidence=0.99)
        self.assertAlmostEqual(h99, 9.924843 / 3 ** 0.5, places=5)

    def test_paired_relative(self):
        self.assertEqual(stats.paired_relative([11.0, 9.0], [10.0, 10.0]), [10.0, -10.0])
        with self.assertRaises(ValueError):
            stats.paired_relative([1.0], [1.0, 2.0])

    def test_verdict_on_each_side_of_the_goal(self):
        self.assertEqual(stats.verdict(1.0, 2.0, 5.0), "met")  # [-1, 3] within 5
        self.assertEqual(stats.verdict(8.0, 2.0, 5.0), "not met")  # [6, 10] beyond 5
        self.assertEqual(stats.verdict(4.0, 2.0, 5.0), "undecided")  # [2, 6] straddles 5
        self.assertEqual(stats.verdict(4.0, None, 5.0), "undecided (one seed)")
        self.assertEqual(stats.fmt(1.25, 0.5, " %"), "+1.2 % [+0.8, +1.8]")

    def test_compare_by_hand(self):
        # d = [0.1, 0.2, 0.3]: mean 0.2, sd 0.1, n 3; 90 %: t(2) 2.919986, half 0.1686; 95 %: 4.302653, half 0.2484.
        v, why = stats.compare([0.1, 0.2, 0.3], 0.5)
        self.assertEqual(v, "equal")  # [0.031, 0.369] within ±0.5
        self.assertIn("[+0.03, +0.37]", why)
        self.assertEqual(stats.compare([0.1, 0.2, 0.3], 0.3)[0], "undecided")  # 0.369 > 0.3; 95 % [-0.05, 0.45]
        self.assertEqual(stats.compare([1.0, 1.1, 1.2], 0.5)[0], "better")  # 95 % [0.75, 1.35] above 0
        self.assertEqual(stats.compare([1.0, 1.1, 1.2], 0.5, higher_is_better=False)[0], "worse")
        self.assertEqual(stats.compare([-1.0, -1.1, -1.2], 0.5)[0], "worse")
        self.assertEqual(stats.compare([-1.0, 1.0, 0.0], 0.5)[0], "undecided")
        self.assertEqual(stats.compare([0.2], 0.5), ("undecided", "one pair"))


if __name__ == "__main__":
    unittest.main()
