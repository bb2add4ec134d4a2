#!/usr/bin/env bash
# Twentieth GPU call (kind nvidia-h200), from the repository root, ending by 560 s: packed rows
# now as wide as the longest segment (runs 18-19: 512-token rows lost to padded batches where
# few rows carried the masked attention). GPU-only model tests; eval_speed.py token budgets
# packed against padded; train_speed.py on PIQA at world size 1, packed against padded: 124M
# batch 16 (ddp fp32 / bf16, fairscale bf16 + checkpointing), 1.5B ddp bf16 at batch 64 and 16.
# Ran at 990f769, when packing was the default and `-padded` configs opted out; since then
# packing is opt-in (`-packed` configs, `pack_sequences`).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=560
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

gpu_tests tests/test_model.py

eval_speed_budgets 16384,32768
grep -A14 "Token budgets" "$OUT/eval_speed.md"

# train_speed_piqa NAME SECONDS BATCH PLAN COMPARE_TO
train_speed_piqa() {
  echo "== train_speed PIQA $1, $2 s" | tee -a "$LOG"
  timeout -k 10 "$2" $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa --piqa "$PIQA" \
    --world-size 1 --tokenizer "$TOK" --batch-size "$3" --plan "$4" \
    --steps 124m=25,1.5b=15,tiny=3 --warmup 124m=5,1.5b=5,tiny=1 --compare-to "$5" \
    --target '' --config-timeout 150 --budget-s $(( $2 - 10 )) --out "$OUT/$1.json" \
    >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "^| 1 " "$OUT/$1.md"
}
train_speed_piqa train_speed_piqa_124m_b16 150 124m=16,tiny=2 \
  124m:ddp-fp32,ddp-fp32-padded,ddp-bf16,ddp-bf16-padded,fairscale-bf16-ckpt,fairscale-bf16-ckpt-padded \
  ddp-fp32-padded
train_speed_piqa train_speed_piqa_1.5b_b64 $(( ($(left) - 20) / 2 )) 1.5b=64,tiny=4 \
  1.5b:ddp-bf16,ddp-bf16-padded ddp-bf16-padded
train_speed_piqa train_speed_piqa_1.5b_b16 $(( $(left) - 10 )) 1.5b=16,tiny=2 \
  1.5b:ddp-bf16,ddp-bf16-padded ddp-bf16-padded
