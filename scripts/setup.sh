#!/usr/bin/env bash
# Create .venv with the pinned dependency set and this package (editable, with dev tools).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, so that nothing pulls a newer (multi-GB CUDA) build.
.venv/bin/python -m pip install -q --no-compile -c constraints.txt torch
# Bytecode for everything installed but the libraries' own test folders, this package included
# (installed editable), on every core (pip compiles every file, one at a time: about 20 s more on
# two cores). -qq and no status check: a few third-party files are written for newer Pythons and
# do not compile (pip skips them the same way); they are never imported. torch's first (a fifth
# of the ~23 s), while the rest installs.
bytecode=(.venv/bin/python -m compileall -qq -j 0 -x '/tests?/')
"${bytecode[@]}" .venv/lib/python*/site-packages/torch > /dev/null &
torch_bytecode=$!
# The rest through uv (pinned like everything else): the same resolved set as pip's, installed
# in ~8 s where pip takes ~30 s on two cores. It finds torch installed and leaves it.
.venv/bin/python -m pip install -q -c constraints.txt uv
.venv/bin/uv pip install -q --python .venv/bin/python -c constraints.txt -e '.[dev]'
wait "$torch_bytecode" || true
"${bytecode[@]}" .venv/lib/python*/site-packages tango_fairscale || true
# lm-eval's index of its tasks (~14,000 YAML files parsed, 7 s on two cores) is kept in a cache
# file per installation: built here once instead of by the first command that names a task.
.venv/bin/python -c "from tango_fairscale.tasks.builtin import builtin_index; builtin_index()"
