#!/usr/bin/env bash
# Twenty-first GPU call (kind nvidia-h200), from the repository root, ending by 330 s: packing
# opt-in, packed rows of 512 tokens. GPU-only model tests; train_speed.py on PIQA at world size
# 1, padded against packed: 1.5B ddp bf16 at batch 64 (where run 19 measured packing 1.9x
# faster) and 124M ddp fp32 at batch 16 (where it measured slower).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=330
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

gpu_tests tests/test_model.py

for run in "1.5b 64 ddp-bf16" "124m 16 ddp-fp32"; do
  read -r shape batch config <<<"$run"
  budget=$(( $(left) - 10 ))
  [ "$shape" = 1.5b ] && budget=$(( budget * 3 / 5 ))
  echo "== train_speed PIQA $shape batch $batch, $budget s" | tee -a "$LOG"
  timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa \
    --piqa "$PIQA" --world-size 1 --tokenizer "$TOK" --batch-size "$shape=$batch,tiny=2" \
    --plan "$shape:$config,$config-packed" --steps "$shape=20,tiny=3" \
    --warmup "$shape=5,tiny=1" --compare-to "$config" --target '' --config-timeout 150 \
    --budget-s $(( budget - 10 )) --out "$OUT/train_speed_piqa_${shape}_b$batch.json" \
    >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "^| 1 " "$OUT/train_speed_piqa_${shape}_b$batch.md"
done
