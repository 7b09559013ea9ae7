#!/usr/bin/env python3
"""The prose of the user documents: references for users, never a diary, never a dead link.

Fails (exit 1, one line per place) on
  - words about how the work was organised rather than what it found: issue numbers, loans, sessions, turns, times
    of day, parts of a day ("issue 55", "the next loan", "this session", "at 14:05", "an evening job");
  - a cited file that does not exist: a relative Markdown link or image, or a `code span` naming a file of this
    repository (a top-level folder of it, then a path with an extension).
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


def main(paths):
    found = [p for path in paths for p in problems(path)]
    for p in found:
        print("error: " + p)
    print(f"doc_check: {len(paths)} documents, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
