#!/usr/bin/env bash
# Thirty-second GPU call (kind nvidia-h200), from the repository root, ending by 300 s: where issue
# 3's gap comes from at world size 1 (PIQA batches of 16, 124M, padded, median step): the eager bf16
# model without sharding (`ddp-bf16`), FairScale per block without and with checkpointing, with
# the gathered parameters kept (`noreshard`), and the whole model as one unit (`root`), against
# `ddp-fp32`. Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=300
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

budget=$(( $(left) - 10 ))
echo "== train_speed PIQA 124m batch 16, $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa \
  --piqa "$PIQA" --world-size 1 --tokenizer "$TOK" --batch-size "124m=16,tiny=2" \
  --plan "124m:ddp-fp32,ddp-bf16,fairscale-bf16,fairscale-bf16-ckpt,fairscale-bf16-ckpt-noreshard,fairscale-bf16-root,ddp-fp32" \
  --steps "124m=25,tiny=3" --warmup "124m=8,tiny=1" --compare-to ddp-fp32 \
  --target fairscale-bf16-ckpt --config-timeout 60 --budget-s $(( budget - 10 )) \
  --out "$OUT/train_speed_piqa_124m_b16_gap.json" >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
grep "^| 1 " "$OUT/train_speed_piqa_124m_b16_gap.md"
