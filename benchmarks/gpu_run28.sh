#!/usr/bin/env bash
# Twenty-eighth GPU call (kind nvidia-h200), from the repository root, ending by 170 s: the 124M
# comparison in the steady state. In runs 25-26 compiled steps ran slow for the first 10-20 steps
# of a process and then settled ~25 % faster (e.g. ~195 -> ~145 ms at batch 64), while the eager
# baseline stayed steady; five warm-up steps measured a mix. Here 25 warm-up steps, 15 timed, batch
# 64, two fresh rounds of ddp-bf16, fairscale-bf16-compile-fused, fsdp2-bf16-compile-fused.
# Needs .whl/ carried; writes under $OUT.
set -u -o pipefail
DEFAULT_TOTAL_S=170
NEEDS_PIQA=0
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

for round in 1 2; do
  budget=$(( ($(left) - 5) / (3 - round) ))
  name="train_speed_synth_124m_b64_warm25_round$round"
  echo "== $name, $budget s" | tee -a "$LOG"
  timeout -k 5 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
    --tokenizer "$TOK" --batch-size "124m=64,tiny=2" --steps "124m=15,tiny=2" \
    --warmup "124m=25,tiny=1" --compare-to ddp-bf16 --target '' --config-timeout 45 \
    --plan "124m:ddp-bf16,fairscale-bf16-compile-fused,fsdp2-bf16-compile-fused" \
    --budget-s $(( budget - 5 )) --out "$OUT/$name.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "^| 1 " "$OUT/$name.md" | cut -d'|' -f4-12
done
