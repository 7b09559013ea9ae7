"""The statistics of every study table: a mean with its Student-t interval (scipy.stats.t), paired relative
differences, and the verdict rule of a goal "A at most GOAL % above B" — met when the whole interval lies within
the goal, not met when the whole interval lies beyond it, undecided otherwise. Tested against known answers by
studies/test_stats.py. scipy is imported where an interval is computed, so that the parts of a study that only
decide (ct_plateau's stop rule) run with a bare python3 on a GPU machine."""
import math
import statistics


def t_critical(df, confidence=0.95):
    """the two-sided Student-t critical value for `df` degrees of freedom (4.303 for df 2, 2.228 for df 10)"""
    from scipy import stats  # noqa: PLC0415  (see the module docstring)

    return float(stats.t.ppf(0.5 + confidence / 2.0, df))


def interval(values, confidence=0.95):
    """mean and the half-width of its t-interval; the width is None with fewer than two values"""
    m = statistics.mean(values)
    if len(values) < 2:
        return m, None
    return m, t_critical(len(values) - 1, confidence) * statistics.stdev(values) / math.sqrt(len(values))


def paired_relative(a, b):
    """per pair the relative difference of a over b in per cent, 100 (a - b) / b (pairs: the same seed)"""
    if len(a) != len(b):
        raise ValueError(f"paired values of different lengths: {len(a)} and {len(b)}")
    return [100.0 * (x - y) / y for x, y in zip(a, b)]


def verdict(mean, half, goal):
    """the goal "at most `goal` % above": met / not met / undecided from a mean and its interval half-width"""
    if half is None:
        return "undecided (one seed)"
    if mean + half <= goal:
        return "met"
    if mean - half > goal:
        return "not met"
    return "undecided"


def compare(diffs, margin, higher_is_better=True):
    """The verdict on paired differences d = variant - reference (one per seed) against an equivalence margin:
      equal      the 90 % t-interval lies within (-margin, +margin): both one-sided tests reject at 5 % (TOST);
      better     the 95 % t-interval lies entirely on the better side of 0, and not within the margin;
      worse      the same on the worse side;
      undecided  otherwise (the interval straddles 0 and a margin edge, or there is one pair).
    Returns (verdict, why) with why naming the interval that decided."""
    if len(diffs) < 2:
        return "undecided", "one pair"
    m, h90 = interval(diffs, 0.90)
    _, h95 = interval(diffs, 0.95)
    lo90, hi90, lo95, hi95 = m - h90, m + h90, m - h95, m + h95
    if -margin < lo90 and hi90 < margin:
        return "equal", f"90 % interval [{lo90:+.2f}, {hi90:+.2f}] within ±{margin:g}"
    up = "better" if higher_is_better else "worse"
    down = "worse" if higher_is_better else "better"
    if lo95 > 0:
        return up, f"95 % interval [{lo95:+.2f}, {hi95:+.2f}] above 0"
    if hi95 < 0:
        return down, f"95 % interval [{lo95:+.2f}, {hi95:+.2f}] below 0"
    return "undecided", f"90 % interval [{lo90:+.2f}, {hi90:+.2f}] not within ±{margin:g}, 95 % [{lo95:+.2f}, {hi95:+.2f}] holds 0"


def fmt(mean, half, unit=""):
    """'+1.2 % [-0.3, +2.7]' (no interval with one value)"""
    if half is None:
        return f"{mean:+.1f}{unit}"
    return f"{mean:+.1f}{unit} [{mean - half:+.1f}, {mean + half:+.1f}]"
