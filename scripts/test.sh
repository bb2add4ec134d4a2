#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite — both tiers: the default one
# (`pytest -q`) and the slow one (faults, torchrun, SLURM, every parity mode and family, the long
# lm-eval comparisons) — with lint and type checks (package and benchmarks).
#
# The suite runs on two pytest-xdist workers, one per core, each taking the next unit of work as
# it finishes one (`--dist loadscope`; tests/conftest.py makes the units: a module's tests, and all
# the tests that read parity runs, which train together). Each worker keeps to one intra-op
# thread (OMP_NUM_THREADS=1, as under torchrun): two of two threads each would oversubscribe the
# cores. mypy checks meanwhile; its report comes last. Either failing fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tango_fairscale tests benchmarks

export OMP_NUM_THREADS=1
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

.venv/bin/mypy > "$scratch/mypy.txt" 2>&1 &
mypy_pid=$!
tests_status=0
.venv/bin/python -m pytest -q -m "slow or not slow" -n 2 --dist loadscope --no-loadscope-reorder \
  --durations=10 --basetemp="$scratch/tests" || tests_status=$?
types_status=0
wait "$mypy_pid" || types_status=$?
echo "--- mypy"
cat "$scratch/mypy.txt"
for status in "$tests_status" "$types_status"; do
  if [ "$status" -ne 0 ]; then exit "$status"; fi
done
