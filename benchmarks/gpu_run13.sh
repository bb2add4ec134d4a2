#!/usr/bin/env bash
# Thirteenth GPU call (kind nvidia-h200), from the repository root, ending by 420 s:
#   1. train_profile.py on issue 3's step (PIQA, 124M, batch 16, one GPU): ddp 32-true,
#      fairscale bf16-mixed with and without checkpointing (run 12: 29 vs 106 ms per step);
#   2. the eval A/B of gpu_run12.sh (step tokenizing in parts of 512 examples vs one part), with
#      the time limit that run lacked.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=420
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

for run in "ddp 32-true" "fairscale bf16-mixed --checkpointing" "fairscale bf16-mixed"; do
  set -- $run
  name="$1-$2${3:+-ckpt}"
  echo "== train_profile $name" | tee -a "$LOG"
  timeout -k 10 90 $PY benchmarks/train_profile.py --piqa "$PIQA" --tokenizer "$TOK" \
    --engine "$1" --precision "$2" ${3:-} > "$OUT/train_profile_$name.txt" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "step wall" "$OUT/train_profile_$name.txt"
done

for parts in 512 100000; do
  echo "== eval_speed, tokenize examples $parts" | tee -a "$LOG"
  TOKENIZERS_PARALLELISM=true timeout -k 10 $(( ($(left) - 10) / 2 )) $PY benchmarks/eval_speed.py \
    --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 4096 --single-queries 5 \
    --repeats 5 --variants '' --token-budgets 16384 --budget-batch-size 4096 \
    --tokenize-examples $parts --out "$OUT/eval_speed_parts$parts.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep -E "^\| (bf16|32|4096)" "$OUT/eval_speed_parts$parts.md"
done
