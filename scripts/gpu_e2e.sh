#!/usr/bin/env bash
# End-to-end `tango run` of configs/gpt2_piqa.jsonnet on a GPU machine, every engine, then the
# results table: the user's path (Tango step, spawned NCCL workers, in-loop validation, export,
# cached evaluation) on GPUs. ddp, fairscale and fsdp2 train on every visible GPU (E2E_DEVICES to
# override), pipe as one process over them. Needs .whl/ and .gpudata/ carried (see
# benchmarks/README.md).
#   OUT=/tmp/out bash scripts/gpu_e2e.sh
set -u -o pipefail
DEFAULT_TOTAL_S=420
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh
MODEL=/tmp/gpt2-124m-random
$PY - "$TOK" "$MODEL" <<'PYEOF' >>"$LOG" 2>&1
import sys
from tango_fairscale.model.causal_lm import ModelWrapper
import os
shape = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12}
if os.environ.get("BENCH_TINY") == "1":  # CPU smoke test
    shape = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 256}
ModelWrapper(config=shape, tokenizer=sys.argv[1], seed=1).save(sys.argv[2])
PYEOF
WS=/tmp/e2e-ws
GPUS=${E2E_DEVICES:-$(nvidia-smi -L 2>/dev/null | grep -c ^GPU)}
[ "$GPUS" -ge 1 ] || GPUS=1  # CPU smoke test: one process
for engine in ddp fairscale fsdp2 pipe; do
  devices=$GPUS; [ "$engine" = pipe ] && devices=1
  start=$(date +%s)
  timeout -k 10 150 $PY -m tango run configs/gpt2_piqa.jsonnet -w "$WS" -n "$engine" \
    -D model="$MODEL" -D data_dir="$PIQA" -D engine="$engine" -D device_count="$devices" \
    -D train_steps="${E2E_STEPS:-60}" -D batch_size=32 -D lr=1e-4 -D limit=1024 -D validate_every=30 \
    -D precision=bf16-mixed >>"$LOG" 2>&1
  echo "== $engine: rc=$? in $(( $(date +%s) - start )) s"
done
$PY -m tango_fairscale.cli results -w "$WS" | tee "$OUT/results.txt"
$PY -m tango_fairscale.cli results -w "$WS" --plot "$OUT/curves.png" >/dev/null 2>&1
grep -h "Error\|error" "$LOG" | sort | uniq -c | sort -rn | head -10
echo "== total $(elapsed) s"
