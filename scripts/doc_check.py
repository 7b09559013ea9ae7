#!/usr/bin/env python3
"""The prose of the user documents: references for users, never a diary, never a dead link.

Fails (exit 1, one line per place) on
  - words about how the work was organised rather than what it found: issue numbers, loans, sessions, turns, times
    of day, parts of a day ("issue 55", "the next loan", "this session", "at 14:05", "an evening job");
  - a cited file that does not exist: a relative Markdown link or image, or a `code span` naming a file of this
    repository (a top-level folder of it, then a path with an extension).
and, in the pages of published figures (README.md, docs/BENCHMARKS.md),
  - a measured figure whose raw file is not named: a table of figures without a `<!-- raw: FILES -->` line above it
    (or naming no existing file), a paragraph with a duration, percentage, ratio, rate or size that links no file
    under docs/results/;
  - a commit hash in the README's prose (history lives in docs/results/ and git).
Fenced code blocks are commands and their output, and are not prose; code spans are checked only as file names.

    doc_check.py DOC [DOC ...]      (run from the repository root)
"""
import os
import re
import sys

ORGANISATION = [
    (re.compile(r"\bissues? #?\d+", re.I), "an issue number"),
    (re.compile(r"\b(loans?|lent)\b", re.I), "the device loan"),
    (re.compile(r"\bsessions?\b", re.I), "the working session"),
    (re.compile(r"\b(this|last|next|previous) turn\b", re.I), "the working turn"),
    (re.compile(r"\bnext (GPU )?(run|call|machine)\b", re.I), "what the next run will do"),
    (re.compile(r"(?<![\d:.\w])([01]?\d|2[0-3]):[0-5]\d(:[0-5]\d)?\s*(UTC|am|pm)?(?![\d:])"), "a time of day"),
    (re.compile(r"\b(evening|morning|afternoon|tonight|overnight)\b", re.I), "a time of day"),
]
FIGURE = re.compile(r"\d+ min \d+ s\b|\d(?:\.\d+)? ?(?:%|×|x\b|s\b|ms\b|img/s|GiB|GB|MB|GFLOP/s|TFLOP/s)|\bFID \d")
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
RESULTS_LINK = re.compile(r"\]\((?:\.\./)*(?:docs/)?results/[^)]*\)")
FOLDERS = "scripts|studies|bench|configs|docs|tests|core|vision|diffusion|eval|experiments|apps|datasets"
CODE_FILE = re.compile(r"`((?:%s)/[\w./+-]*\.\w+)`" % FOLDERS)
LINK = re.compile(r"\]\(([^)\s]+)\)|<img[^>]*src=\"([^\"]+)\"")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks"""
    fenced = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line.rstrip("\n")


def problems(path):
    base = os.path.dirname(path)
    for n, line in prose_lines(path):
        for m in CODE_FILE.finditer(line):
            if "*" not in m.group(1) and not os.path.exists(m.group(1)):
                yield f"{path}:{n}: cites {m.group(1)}, which does not exist"
        for m in LINK.finditer(line):
            target = (m.group(1) or m.group(2)).split("#")[0]
            if target and not re.match(r"^[a-z]+:", target) and not os.path.exists(os.path.join(base, target)):
                yield f"{path}:{n}: links {target}, which does not exist"
        prose = re.sub(r"`[^`]*`", " ", re.sub(r"\]\([^)]*\)|<[^>]*>", " ", line))
        for pattern, what in ORGANISATION:
            m = pattern.search(prose)
            if m:
                yield f"{path}:{n}: \"{m.group(0)}\" is about how the work was organised ({what}), not about results"


def paragraphs(path):
    """(first line number, text) of each prose paragraph: consecutive lines outside code blocks, tables and comments."""
    start, text = 0, []
    for n, line in list(prose_lines(path)) + [(0, "")]:
        plain = line.strip()
        if plain and not plain.startswith(("|", "<!--", "#")):
            start, text = start or n, text + [plain]
            continue
        if text:
            yield start, " ".join(text)
        start, text = 0, []


def is_figure_page(path):
    """The pages of published figures: a repository's README.md (not a study page's) and BENCHMARKS.md."""
    name, parts = os.path.basename(path), os.path.normpath(os.path.abspath(path)).split(os.sep)
    return name == "BENCHMARKS.md" or (name == "README.md" and "docs" not in parts[:-1])


def figure_problems(path):
    """Figures of README.md / docs/BENCHMARKS.md that name no raw file; commit hashes in the README's prose."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import trace_numbers
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for start, rows, spec, spec_line in trace_numbers.tables(lines):
        ratio_cols = ["×" in name for name in rows[0].strip("|").split("|")]
        spec, labels = trace_numbers.label_columns(spec)
        count = sum(1 for row in rows[2:] for col, cell in enumerate(row.strip("|").split("|")[labels:], labels)
                    for _ in trace_numbers.figures(cell, col < len(ratio_cols) and ratio_cols[col]))
        if count and spec is None:
            yield f"{path}:{start}: a table of {count} figures names no raw file (a <!-- raw: FILES --> line above it)"
        elif count and spec != "generated":
            for bad in trace_numbers.sources(spec, path, spec_line)[1]:
                yield bad
    for n, text in paragraphs(path):
        bare = re.sub(r"`[^`]*`", " ", text)
        m = FIGURE.search(re.sub(r"\]\([^)]*\)|<[^>]*>", " ", bare))
        if m and not RESULTS_LINK.search(text):
            yield f"{path}:{n}: the figure \"{m.group(0)}\" names no raw file (link one under docs/results/)"
        if os.path.basename(path) == "README.md":
            for c in COMMIT.finditer(re.sub(r"\]\([^)]*\)|<[^>]*>", " ", bare)):
                yield f"{path}:{n}: commit hash {c.group(0)} in the README's prose (history lives in docs/results/)"


def main(paths):
    found = [p for path in paths for p in problems(path)]
    found += [p for path in paths if is_figure_page(path) for p in figure_problems(path)]
    for p in found:
        print("error: " + p)
    print(f"doc_check: {len(paths)} documents, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
