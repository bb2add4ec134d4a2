#!/usr/bin/env bash
# Eighteenth GPU call (kind nvidia-h200), from the repository root, ending by 540 s: sequence
# packing. The GPU-only model tests (packed vs padded on a GPU among them); eval_speed.py token
# budgets, packed against padded, with packed rows of 512 and 256 tokens; train_speed.py on
# PIQA at world size 1, packed against padded: batch 16 (the FairScale issue's workload) and 64.
# (eval_speed.py's --packed-row-tokens was removed after this run.)
# Ran at ecc7733, when packing was the default and `-padded` configs opted out; since then
# packing is opt-in (`-packed` configs, `pack_sequences`).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=540
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

gpu_tests tests/test_model.py

for rows in 512 256; do
  echo "== eval_speed, packed rows of $rows tokens" | tee -a "$LOG"
  TOKENIZERS_PARALLELISM=true timeout -k 10 100 $PY benchmarks/eval_speed.py "${TINY[@]}" \
    --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 4096 --single-queries 20 \
    --repeats 5 --variants '' --token-budgets 16384,32768 --budget-batch-size 4096 \
    --packed-row-tokens "$rows" --budget-s 80 --out "$OUT/eval_speed_rows$rows.json" \
    >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  cat "$OUT/eval_speed_rows$rows.md"
done

budget=$(( $(left) - 10 ))
echo "== train_speed PIQA ws1, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa --piqa "$PIQA" \
  --world-size 1 --tokenizer "$TOK" --batch-size 124m=16,tiny=2 \
  --plan 124m:ddp-fp32,ddp-fp32-padded,fairscale-bf16-ckpt,fairscale-bf16-ckpt-padded,ddp-bf16-compile-fused,ddp-bf16-compile-fused-padded \
  --steps 124m=30,tiny=3 --warmup 124m=5,tiny=1 --compare-to ddp-fp32-padded \
  --target fairscale-bf16-ckpt --config-timeout 80 --budget-s $(( budget / 2 )) \
  --out "$OUT/train_speed_piqa_b16.json" >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_piqa_b16.md" | head -20

budget=$(( $(left) - 10 ))
echo "== train_speed PIQA ws1 batch 64, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa --piqa "$PIQA" \
  --world-size 1 --tokenizer "$TOK" --batch-size 124m=64,tiny=4 \
  --plan 124m:ddp-bf16,ddp-bf16-padded,fairscale-bf16-ckpt,fairscale-bf16-ckpt-padded \
  --steps 124m=20,tiny=3 --warmup 124m=5,tiny=1 --compare-to ddp-bf16-padded --target '' \
  --config-timeout 80 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_piqa_b64.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_piqa_b64.md" | head -20
