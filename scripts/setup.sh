#!/usr/bin/env bash
# Create .venv with the pinned dependency set and this package (editable, with dev tools).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, so that nothing pulls a newer (multi-GB CUDA) build.
.venv/bin/python -m pip install -q --no-compile -c constraints.txt torch
.venv/bin/python -m pip install -q --no-compile -c constraints.txt -e '.[dev]'
# Bytecode for everything installed, on every core (pip compiles one file at a time: 20 s more on
# two cores). -qq and no status check: a few third-party files are written for newer Pythons and
# do not compile (pip skips them the same way); they are never imported.
.venv/bin/python -m compileall -qq -j 0 .venv/lib/python*/site-packages || true
