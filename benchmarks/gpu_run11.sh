#!/usr/bin/env bash
# Eleventh GPU call (kind nvidia-h200), from the repository root, ending by 480 s: after the
# scoring step learned to tokenize in parts while the GPU scores (Scorer, at most 4 forwards
# queued) and the fairscale engine learned `compile` (per block, inside FairScale's wrappers):
#   1. eval_speed.py as in gpu_run8.sh, then eval_profile.py (bf16, 16384-token batches);
#   2. train_speed.py synthetic, world size 1: fairscale with compile against fsdp2 with compile
#      and the ddp-bf16 baseline (124M batch 32, 1.5B batch 16).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=480
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

eval_speed_standard eval_speed

echo "== eval_profile" | tee -a "$LOG"
TOKENIZERS_PARALLELISM=true timeout -k 10 60 $PY benchmarks/eval_profile.py --piqa "$PIQA" \
  --tokenizer "$TOK" --precision bf16-mixed --batch-size 4096 --max-batch-tokens 16384 \
  > "$OUT/eval_profile.txt" 2>&1
echo "== rc=$? after $(elapsed) s"
head -3 "$OUT/eval_profile.txt"

budget=$(( $(left) - 10 ))
echo "== train_speed synthetic, world size 1, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" --batch-size 124m=32,1.5b=16,tiny=2 \
  --plan 124m:ddp-bf16,fairscale-bf16-compile-fused,fsdp2-bf16-compile-fused \
  --plan 1.5b:ddp-bf16,fairscale-bf16-compile-fused,fsdp2-bf16-compile-fused \
  --steps 124m=8,1.5b=5,tiny=3 --warmup 124m=3,1.5b=2,tiny=1 --compare-to ddp-bf16 --target '' \
  --config-timeout 80 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth_ws1.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_synth_ws1.md"
