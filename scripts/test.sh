#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite — both tiers: the default one
# (`pytest -q`) and the slow one (faults, torchrun, SLURM, every parity mode and family, the long
# lm-eval comparisons) — with lint and type checks (package and benchmarks).
#
# The suite runs as two pytest sessions side by side, because one session leaves a core idle a
# third of the time (its own work is one process; its process groups wait on each other). They
# take about equal shares of the work:
#   * the package's own tests (tests/parallel, tests/train, tests/model, tests/evaluation,
#     tests/compat, unit and integration: tests/integration/<the same>; tests/data, tests/tasks,
#     tests/records, tests/results, tests/helpers); the parity runs of the first three
#     (tests/integration/{parallel,train,model}) train together in one process group per world
#     size, so those must share one session;
#   * the commands' tests (tests/test_*.py, tests/runtime, tests/integration/{commands,runtime}:
#     tango run, torchrun, SLURM, caching, the results CLI, ...) and, to even the shares, the
#     generation comparison with lm-eval and the in-loop suite on several ranks
#     (tests/integration/evaluation/test_{generation_exact,in_loop_suite_ranks}.py), printed after.
# Each session keeps to one intra-op thread (OMP_NUM_THREADS=1, as under torchrun): two sessions
# of two threads each would oversubscribe the cores. mypy checks meanwhile; its report comes
# last. Any of the three failing fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tango_fairscale tests benchmarks
# The tests' own bytecode (conftest and helpers are imported by every process a test starts),
# for environments that set PYTHONDONTWRITEBYTECODE.
.venv/bin/python -m compileall -q tests > /dev/null

export OMP_NUM_THREADS=1
package=(tests/parallel tests/train tests/model tests/evaluation tests/compat)
package+=(tests/integration/parallel tests/integration/train tests/integration/model)
package+=(tests/integration/evaluation/test_generation_ranks.py)
package+=(tests/integration/evaluation/test_{lm_eval_exact,scoring_ranks}.py tests/integration/compat)
package+=(tests/data tests/tasks tests/records tests/results tests/helpers)
pytest_args=(-q -m "slow or not slow" --durations=10)
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

.venv/bin/mypy > "$scratch/mypy.txt" 2>&1 &
mypy_pid=$!
commands=()
for path in "${package[@]}"; do commands+=(--ignore="$path"); done
.venv/bin/python -m pytest "${pytest_args[@]}" --basetemp="$scratch/commands" "${commands[@]}" \
  > "$scratch/commands.txt" 2>&1 &
commands_pid=$!

package_status=0
.venv/bin/python -m pytest "${pytest_args[@]}" --basetemp="$scratch/package" "${package[@]}" \
  || package_status=$?
commands_status=0
wait "$commands_pid" || commands_status=$?
echo "--- the commands' tests (run alongside)"
cat "$scratch/commands.txt"
types_status=0
wait "$mypy_pid" || types_status=$?
echo "--- mypy"
cat "$scratch/mypy.txt"
for status in "$package_status" "$commands_status" "$types_status"; do
  if [ "$status" -ne 0 ]; then exit "$status"; fi
done
