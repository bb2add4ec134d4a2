#!/usr/bin/env bash
# Eighth GPU call (kind nvidia-h200), from the repository root, ending by 150 s: eval_speed.py
# (124M, step path with token budgets, fp32 and bf16-mixed, tokenizer thread pool on) after
# tokenizing ahead on a thread was dropped again (it measured slower than tokenizing first).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=150
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

eval_speed_standard eval_speed
