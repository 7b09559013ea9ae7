#!/usr/bin/env python3
"""Every number in a Markdown document's tables must come from a raw file under docs/results/.

A table with numbers in its body is preceded (after the previous table or heading) by a line
    <!-- raw: docs/results/FILE [docs/results/DIR/*.json ...] [labels=N] -->
naming the files (globs allowed) its figures were read from. A body number is traced when one of those files holds
a number that rounds to it at the table's precision, directly or as a percentage of a fraction (0.8529 -> 85.29 %);
durations ("13 min 40 s", "30.4 min") are compared as seconds; a figure that is the ratio of two traced figures of its row
(a speed-up, the ends of a range of per-round ratios) counts as traced. In a column whose header says "×", a ratio in
brackets after a figure must equal that figure over the column's baseline (the first "(1.00)"). Header rows, the
first N (labels=N) columns, `code spans`, link targets and numbers inside words (MoH-ViT-Nano-90, XL/2, bf16, H100,
2e-3) are not figures; nor is a block between "<!-- moh COMMAND: begin -->" and its end, a command's output that a test
compares with the command. Exit 1 listing every untraced number and every table without a source; used by the ctest results_tables.

    trace_numbers.py DOC [DOC ...]      (run from the repository root)
"""
import bisect
import glob
import os
import re
import sys

RAW_ROOT = "docs/results/"
MARKER = re.compile(r"<!--\s*raw:\s*(.*?)\s*-->")
# A block a command writes and a test compares with that command's output (tests/cli_test.sh: moh info
# --attention-paths) holds the program's answer, not a measurement.
GENERATED = re.compile(r"^<!-- (moh [^:]*): begin -->$")
NUMBER = re.compile(r"(?<![\w/.\-+])[-+−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w/])|(?<![\w/.\-+,])[-+−]?\d+(?:\.\d+)?(?![\w/]|\.\d)")
NOT_FIGURES = [re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"), re.compile(r"<[^>]*>")]
THOUSANDS = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])")
RAW_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")  # not digits of a hash or a name


DURATION = re.compile(r"(?<![\w.])(\d+) min (\d+) s\b|(?<![\w.])(\d+(?:\.\d+)?) min\b")
RATIO = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?)\**\s*\((\d+\.\d+)\)")


def number(text):
    """(value, decimals) of a table number."""
    plain = text.replace("−", "-").replace(",", "")
    return abs(float(plain)), len(plain.split(".")[1]) if "." in plain else 0


def figures(cell, ratio_column):
    """(text, seconds, tolerance) of every figure in a table cell: durations ("13 min 40 s", "30.4 min") in seconds,
    and in a "×" column the ratio in brackets after a figure left to the ratio rule."""
    for pattern in NOT_FIGURES:
        cell = pattern.sub(" ", cell)
    if ratio_column:
        cell = RATIO.sub(lambda m: m.group(1), cell)
    for m in DURATION.finditer(cell):
        if m.group(3):
            value, decimals = number(m.group(3))
            yield m.group(0), value * 60, 0.5 * 10 ** (-decimals) * 60
        else:
            yield m.group(0), int(m.group(1)) * 60 + int(m.group(2)), 0.5
    for m in NUMBER.finditer(DURATION.sub(" ", cell)):
        value, decimals = number(m.group(0))
        yield m.group(0), value, 0.5 * 10 ** (-decimals)


def ratio_errors(rows, doc, start):
    """In a column whose header says "×", each "x (r)" must hold r = x / b, b the figure of the column's first
    "(1.00)" cell (the baseline row): the ratios are checked against the table's own traced figures."""
    header = rows[0].strip("|").split("|")
    errors = []
    for col, name in enumerate(header):
        if "×" not in name:
            continue
        cells = [(start + 2 + k, row.strip("|").split("|")) for k, row in enumerate(rows[2:])]
        pairs = [(n, float(m.group(1).replace(",", "")), m.group(2))
                 for n, c in cells if col < len(c) for m in RATIO.finditer(c[col].replace("*", ""))]
        base = next((x for _, x, r in pairs if float(r) == 1.0), None)
        if base is None:
            errors += [f"{doc}:{start}: column '{name.strip()}' has ratios but no (1.00) baseline row"] if pairs else []
            continue
        for n, x, r in pairs:
            decimals = len(r.split(".")[1])
            if abs(x / base - float(r)) > 0.5 * 10 ** (-decimals) * (1 + 1e-9):
                errors.append(f"{doc}:{n}: ratio ({r}) is not {x} / {base} = {x / base:.{decimals + 2}f}")
    return errors


