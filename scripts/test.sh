#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, lint and type checks (package and benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tango_fairscale tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest -q
