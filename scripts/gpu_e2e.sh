#!/usr/bin/env bash
# End-to-end `tango run configs/gpt2_piqa.jsonnet` on a GPU machine, as users run it, then the
# results table: ddp, fairscale and fsdp2 on a GPT-2 124M shape over every visible GPU (E2E_DEVICES
# to override), pipe as one process over them on a SmolLM2-135M-shaped Llama (random weights; the
# GPT-2 tokenizer's vocabulary), and the fixed cost of a command: an evaluation-only run, then the
# same command again (every step from the cache). Needs .whl/ and .gpudata/ carried (see
# benchmarks/README.md).
#   OUT=/tmp/out bash scripts/gpu_e2e.sh
set -u -o pipefail
DEFAULT_TOTAL_S=240
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh
GPT2=/tmp/gpt2-124m-random
LLAMA=/tmp/smollm2-135m-shape
$PY - "$TOK" "$GPT2" "$LLAMA" <<'PYEOF' >>"$LOG" 2>&1
import os
import sys

from tango_fairscale.model.causal_lm import ModelWrapper

gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12}
llama = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
         "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
         "max_position_embeddings": 2048, "rope_theta": 100000.0, "tie_word_embeddings": True,
         "vocab_size": 50257}
if os.environ.get("BENCH_TINY") == "1":  # CPU smoke test
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 256}
    llama = {**llama, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1}
ModelWrapper(config=gpt2, tokenizer=sys.argv[1], seed=1).save(sys.argv[2])
ModelWrapper(config=llama, tokenizer=sys.argv[1], seed=1).save(sys.argv[3])
PYEOF
WS=/tmp/e2e-ws
GPUS=${E2E_DEVICES:-$(nvidia-smi -L 2>/dev/null | grep -c ^GPU)}
[ "$GPUS" -ge 1 ] || GPUS=1  # CPU smoke test: one process
for engine in ddp fairscale fsdp2 pipe; do
  devices=$GPUS model=$GPT2 name=$engine
  [ "$engine" = pipe ] && devices=1 model=$LLAMA name=pipe-llama
  start=$(date +%s)
  timeout -k 10 120 $PY -m tango run configs/gpt2_piqa.jsonnet -w "$WS" -n "$name" \
    -D model="$model" -D data_dir="$PIQA" -D engine="$engine" -D device_count="$devices" \
    -D train_steps="${E2E_STEPS:-40}" -D batch_size=32 -D lr=1e-4 -D limit=512 \
    -D validate_every=20 -D log_every=5 -D precision=bf16-mixed >>"$LOG" 2>&1
  echo "== $name: rc=$? in $(( $(date +%s) - start )) s"
done
for attempt in first cached; do  # the fixed cost of a command: scoring 1,838 examples is < 1 s
  start=$(date +%s%N)
  $PY -m tango run configs/gpt2_piqa.jsonnet -w "$WS" -n "evaluate-$attempt" -D model="$GPT2" \
    -D data_dir="$PIQA" -D train_steps=0 -D precision=bf16-mixed >>"$LOG" 2>&1
  echo "== evaluation-only run ($attempt): rc=$? in $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
$PY -m tango_fairscale.cli results -w "$WS" | tee "$OUT/results.txt"
$PY -m tango_fairscale.cli results -w "$WS" --plot "$OUT/curves.png" >/dev/null 2>&1
grep -h "Error\|error" "$LOG" | sort | uniq -c | sort -rn | head -10
echo "== total $(elapsed) s"
