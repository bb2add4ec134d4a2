#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite — both tiers: the default one
# (`pytest -q`) and the slow one (faults, torchrun, SLURM, every parity mode and family, the long
# lm-eval comparisons) — with lint and type checks (package and benchmarks).
#
# The suite runs as three pytest sessions side by side, because one session leaves a core idle a
# third of the time (its own work is one process; its process groups wait on each other):
#   * the package's own tests (tests/parallel, tests/train, tests/model, tests/evaluation,
#     tests/compat, unit and integration: tests/integration/<the same>; tests/data, tests/tasks,
#     tests/records, tests/results, tests/helpers); the parity runs of the first three
#     (tests/integration/{parallel,train,model}) train together in one process group per world
#     size, so those must share one session;
#   * the commands' tests (tests/test_*.py, tests/runtime, tests/integration/{commands,runtime}:
#     tango run, torchrun, SLURM, the results CLI, ...) and, to even the shares, the generation
#     comparison with lm-eval (tests/integration/evaluation/test_generation_exact.py);
#   * the tests that mostly wait — on kills, timeouts and whole reruns of `tango run` (the faults
#     of a 2-process run, the cache reruns): ~210 s for ~105 CPU-seconds, which the other two
#     sessions fill.
# The second and third sessions' output is printed after the first's. Each session keeps to one
# intra-op thread (OMP_NUM_THREADS=1, as under torchrun): sessions of two threads each would
# oversubscribe the cores. mypy checks meanwhile; its report comes last. Any of these failing
# fails the command.
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
package+=(tests/integration/evaluation/test_{generation_ranks,in_loop_suite_ranks}.py)
package+=(tests/integration/evaluation/test_{lm_eval_exact,scoring_ranks}.py tests/integration/compat)
package+=(tests/data tests/tasks tests/records tests/results tests/helpers)
pytest_args=(-q -m "slow or not slow" --durations=10)
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

waiting=(tests/integration/train/test_faults.py tests/integration/commands/test_cache_reruns.py)

.venv/bin/mypy > "$scratch/mypy.txt" 2>&1 &
mypy_pid=$!
commands=()
for path in "${package[@]}" "${waiting[@]}"; do commands+=(--ignore="$path"); done
.venv/bin/python -m pytest "${pytest_args[@]}" --basetemp="$scratch/commands" "${commands[@]}" \
  > "$scratch/commands.txt" 2>&1 &
commands_pid=$!
.venv/bin/python -m pytest "${pytest_args[@]}" --basetemp="$scratch/waiting" "${waiting[@]}" \
  > "$scratch/waiting.txt" 2>&1 &
waiting_pid=$!

own=(--ignore=tests/integration/train/test_faults.py)
package_status=0
.venv/bin/python -m pytest "${pytest_args[@]}" --basetemp="$scratch/package" "${own[@]}" \
  "${package[@]}" || package_status=$?
commands_status=0
wait "$commands_pid" || commands_status=$?
echo "--- the commands' tests (run alongside)"
cat "$scratch/commands.txt"
waiting_status=0
wait "$waiting_pid" || waiting_status=$?
echo "--- the tests that mostly wait (run alongside)"
cat "$scratch/waiting.txt"
types_status=0
wait "$mypy_pid" || types_status=$?
echo "--- mypy"
cat "$scratch/mypy.txt"
for status in "$package_status" "$commands_status" "$waiting_status" "$types_status"; do
  if [ "$status" -ne 0 ]; then exit "$status"; fi
done
