#!/usr/bin/env bash
# Twenty-second GPU call (kind nvidia-h200), from the repository root, ending by 300 s: packed
# batches built from flat lists (packed_batch cost 15x less CPU than in runs 18-21, where
# torch.repeat_interleave and nested torch.tensor calls dominated it). eval_speed.py token budgets
# padded against packed; train_speed.py on PIQA, 124M batch 16, ddp fp32 and bf16, padded against
# packed. Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=300
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

eval_speed_budgets 16384,32768
grep -A14 "Token budgets" "$OUT/eval_speed.md" | grep "^| "

budget=$(( $(left) - 10 ))
echo "== train_speed PIQA 124m batch 16, $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa \
  --piqa "$PIQA" --world-size 1 --tokenizer "$TOK" --batch-size "124m=16,tiny=2" \
  --plan "124m:ddp-fp32,ddp-fp32-packed,ddp-bf16,ddp-bf16-packed" --steps "124m=25,tiny=3" \
  --warmup "124m=5,tiny=1" --compare-to ddp-fp32 --target '' --config-timeout 100 \
  --budget-s $(( budget - 10 )) --out "$OUT/train_speed_piqa_124m_b16.json" >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
grep "^| 1 " "$OUT/train_speed_piqa_124m_b16.md"
