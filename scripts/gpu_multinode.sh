#!/usr/bin/env bash
# GPU checks of the launcher and fp16 paths on a 2-GPU machine (see README "Multi-node training"):
#   1. the GPU-only tests (tests/parallel/test_engine.py: fp16 overflow skipped and logged per engine);
#   2. configs/gpt2_piqa.jsonnet (124M-shaped GPT-2, fp32, NCCL) trained by single-node `tango run`
#      with 2 spawned processes, and the same training under torchrun: two "nodes" of one GPU each
#      (CUDA_VISIBLE_DEVICES 0 / 1, as on two machines), with and without hybrid_shard, and one node
#      of two GPUs; the largest weight difference to the single-node run goes to $OUT/multinode.json.
# Needs .whl/ and .gpudata/ carried (see benchmarks/README.md).
#   OUT=/tmp/out bash scripts/gpu_multinode.sh
set -u -o pipefail
DEFAULT_TOTAL_S=540
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh
export TANGO_FAIRSCALE_SHARED_DATA=$PWD/.gpudata

echo "== GPU tests"
$PY -m pytest -q -p no:cacheprovider tests/parallel/test_engine.py 2>&1 | tail -5 | tee -a "$LOG"

MODEL=/tmp/gpt2-124m-random
$PY - "$TOK" "$MODEL" <<'PYEOF' >>"$LOG" 2>&1
import os, sys
from tango_fairscale.model.causal_lm import ModelWrapper
shape = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
         "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
if os.environ.get("BENCH_TINY") == "1":  # CPU smoke test
    shape.update(n_layer=2, n_embd=32, n_head=2, n_positions=256)
ModelWrapper(config=shape, tokenizer=sys.argv[1], seed=1).save(sys.argv[2])
PYEOF
DEFINES=(-D model="$MODEL" -D data_dir="$PIQA" -D train_steps="${MN_STEPS:-30}" -D batch_size=32
         -D lr=1e-4 -D limit=512 -D validate_every=15 -D precision=32-true -D device_count=2)
HYBRID='{"steps.trained_model.engine.sharding.hybrid_shard": true}'

timed() {  # name, command...: run, log, print rc and seconds
  local name=$1; shift
  local start; start=$(date +%s)
  timeout -k 10 "${MN_TIMEOUT_S:-150}" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: rc=$? in $(( $(date +%s) - start )) s" | tee -a "$LOG"
}
two_nodes() {  # name, engine, extra tango args...: torchrun node 0 on GPU 0, node 1 on GPU 1
  local name=$1 engine=$2; shift 2
  local start; start=$(date +%s)
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node timeout -k 10 "${MN_TIMEOUT_S:-150}" $PY -m torch.distributed.run \
      --nnodes 2 --nproc-per-node 1 --node-rank $node --master-addr 127.0.0.1 --master-port 29555 \
      -m tango_fairscale run configs/gpt2_piqa.jsonnet -w "/tmp/ws-$name" "${DEFINES[@]}" \
      -D engine="$engine" "$@" >"$OUT/$name-node$node.log" 2>&1 &
  done
  wait %1; local rc0=$?; wait %2; local rc1=$?
  echo "== $name: rc=$rc0/$rc1 in $(( $(date +%s) - start )) s" | tee -a "$LOG"
}

for engine in fsdp2 fairscale; do
  timed "single-$engine" $PY -m tango run configs/gpt2_piqa.jsonnet -w "/tmp/ws-single-$engine" \
    "${DEFINES[@]}" -D engine="$engine"
done
two_nodes nodes-fsdp2 fsdp2
two_nodes nodes-fsdp2-hybrid fsdp2 -o "$HYBRID"
two_nodes nodes-fairscale fairscale
timed node-2gpu-fairscale $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
  -m tango_fairscale run configs/gpt2_piqa.jsonnet -w /tmp/ws-node-2gpu-fairscale \
  "${DEFINES[@]}" -D engine=fairscale

$PY - "$OUT/multinode.json" <<'PYEOF' 2>&1 | tee -a "$LOG"
import glob, json, os, subprocess, sys
import torch
from safetensors.torch import load_file

def weights(name):
    found = glob.glob(f"/tmp/ws-{name}/cache/TrainStep-*/model.safetensors")
    return load_file(found[0]) if found else None

def metrics(name):
    found = glob.glob(f"/tmp/ws-{name}/cache/*MetricsStep-*/data.json")
    return json.load(open(found[0])) if found else None

pairs = {"nodes-fsdp2": "single-fsdp2", "nodes-fsdp2-hybrid": "single-fsdp2",
         "nodes-fairscale": "single-fairscale", "node-2gpu-fairscale": "single-fairscale"}
rows = []
for run, reference in pairs.items():
    a, b = weights(run), weights(reference)
    diff = None if a is None or b is None else max(
        (a[k].float() - b[k].float()).abs().max().item() for k in b)
    rows.append({"run": run, "reference": reference, "max_abs_weight_diff": diff,
                 "metrics": metrics(run), "reference_metrics": metrics(reference)})
    print(f"{run:22s} vs {reference:18s} max |dw| = {diff}")
result = {
    "commit": os.environ.get("BENCH_COMMIT"), "torch": torch.__version__,
    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    "model": "GPT-2 124M shape, random init (seed 1), dropout 0", "precision": "32-true",
    "train_steps": int(os.environ.get("MN_STEPS", "30")), "batch_size": 32, "limit": 512,
    "runs": rows,
}
json.dump(result, open(sys.argv[1], "w"), indent=2)
PYEOF
echo "== total $(elapsed) s"
