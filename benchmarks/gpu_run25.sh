#!/usr/bin/env bash
# Twenty-fifth GPU call (kind nvidia-h200), from the repository root, ending by 480 s: where the
# sharded engines' steps go on PIQA batches at world size 1 (train_speed.py --profile-steps: GPU
# busy against wall time, by kernel kind), with and without fused AdamW and compilation, at
# 1.5B batch 16 (packed) and at issue 3's 124M batch 16 workload (padded and packed); then the
# 124M synthetic 1.3x comparison of run 24 again with 20 timed steps.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=480
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

piqa_profiled() {  # NAME SHAPE BATCH SHARE_OF_TIME_LEFT PLAN
  local budget=$(( ($(left) - 10) * $4 / 100 ))
  echo "== train_speed PIQA $1, $budget s" | tee -a "$LOG"
  timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa \
    --piqa "$PIQA" --world-size 1 --tokenizer "$TOK" --batch-size "$2=$3,tiny=2" \
    --plan "$2:$5" --steps "$2=15,tiny=3" --warmup "$2=5,tiny=1" --profile-steps 3 \
    --compare-to "${COMPARE:-ddp-bf16-packed}" --target '' --config-timeout 90 \
    --budget-s $(( budget - 10 )) --out "$OUT/$1.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "^| 1 " "$OUT/$1.md"
}

piqa_profiled train_speed_piqa_1.5b_b16 1.5b 16 35 \
  "ddp-bf16-packed,ddp-bf16-fused-packed,fsdp2-bf16-packed,fsdp2-bf16-fused-packed,fairscale-bf16-packed,fairscale-bf16-fused-packed,fairscale-bf16-compile-fused-packed"
COMPARE=ddp-fp32 piqa_profiled train_speed_piqa_124m_b16 124m 16 65 \
  "ddp-fp32,ddp-fp32-packed,fairscale-bf16-ckpt,fairscale-bf16-ckpt-fused,fairscale-bf16-ckpt-fused-packed,fairscale-bf16-ckpt-compile-fused-packed,fsdp2-bf16-ckpt-fused-packed"

budget=$(( $(left) - 10 ))
echo "== train_speed synthetic 124m, $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" --batch-size "124m=32,tiny=2" --steps "124m=20,tiny=2" \
  --warmup "124m=5,tiny=1" --compare-to ddp-bf16 --target '' \
  --plan "124m:ddp-bf16,fairscale-bf16-compile-fused,fsdp2-bf16-compile-fused,ddp-bf16-compile-fused" \
  --config-timeout 60 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth_124m.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
grep "^| 1 " "$OUT/train_speed_synth_124m.md"
