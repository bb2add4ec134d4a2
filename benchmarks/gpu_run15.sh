#!/usr/bin/env bash
# Fifteenth GPU call (kind nvidia-h200), from the repository root, ending by 240 s: as gpu_run14.sh,
# after bf16 scoring on GPUs had its GEMM write fp32 logits itself (addmm out_dtype) instead of
# converting bf16 logits: the GPU-only loss tests, eval_speed.py
# as in gpu_run8.sh, and eval_profile.py (bf16, 16384-token batches).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=240
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

echo "== GPU tests" | tee -a "$LOG"
TANGO_FAIRSCALE_SHARED_DATA=.gpudata timeout -k 10 60 $PY -m pytest -q -p no:cacheprovider \
  tests/test_model.py 2>&1 | tail -2 | tee -a "$LOG"

echo "== eval_speed" | tee -a "$LOG"
TOKENIZERS_PARALLELISM=true timeout -k 10 120 $PY benchmarks/eval_speed.py "${TINY[@]}" \
  --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 128 --single-queries 50 \
  --repeats 5 --variants fp32 --token-budgets 8192,16384,32768 --budget-batch-size 4096 \
  --budget-s 100 --out "$OUT/eval_speed.json" >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/eval_speed.md"

echo "== eval_profile" | tee -a "$LOG"
TOKENIZERS_PARALLELISM=true timeout -k 10 $(( $(left) - 5 )) $PY benchmarks/eval_profile.py \
  --piqa "$PIQA" --tokenizer "$TOK" --precision bf16-mixed --batch-size 4096 \
  --max-batch-tokens 16384 > "$OUT/eval_profile.txt" 2>&1
echo "== rc=$? after $(elapsed) s"
grep "step wall" "$OUT/eval_profile.txt"
