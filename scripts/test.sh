#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite — both tiers: the default one
# (`pytest -q`) and the slow one (faults, torchrun, SLURM, every parity mode and family, the long
# lm-eval comparisons) — with lint and type checks (package and benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tango_fairscale tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest -q -m "slow or not slow" --durations=20
