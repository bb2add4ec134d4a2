#!/usr/bin/env bash
# Seventh GPU call (kind nvidia-h200-x2), from the repository root, ending by 300 s: issue 3's
# workload after the forward-gradient cross-entropy and vectorised collate: train_speed.py
# --data piqa, 124M, world size 2, batch 16 per GPU, ddp-fp32 against fairscale-bf16-ckpt
# (the target configuration) and fsdp2-bf16-ckpt.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=300
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

budget=$(( $(left) - 10 ))
echo "== train_speed --data piqa, world size 2, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa --piqa "$PIQA" \
  --tokenizer "$TOK" --world-size 2 \
  --plan 124m:ddp-fp32,fairscale-bf16-ckpt,fairscale-bf16-ckpt-fused,fsdp2-bf16-ckpt \
  --batch-size 16 --warmup 3 --steps 10 --compare-to ddp-fp32 --target fairscale-bf16-ckpt \
  --config-timeout 60 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_piqa.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
for f in "$OUT"/*.md; do echo "#### $f"; cat "$f"; done
