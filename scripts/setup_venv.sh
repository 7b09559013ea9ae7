#!/usr/bin/env bash
# The project-local virtual environment .venv/ with the pinned packages of scripts/requirements-torch2.txt: the
# LibTorch 2.x of the pip build (torch 2.14.1, CUDA 13.0, with its nvidia-* runtime wheels) and the Python reference
# packages the tests compare against (diffusers, safetensors, torch-fidelity, pytorch-fid, torchdiffeq, torchvision,
# timm, tensorboard, numpy, scipy).
# Called by `MOH_LIBTORCH=pip scripts/setup.sh`. Idempotent:
#   - the venv is left alone when it was built from the same requirements file (hash in .venv/.moh-requirements.sha256);
#   - wheels are downloaded once into $MOH_CACHE_DIR/wheels (default ~/.cache/moh/wheels) and installed from there
#     with --no-index, so a second run (or a second clone on this machine) downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

REQ=scripts/requirements-torch2.txt
VENV=.venv
CACHE=${MOH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moh}/wheels
PY=${MOH_PYTHON:-python3}
want=$(sha256sum "$REQ" | cut -d' ' -f1)

if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.moh-requirements.sha256" 2>/dev/null)" = "$want" ]; then
  echo "setup: $VENV is up to date ($REQ)"
  exit 0
fi

command -v "$PY" >/dev/null || { echo "error: setup: $PY not found (set MOH_PYTHON to a Python 3.10-3.14)" >&2; exit 2; }
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$pyver" in
  3.1[0-4]) ;;
  *) echo "error: setup: $PY is Python $pyver: torch 2.14.1 wheels need 3.10 to 3.14 (set MOH_PYTHON)" >&2; exit 2 ;;
esac

mkdir -p "$CACHE"
start=$(date +%s)
before=$(du -sb "$CACHE" | cut -f1)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# Offline first: everything may already be in the cache.
if ! "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$CACHE" -r "$REQ" 2>/dev/null; then
  echo "setup: downloading the pinned wheels into $CACHE (first run: about 2.9 GB)"
  "$VENV/bin/pip" download -q --disable-pip-version-check --only-binary=:all: -d "$CACHE" -r "$REQ"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$CACHE" -r "$REQ"
fi
after=$(du -sb "$CACHE" | cut -f1)
echo "$want" > "$VENV/.moh-requirements.sha256"
echo "setup: $VENV ready in $(( $(date +%s) - start )) s (downloaded $(( (after - before) / 1000000 )) MB;" \
     "$("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
