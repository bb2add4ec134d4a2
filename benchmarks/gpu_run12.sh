#!/usr/bin/env bash
# Twelfth GPU call (kind nvidia-h200-x2, or nvidia-h200 with WORLD=1), from the repository root,
# ending by 420 s:
#   1. eval_speed.py, bf16 16384-token batches only, with the step tokenizing in parts of 512
#      examples and in one part (A/B of TOKENIZE_EXAMPLES; run 11 measured the parts slower);
#   2. issue 3's workload (PIQA, 124M, batch 16 per GPU, world size WORLD, default 2): ddp-fp32 against
#      fairscale-bf16-ckpt (the target) and the same with the new per-block compile.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=420
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

nvidia-smi topo -m 2>&1 | head -5 | tee -a "$LOG"
for parts in 512 100000; do
  echo "== eval_speed, tokenize examples $parts" | tee -a "$LOG"
  TOKENIZERS_PARALLELISM=true timeout -k 10 60 $PY benchmarks/eval_speed.py "${TINY[@]}" \
    --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 4096 --single-queries 5 \
    --repeats 5 --variants '' --token-budgets 16384 --budget-batch-size 4096 \
    --tokenize-examples $parts --out "$OUT/eval_speed_parts$parts.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep -E "^\| (bf16|32)" "$OUT/eval_speed_parts$parts.md"
done

budget=$(( $(left) - 10 ))
echo "== train_speed --data piqa, world size ${WORLD:-2}, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa --piqa "$PIQA" \
  --tokenizer "$TOK" --world-size "${WORLD:-2}" \
  --plan 124m:ddp-fp32,fairscale-bf16-ckpt,fairscale-bf16-ckpt-compile,fairscale-bf16-compile \
  --batch-size 16 --warmup 6 --steps 12 --compare-to ddp-fp32 --target fairscale-bf16-ckpt \
  --config-timeout 90 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_piqa.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_piqa.md"
