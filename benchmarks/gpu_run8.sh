#!/usr/bin/env bash
# Eighth GPU call (kind nvidia-h200), from the repository root, ending by 150 s: eval_speed.py
# (124M, step path with token budgets, fp32 and bf16-mixed, tokenizer thread pool on) after
# tokenizing ahead on a thread was dropped again (it measured slower than tokenizing first).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=150
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

echo "== eval_speed" | tee -a "$LOG"
TOKENIZERS_PARALLELISM=true timeout -k 10 120 $PY benchmarks/eval_speed.py "${TINY[@]}" \
  --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 128 --single-queries 50 \
  --repeats 5 --variants fp32 --token-budgets 8192,16384,32768 --budget-batch-size 4096 \
  --budget-s 100 --out "$OUT/eval_speed.json" >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/eval_speed.md"
