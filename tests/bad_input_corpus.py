#!/usr/bin/env python3
"""The derived part of tests/bad_input_test.sh's corpus: bad values made from what the program itself declares, so
that a new config key, flag or environment variable is tried without anyone writing its case.
  config  every key of `moh config --schema`: the wrong type, each side of its range, a huge value or NaN, empty, an
          unknown choice, a scalar or a map where a list goes; for the keys naming files a directory, a named pipe
          and a dangling link (not an unreadable file: the tests run as root, whom permissions do not stop);
  flags   every flag that takes a value, of the commands in FLAG_BASES, given a value no flag takes;
  env     every variable of `moh info --environment`, given a value outside what it takes.
Prints one case per line, PATTERNS <TAB> ENV <TAB> ARG <TAB> ARG ...: the test runs `ENV moh ARG...` (ENV "-" for
none) and expects exit code 2, one stderr line `error: ...` that contains one of the |-separated PATTERNS (the key,
flag or variable, or the bad value), nothing created under OUT and no fixture changed. stdlib only.

    bad_input_corpus.py MOH FIXTURES OUT [KIND ...]      (KIND: config flags env; default all three)
"""
import re
import subprocess
import sys

NANO = "configs/fashion_mnist/moh_vit_nano.yaml"
BAD_FLAG_VALUE = "1e999x"
# Keys whose value names a file or directory the run reads, and how it is tried (train: checked before any work).
FILE_KEYS = ["model.weights", "train.repa.encoder", "diffusion.vae_weights"]
TINY = ["--set", "data.limit_train=128", "--set", "data.limit_val=64", "--set", "data.batch_size=32",
        "--set", "train.epochs=1", "--set", "train.max_steps=2", "--set", "train.processes=1"]
# Flags that name what a command writes (any fresh path is a good value) or that take any text.
FREE_FLAGS = {"out", "run-dir", "save-features", "help", "name"}


def schema(moh):
    text = subprocess.run([moh, "config", NANO, "--schema"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s+([\w.]+) \((.+?)\) = (.*?)\s+#", line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


def number(text):
    return int(float(text)) if float(text) == int(float(text)) else float(text)


def config_values(kind):
    """(value, why) pairs that a key of this schema type must refuse."""
    rng = re.search(r" in \[(\S+), (\S+)\]$", kind)
    base = kind[: rng.start()] if rng else kind
    lo, hi = (number(rng.group(1)), number(rng.group(2))) if rng else (None, None)
    # A few per key (each case costs a process start): the kinds that found bugs, the rest by the hand-written cases.
    if base == "integer":
        out = [("1.5", "wrong type"), ("", "empty")]
        if rng:
            out.append((str(hi + 1), "above the range (huge)"))
        return out
    if base == "number":
        out = [("fast", "wrong type"), ("", "empty")]
        if rng:
            out.append((repr(hi * 2 + 1), "above the range (huge)"))
        return out
    if base == "bool":
        return [("maybe", "wrong type")]
    if base.startswith("list of"):
        out = [("7", "a scalar for a list")]
        if rng:
            out.append(("[%s]" % (hi + 1), "an element above the range"))
        return out
    if "|" in base:
        return [("nonsense", "unknown choice")]
    return []  # free text (names, paths): the file keys below


def config_cases(moh, fixtures, out):
    for key, kind, _ in schema(moh):
        for value, _why in config_values(kind):
            yield key, "-", ["config", NANO, "--set", f"{key}={value}"]
    paths = {"a directory": f"{fixtures}/adir", "a named pipe": f"{fixtures}/fifo", "a dangling link":
             f"{fixtures}/dangling"}
    for key in FILE_KEYS:
        for path in paths.values():
            cfg = "configs/fashion_mnist/moh_sit_pixel.yaml" if key != "model.weights" else NANO
            extra = ["--set", "train.repa.depth=2", "--set", "train.repa.stage=2"] if "repa" in key else []
            if "vae" in key:  # read by the latent extraction (a latent DiT trains on its shards)
                yield f"{key}|{path}", "-", ["extract-latents", cfg, "--set", "diffusion.vae=sd", "--set",
                                             f"{key}={path}", "--out", f"{out}/l"]
                continue
            yield f"{key}|{path}", "-", ["train", cfg, *TINY, *extra, "--set", f"{key}={path}", "--run-dir", f"{out}/r"]


def help_flags(moh, command):
    text = subprocess.run([moh, *command, "--help"], capture_output=True, text=True).stdout
    return re.findall(r"--([\w-]+)(?:,[^ ]+)? arg", text)


def flag_bases(fixtures, out):
    """A valid invocation of each command whose flags are tried (the fixtures of tests/bad_input_test.sh)."""
    return {
        ("eval",): ["eval", NANO, "--checkpoint", f"{fixtures}/run", "--out", f"{out}/e"],
        ("sample",): ["sample", "--checkpoint", f"{fixtures}/dit", "--num-samples", "4", "--steps", "ddim2", "--out",
                      f"{out}/s"],
        ("fid",): ["fid", "--samples", "fashion_mnist:test:8", "--ref", "fashion_mnist:test:8", "--features",
                   f"classifier:{fixtures}/run", "--out", f"{out}/f"],
        ("ref-stats",): ["ref-stats", "--images", "fashion_mnist:test:8", "--out", f"{out}/r.npz", "--features",
                         f"classifier:{fixtures}/run"],
        ("ema", "reconstruct"): ["ema", "reconstruct", f"{fixtures}/phema", "--sigma-rel", "0.05", "--out",
                                 f"{out}/e"],
        ("compare",): ["compare", f"{fixtures}/run", f"{fixtures}/run"],
        ("convert",): ["convert", "--in", f"{fixtures}/run", "--out", f"{out}/c.safetensors"],
        ("info",): ["info"],
        ("train",): ["train", NANO, *TINY, "--run-dir", f"{out}/r"],
    }


def flag_cases(moh, fixtures, out):
    for command, base in flag_bases(fixtures, out).items():
        for flag in help_flags(moh, list(command)):
            if flag in FREE_FLAGS:
                continue
            args = list(base)
            if f"--{flag}" in args:  # replace the base's own value
                i = args.index(f"--{flag}")
                args[i + 1] = BAD_FLAG_VALUE
            else:
                args += [f"--{flag}", BAD_FLAG_VALUE]
            yield f"--{flag}|{flag.replace('-', '_')}|{BAD_FLAG_VALUE}", "-", args


def environment(moh):
    text = subprocess.run([moh, "info", "--environment"], capture_output=True, text=True, check=True).stdout
    return re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, re.M)


def env_values(takes):
    m = re.match(r"an integer in \[(-?\d+), (-?\d+)\]", takes)
    if m:
        return ["abc", str(int(m.group(1)) - 1), str(int(m.group(2)) + 1)]
    m = re.match(r"a number in \[(\S+), (\S+)\]", takes)
    if m:
        return ["abc", "1e300", "1e-9"]
    if takes.startswith("one of"):
        return ["nonsense", ""]
    return [""]


def env_cases(moh):
    for name, takes in environment(moh):
        for value in env_values(takes.strip()):
            yield name, f"{name}={value}", ["config", NANO]


def main():
    moh, fixtures, out = sys.argv[1:4]
    kinds = sys.argv[4:] or ["config", "flags", "env"]
    gens = {"config": lambda: config_cases(moh, fixtures, out), "flags": lambda: flag_cases(moh, fixtures, out),
            "env": lambda: env_cases(moh)}
    for kind in kinds:
        for pattern, env, args in gens[kind]():
            print("\t".join([pattern, env, *args]))


if __name__ == "__main__":
    main()
