#!/usr/bin/env bash
# Ninth GPU call (kind nvidia-h200), from the repository root, ending by 330 s: train_speed.py
# synthetic seq 1024, world size 1, with twice the rows of gpu_run6 (124M batch 32, 1.5B batch 16):
# more tokens per step for the same Python work per step (the 124M step left the GPU idle a
# quarter of the time). Baseline ddp-bf16 at the same batch, in the same run.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=330
NEEDS_PIQA=0
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

budget=$(( $(left) - 10 ))
echo "== train_speed synthetic, world size 1, batch x2, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" --batch-size 124m=32,1.5b=16,tiny=2 \
  --plan 124m:ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-fused,fsdp2-bf16-compile-fused \
  --plan 1.5b:ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-fused,fsdp2-bf16-compile-fused \
  --steps 124m=8,1.5b=5,tiny=3 --warmup 124m=3,1.5b=2,tiny=1 --compare-to ddp-bf16 --target '' \
  --config-timeout 80 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth_ws1_b2x.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_synth_ws1_b2x.md"
