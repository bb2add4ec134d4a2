#!/usr/bin/env bash
# Twenty-sixth GPU call (kind nvidia-h200), from the repository root, ending by 470 s: is the
# sharded engines' 1.3x over DDP bf16 at GPT-2 124M (run 24: 1.40x / 1.35x; run 25, another host:
# 1.00x / 1.15x, its steps switching between two speeds mid-run) a property of the engines or of
# the moment? Three rounds, each a fresh train_speed.py run with its own DDP baseline, at batch
# 32 and 64: ddp-bf16, ddp-bf16-compile-fused, fairscale-bf16-compile-fused,
# fsdp2-bf16-compile-fused, 20 timed steps. Needs .whl/ carried; writes under $OUT.
set -u -o pipefail
DEFAULT_TOTAL_S=470
NEEDS_PIQA=0
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

configs="ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-compile-fused,fsdp2-bf16-compile-fused"
for round in 1 2 3; do
  for batch in 32 64; do
    runs_left=$(( (3 - round) * 2 + (batch == 32 ? 2 : 1) ))
    budget=$(( ($(left) - 5) / runs_left ))
    name="train_speed_synth_124m_b${batch}_round$round"
    echo "== $name, $budget s" | tee -a "$LOG"
    timeout -k 10 "$budget" $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 \
      --tokenizer "$TOK" --batch-size "124m=$batch,tiny=2" --steps "124m=20,tiny=2" \
      --warmup "124m=5,tiny=1" --compare-to ddp-bf16 --target '' --plan "124m:$configs" \
      --config-timeout 60 --budget-s $(( budget - 5 )) --out "$OUT/$name.json" >>"$LOG" 2>&1
    echo "== rc=$? after $(elapsed) s"
    grep "^| 1 " "$OUT/$name.md" | cut -d'|' -f4-9
  done
done