class RawNumbers:
    """The numbers of a set of raw files, sorted, with their ×100 (fractions read as percentages)."""

    def __init__(self, paths):
        values = []
        for path in paths:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            # Commas separate JSON values ("[394.97,426.04]") and group thousands ("3,121 MB"): both readings count.
            found = [m.group(0) for m in RAW_NUMBER.finditer(text)]
            found += [m.group(0).replace(",", "") for m in THOUSANDS.finditer(text)]
            for v in (abs(float(x)) for x in found):
                values.extend((v, v * 100))
        self.values = sorted(values)

    def holds(self, value, tolerance):
        half = tolerance * (1 + 1e-9)
        i = bisect.bisect_left(self.values, value - half)
        return i < len(self.values) and self.values[i] <= value + half


def sources(spec, doc, line):
    """The raw files a marker names; errors for a pattern outside docs/results/ or matching nothing."""
    paths, errors = [], []
    for pattern in spec.split():
        found = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if not pattern.startswith(RAW_ROOT):
            errors.append(f"{doc}:{line}: raw source {pattern} is not under {RAW_ROOT}")
        elif not found:
            errors.append(f"{doc}:{line}: raw source {pattern} matches no file")
        paths.extend(found)
    return paths, errors


def tables(lines):
    """(first line number, rows, marker spec or None, marker line) of each table; a heading forgets the marker."""
    marker, marker_line, i = None, 0, 0
    while i < len(lines):
        m = MARKER.search(lines[i])
        if m:
            marker, marker_line = m.group(1), i + 1
        elif GENERATED.match(lines[i]):
            marker, marker_line = "generated", i + 1
        elif lines[i].startswith("#"):
            marker = None
        if lines[i].startswith("|"):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            yield start + 1, lines[start:i], marker, marker_line
            marker = None
            continue
        i += 1


def check(doc):
    errors, traced = [], 0
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for start, rows, spec, spec_line in tables(lines):
        spec, labels = label_columns(spec)
        ratio_cols = ["×" in name for name in rows[0].strip("|").split("|")]
        numbers = []
        for k, row in enumerate(rows[2:]):
            cells = row.strip("|").split("|")
            for col in range(labels, len(cells)):
                ratio = col < len(ratio_cols) and ratio_cols[col]
                numbers += [(start + 2 + k, fig) for fig in figures(cells[col], ratio)]
        if not numbers:
            continue
        if spec is None:
            errors.append(f"{doc}:{start}: table with {len(numbers)} numbers has no <!-- raw: FILES --> line above it")
            continue
        if spec == "generated":
            continue
        paths, bad = sources(spec, doc, spec_line)
        errors += bad + ratio_errors(rows, doc, start)
        raw = RawNumbers(paths)
        found = [raw.holds(value, tolerance) for _, (_, value, tolerance) in numbers]
        for i, (n, (text, value, tolerance)) in enumerate(numbers):
            row = [fig for j, (m, fig) in enumerate(numbers) if m == n and found[j]]
            if found[i] or is_quotient(value, tolerance, row):
                traced += 1
            else:
                errors.append(f"{doc}:{n}: {text} is in none of {spec} (nor a ratio of its row's traced figures)")
    return errors, traced


def is_quotient(value, tolerance, row):
    """Whether a figure is a ratio a / b of two traced figures of its row (a speed-up, a per-round ratio, the end of
    a range of them), within its own rounding and that of a and b."""
    for _, a, ta in row:
        for _, b, tb in row:
            if a is b or b == 0 or a == 0:
                continue
            q = a / b
            if abs(q - value) <= tolerance + q * (ta / a + tb / b) + 1e-12:
                return True
    return False


def label_columns(spec):
    """A marker's files and its "labels=N": the first N columns name the rows (an epoch, a setting) and hold no
    figures."""
    if spec is None:
        return None, 0
    m = re.search(r"\blabels=(\d+)", spec)
    return re.sub(r"\blabels=\d+", "", spec).strip(), int(m.group(1)) if m else 0


def main():
    if len(sys.argv) < 2:
        print("usage: trace_numbers.py DOC [DOC ...]", file=sys.stderr)
        return 2
    status = 0
    for doc in sys.argv[1:]:
        errors, traced = check(doc)
        for e in errors:
            print("error: " + e, file=sys.stderr)
        print(f"{doc}: {traced} table numbers traced to raw files, {len(errors)} problems")
        status |= 1 if errors else 0
    return status


if __name__ == "__main__":
    sys.exit(main())
