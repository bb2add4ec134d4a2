#!/usr/bin/env bash
# Sixteenth GPU call (kind nvidia-h200), from the repository root, ending by 260 s: after the
# forward stopped transformers' per-forward packed-sequence check (a host read of a GPU tensor):
# the GPU-only loss tests, eval_speed.py (token budgets only, bf16 and fp32) and train_speed.py
# synthetic 124M batch 32 (ddp-bf16 baseline and ddp-bf16-compile-fused).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=260
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

gpu_tests tests/test_model.py

eval_speed_budgets 8192,16384,32768
cat "$OUT/eval_speed.md"

budget=$(( $(left) - 10 ))
echo "== train_speed synthetic 124M, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" --batch-size 124m=32,tiny=2 --plan 124m:ddp-bf16,ddp-bf16-compile-fused \
  --steps 124m=8,tiny=3 --warmup 124m=3,tiny=1 --compare-to ddp-bf16 --target '' \
  --config-timeout 80 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth_ws1.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_synth_ws1.md"
