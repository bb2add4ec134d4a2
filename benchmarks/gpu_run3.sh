#!/usr/bin/env bash
# Third GPU run, in ONE device call (kind nvidia-h200-x2), run from the repository root:
#
#   bash benchmarks/gpu_run3.sh          # the pipe engine vs one GPU; ends by BENCH_TOTAL_S (300 s)
#
# The issue's must-show for the pipe engine: a GPT-2 XL-shaped (1.5B) model split over the 2 GPUs
# by `tango_fairscale::pipe` (ONE process, stages on cuda:0 and cuda:1, balance automatic), its
# throughput (whole pipe and per device) and peak memory per device, against single-GPU training
# (ddp-bf16 at world size 1: the bare model, same batch) measured in the same run, with the GPipe
# bubble (S-1)/(M+S-1) next to the measured efficiency in the Markdown:
#   1.5B, batch 8 x seq 1024: ddp-bf16 (one GPU), pipe-bf16-c4, pipe-bf16-c8,
#        pipe-bf16-c8-ckpt-always, pipe-bf16-c8-ckpt-never (no recomputation: the bubble alone);
#        warmup 2, 5 timed steps;
#   124M, batch 16: ddp-bf16, pipe-bf16-c4, pipe-bf16-c4-b8_4 (blocks 8/4: the LM head's work on
#        the last stage evened out by hand); warmup 2, 8 timed steps.
# Default pipe checkpointing is except_last (FairScale's default).
#
# Needs, carried with the repository: .whl/ (bash ../shared/tools/gpu-wheels.sh .whl) and
# .gpudata/gpt2-tokenizer (or TOKENIZER_DIR); no PIQA. Writes under $OUT (3 files):
# train_speed_pipe.json/.md and log.txt (the full output). Set BENCH_COMMIT when the copy has no
# .git. CPU smoke test: BENCH_TINY=1 BENCH_SKIP_INSTALL=1 PYTHON=python OUT=/tmp/x bash ...
set -u -o pipefail

DEFAULT_TOTAL_S=300
NEEDS_PIQA=0
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

PLAN_124M=124m:ddp-bf16,pipe-bf16-c4,pipe-bf16-c4-b8_4
# --tiny has 2 blocks: b8_4 cannot apply there.
[ ${#TINY[@]} -gt 0 ] && PLAN_124M=124m:ddp-bf16,pipe-bf16-c4,pipe-bf16-c4-b1_1

budget=$(( $(left) - 20 ))
echo "== train_speed pipe vs one GPU, budget ${budget} s (log: $LOG)" | tee -a "$LOG"
if [ "$budget" -gt 40 ]; then
  timeout -k 10 "$budget" \
    $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 --tokenizer "$TOK" \
      --plan 1.5b:ddp-bf16,pipe-bf16-c4,pipe-bf16-c8,pipe-bf16-c8-ckpt-always,pipe-bf16-c8-ckpt-never \
      --plan "$PLAN_124M" \
      --batch-size 1.5b=8,124m=16,tiny=8 --steps 1.5b=5,124m=8,tiny=3 \
      --warmup 1.5b=2,124m=2,tiny=1 --pipe-devices all --compare-to '' --target '' \
      --config-timeout 100 --budget-s $(( budget - 15 )) \
      --out "$OUT/train_speed_pipe.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
else
  echo "== skipped: no time left after setup"
fi

echo
[ -f "$OUT/train_speed_pipe.md" ] && cat "$OUT/train_speed_pipe.md"
$PY - "$OUT" <<'PYEOF'
import json, pathlib, sys
p = pathlib.Path(sys.argv[1]) / "train_speed_pipe.json"
if not p.is_file():
    print("train_speed_pipe.json missing")
    raise SystemExit
r = json.loads(p.read_text())
bad = [f"{x['shape']}/{x['config']}: {x['error']} {(x.get('message') or '')[:160]}"
       for x in r["results"] if "error" in x]
print(f"train_speed_pipe.json: {len(r['results'])} configs, {len(bad)} failed/skipped, "
      f"{r.get('total_wall_s')} s, start method checked: {r.get('start_method_checked')}")
for line in bad:
    print("  ", line)
keys = ("shape", "config", "stages", "micro_batches", "balance", "tokens_per_s_pipe",
        "single_gpu_tokens_per_s", "measured_efficiency", "bubble_fraction",
        "predicted_efficiency", "peak_allocated_gib_per_device", "single_gpu_peak_allocated_gib",
        "status")
for e in r.get("pipe_analysis") or []:
    print("   pipe", json.dumps({k: e.get(k) for k in keys}))
PYEOF
echo "== total $(elapsed) s; files: $(ls "$OUT" | tr '\n' ' ')"
