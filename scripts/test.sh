#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite — both tiers: the default one
# (`pytest -q`) and the slow one (faults, torchrun, SLURM, every parity mode and family, the long
# lm-eval comparisons) — with lint and type checks (package and benchmarks). mypy checks while
# the tests run (they leave a core idle a third of the time); its report follows theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tango_fairscale tests benchmarks
mypy_report="$(mktemp)"
.venv/bin/mypy > "$mypy_report" 2>&1 &
mypy_pid=$!
tests_status=0
.venv/bin/python -m pytest -q -m "slow or not slow" --durations=20 || tests_status=$?
types_status=0
wait "$mypy_pid" || types_status=$?
cat "$mypy_report"
rm -f "$mypy_report"
if [ "$tests_status" -ne 0 ]; then exit "$tests_status"; fi
exit "$types_status"
