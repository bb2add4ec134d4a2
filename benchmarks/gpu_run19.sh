#!/usr/bin/env bash
# Nineteenth GPU call (kind nvidia-h200), from the repository root, ending by 480 s: packing at
# the 1.5B shape, where matrix products outweigh attention (at 124M, run 18, packed rows lost to
# padded ones). train_speed.py on PIQA at world size 1, ddp bf16 packed against padded, batch 64
# then 16. Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=480
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

for batch in 64 16; do
  budget=$(( $(left) - 10 ))
  [ "$batch" = 64 ] && budget=$(( budget * 3 / 5 ))
  echo "== train_speed PIQA 1.5B ws1 batch $batch, budget $budget s" | tee -a "$LOG"
  timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa \
    --piqa "$PIQA" --world-size 1 --tokenizer "$TOK" --batch-size "1.5b=$batch,tiny=2" \
    --plan 1.5b:ddp-bf16,ddp-bf16-padded --steps 1.5b=15,tiny=3 \
    --warmup 1.5b=5,tiny=1 --compare-to ddp-bf16-padded --target '' --config-timeout 150 \
    --budget-s $(( budget - 10 )) --out "$OUT/train_speed_piqa_1.5b_b$batch.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "^| 1 " "$OUT/train_speed_piqa_1.5b_b$batch.md"
done
