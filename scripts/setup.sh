#!/usr/bin/env bash
# Create .venv in the repository and install crl into it, from nothing.
# torch==2.13.0 goes first: it is the CPU build that lies on this machine's disk; an
# unpinned torch would pull a CUDA build of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.crl-setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev,bench]"
# The peers the parity tests compare against, without their dependencies: their loss modules
# need only torch, and their full dependency trees (torchvision, opencv, ...) do not import here.
.venv/bin/python -m pip install -q --no-deps open-clip-torch==3.3.0 libauc==2.0.1
echo "$want" > "$stamp"
