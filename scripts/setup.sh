#!/usr/bin/env bash
# Create .venv with the pinned dependency set and this package (editable, with dev tools).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, so that nothing pulls a newer (multi-GB CUDA) build.
.venv/bin/python -m pip install -q -c constraints.txt torch
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
