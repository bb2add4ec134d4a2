#!/usr/bin/env bash
# Twenty-ninth GPU call (kind nvidia-h200), from the repository root, ending by 560 s: the user's
# path at HEAD on one GPU — `tango run configs/gpt2_piqa.jsonnet` with every engine
# (scripts/gpu_e2e.sh: 124M shape, bf16-mixed, packed batches as the config sets them), then the
# GPU-only tests (compiled loss, packed batches on a GPU, 16-mixed through every engine) and the
# PIQA evaluation speed (token budget 16384, padded and packed).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=560
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

echo "== e2e, $(( $(left) - 230 )) s" | tee -a "$LOG"
BENCH_SKIP_INSTALL=1 timeout -k 10 $(( $(left) - 230 )) bash scripts/gpu_e2e.sh
echo "== e2e rc=$? after $(elapsed) s"

GPU_TESTS_TIMEOUT=$(( $(left) - 110 )) gpu_tests tests/test_model.py tests/engines/test_base.py

eval_speed_budgets 16384
grep -A14 "Token budgets" "$OUT/eval_speed.md" | grep "^| "
echo "== total $(elapsed) s"
