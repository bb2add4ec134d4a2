#!/usr/bin/env bash
# Tenth GPU call (kind nvidia-h200), from the repository root, ending by 560 s: after the loss's
# per-chunk cross-entropy and logit gradients were compiled into fused kernels on GPUs, and
# labels were left on the CPU (no device wait to pick the scored positions):
#   1. the GPU-only tests of the loss (compiled == full-logits cross-entropy; CPU or GPU labels);
#   2. eval_speed.py as in gpu_run8.sh (PIQA scoring step, token budgets, fp32 and bf16);
#   3. train_speed.py as in gpu_run9.sh (synthetic seq 1024, world size 1, 124M batch 32,
#      1.5B batch 16), baseline ddp-bf16 in the same run.
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=560
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

gpu_tests tests/test_model.py tests/engines/test_base.py

eval_speed_standard eval_speed

budget=$(( $(left) - 10 ))
echo "== train_speed synthetic, world size 1, budget $budget s" | tee -a "$LOG"
timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
  --tokenizer "$TOK" --batch-size 124m=32,1.5b=16,tiny=2 \
  --plan 124m:ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-fused,fsdp2-bf16-compile-fused \
  --plan 1.5b:ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-fused,fsdp2-bf16-compile-fused \
  --steps 124m=8,1.5b=5,tiny=3 --warmup 124m=3,1.5b=2,tiny=1 --compare-to ddp-bf16 --target '' \
  --config-timeout 80 --budget-s $(( budget - 10 )) --out "$OUT/train_speed_synth_ws1.json" \
  >>"$LOG" 2>&1
echo "== rc=$? after $(elapsed) s"
cat "$OUT/train_speed_synth_ws1.md"
