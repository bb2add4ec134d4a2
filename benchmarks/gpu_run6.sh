#!/usr/bin/env bash
# Sixth GPU call (kind nvidia-h200), from the repository root, ending by 400 s: the effect of
# the cross-entropy that computes its gradients in the forward (model.py), vectorised collate and
# tokenizing ahead (batching.py, evaluation.py), fused AdamW and DDP `compile`, on
#   (i)  eval_speed.py, 124M, the step path with token budgets, fp32 and bf16-mixed, tokenizer
#        thread pool on (as in a `tango run` process);
#   (ii) train_speed.py synthetic seq 1024, world size 1: 124M and 1.5B, every engine's best
#        configuration against the ddp-bf16 baseline of the same run.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=400
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

echo "== (i) eval_speed" | tee -a "$LOG"
TOKENIZERS_PARALLELISM=true timeout -k 10 110 $PY benchmarks/eval_speed.py "${TINY[@]}" \
  --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 128 --single-queries 50 \
  --repeats 3 --variants fp32 --token-budgets 8192,16384,32768 --budget-batch-size 4096 \
  --budget-s 95 --out "$OUT/eval_speed.json" >>"$LOG" 2>&1
echo "== (i) rc=$? after $(elapsed) s"

budget=$(( $(left) - 10 ))
echo "== (ii) train_speed synthetic, world size 1, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" \
  --plan 124m:ddp-bf16,ddp-bf16-fused,ddp-bf16-compile-fused,fairscale-bf16-fused,fsdp2-bf16-compile-fused \
  --plan 1.5b:ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-fused,fsdp2-bf16-compile-fused \
  --steps 124m=8,1.5b=5,tiny=3 --warmup 124m=3,1.5b=2,tiny=1 --compare-to ddp-bf16 --target '' \
  --config-timeout 80 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth_ws1.json" \
  >>"$LOG" 2>&1
echo "== (ii) rc=$? after $(elapsed) s"
for f in "$OUT"/*.md; do echo "#### $f"; cat "$f"; done
