#!/usr/bin/env bash
# Twenty-fourth GPU call (kind nvidia-h200), from the repository root, ending by 520 s: what is
# in the way of the sharded engines' 1.3x over DDP bf16. SDPA backends on the training shapes
# (attention_probe.py); synthetic training at world size 1 with the GPU time of profiled steps
# by kernel kind (train_speed.py --profile-steps), 124M batch 32 and 1.5B batch 16; PIQA batches
# at 1.5B (batch 16 and 64), padded against packed, for ddp, fsdp2 and fairscale, after the
# packed_batch CPU fix. Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=520
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

if [ "${BENCH_TINY:-0}" != 1 ]; then
  echo "== attention_probe" | tee -a "$LOG"
  timeout -k 5 60 $PY benchmarks/attention_probe.py --out "$OUT/attention_probe.json" \
    >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  cat "$OUT/attention_probe.md"
fi

sharded="bf16-compile-fused"
budget=$(( ($(left) - 20) / 2 ))
echo "== train_speed synthetic, profiled, $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" --batch-size "124m=32,1.5b=16,tiny=2" --steps "124m=8,1.5b=5,tiny=2" \
  --warmup "124m=3,1.5b=2,tiny=1" --profile-steps 3 --compare-to ddp-bf16 --target '' \
  --plan "124m:ddp-bf16,ddp-$sharded,fairscale-$sharded,fsdp2-$sharded" \
  --plan "1.5b:ddp-bf16,ddp-$sharded,fairscale-$sharded,fsdp2-$sharded" \
  --config-timeout 100 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
grep "^| 1 " "$OUT/train_speed_synth.md"

for batch in 64 16; do
  budget=$(( $(left) - 10 ))
  [ "$batch" = 64 ] && budget=$(( budget / 2 ))
  echo "== train_speed PIQA 1.5b batch $batch, $budget s" | tee -a "$LOG"
  timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa \
    --piqa "$PIQA" --world-size 1 --tokenizer "$TOK" --batch-size "1.5b=$batch,tiny=2" \
    --plan "1.5b:ddp-bf16,ddp-bf16-packed,fsdp2-bf16-packed,fairscale-bf16-packed" \
    --steps "1.5b=20,tiny=3" --warmup "1.5b=5,tiny=1" --compare-to ddp-bf16 --target '' \
    --config-timeout 100 --budget-s $(( budget - 10 )) \
    --out "$OUT/train_speed_piqa_1.5b_b$batch.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "^| 1 " "$OUT/train_speed_piqa_1.5b_b$batch.md"
done
