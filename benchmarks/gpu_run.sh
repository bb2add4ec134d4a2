#!/usr/bin/env bash
# All GPU benchmarks in ONE device call (kind nvidia-h200-x2), run from the repository root:
#
#   bash benchmarks/gpu_run.sh            # everything (about 7-8 min; hard stop at BENCH_TOTAL_S)
#   bash benchmarks/gpu_run.sh precision  # only benchmarks/precision_run.py
#   bash benchmarks/gpu_run.sh speed      # only benchmarks/train_speed.py
#
# Needs, carried with the repository: .whl/ (bash ../shared/tools/gpu-wheels.sh .whl),
# .gpudata/piqa (official PIQA files) and .gpudata/gpt2-tokenizer (or PIQA_DIR / TOKENIZER_DIR).
# Writes under $OUT (at most 5 files): precision.json/.md, train_speed.json/.md, log.txt (every
# sub-run's full output). Prints only a short report; set BENCH_COMMIT to the commit being measured
# when the copy has no .git. CPU smoke test: BENCH_TINY=1 BENCH_SKIP_INSTALL=1 OUT=/tmp/x bash ...
set -u -o pipefail

part=${1:-all}
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
T0=$(date +%s)
TOTAL=${BENCH_TOTAL_S:-530}  # everything ends by then (the call limit is 600 s)
elapsed() { echo $(( $(date +%s) - T0 )); }
PIQA=${PIQA_DIR:-.gpudata/piqa}
TOK=${TOKENIZER_DIR:-.gpudata/gpt2-tokenizer}
TINY=()
[ "${BENCH_TINY:-0}" = 1 ] && TINY=(--tiny)

for f in "$PIQA/train.jsonl" "$PIQA/valid-labels.lst" "$TOK/tokenizer.json"; do
  [ -f "$f" ] || { echo "missing $f (carry .gpudata/ or set PIQA_DIR / TOKENIZER_DIR)"; exit 2; }
done
if [ "${BENCH_SKIP_INSTALL:-0}" != 1 ]; then
  compgen -G ".whl/*.whl" >/dev/null || { echo "missing .whl/*.whl (gpu-wheels.sh .whl)"; exit 2; }
  if ! python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .whl/*.whl \
      >>"$LOG" 2>&1; then
    echo "wheel install failed:"; tail -20 "$LOG"; exit 3
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
export TOKENIZERS_PARALLELISM=false FILE_FRIENDLY_LOGGING=true PYTHONUNBUFFERED=1
export BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
PY=${PYTHON:-python3}

echo "== $(date -u +%FT%TZ) commit $BENCH_COMMIT, NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-<unset>}"
nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
$PY - <<'EOF' 2>&1 | tee -a "$LOG"
import torch, transformers, fairscale, tango.version
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count(), "| transformers", transformers.__version__,
      "| fairscale", fairscale.__version__, "| tango", tango.version.VERSION)
EOF
echo "== setup done after $(elapsed) s"

if [ "$part" = all ] || [ "$part" = precision ]; then
  # 3 precisions x 300 steps, world size 1; no new precision starts after 170 s.
  echo "== precision_run (log: $LOG)" | tee -a "$LOG"
  timeout -k 10 $(( TOTAL - $(elapsed) > 260 ? 260 : TOTAL - $(elapsed) )) \
    $PY benchmarks/precision_run.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
      --precisions 32-true,bf16-mixed,16-mixed --steps 300 --batch-size 16 --world-size 1 \
      --validate-every 100 --budget-s 170 --work-dir /tmp --out "$OUT/precision.json" >>"$LOG" 2>&1
  echo "== precision_run rc=$? after $(elapsed) s"
  grep "^=== precision" "$LOG" | tail -6
fi

if [ "$part" = all ] || [ "$part" = speed ]; then
  remaining=$(( TOTAL - $(elapsed) ))
  echo "== train_speed, ${remaining} s left (log: $LOG)" | tee -a "$LOG"
  # World size 2 first (the sharding story); each config in its own process group.
  timeout -k 15 "$remaining" \
    $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 2,1 --tokenizer "$TOK" \
      --plan 124m:ddp-fp32,ddp-bf16,fairscale-fp32-root,fairscale-bf16,fairscale-bf16-ckpt,fairscale-16-mixed,fsdp2-bf16,fsdp2-bf16-compile \
      --plan 1.5b:ddp-bf16,fairscale-bf16,fairscale-bf16-ckpt,fsdp2-bf16,fsdp2-bf16-compile \
      --steps 124m=8,1.5b=5,tiny=3 --warmup 124m=2,1.5b=2,tiny=1 \
      --config-timeout 120 --budget-s $(( remaining - 30 )) \
      --out "$OUT/train_speed.json" >>"$LOG" 2>&1
  echo "== train_speed rc=$? after $(elapsed) s"
  grep "^=== world" "$LOG" | grep -v ": start" | tail -20
fi

echo
for f in "$OUT/precision.md" "$OUT/train_speed.md"; do
  [ -f "$f" ] && { cat "$f"; echo; }
done
$PY - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
p = out / "precision.json"
if p.is_file():
    r = json.loads(p.read_text())
    print("precision vs fp32:", json.dumps(r.get("comparison", {})))
s = out / "train_speed.json"
if s.is_file():
    r = json.loads(s.read_text())
    bad = [f"{x['world_size']}/{x['shape']}/{x['config']}: {x['error']} {x.get('message', '')[:120]}"
           for x in r["results"] if "error" in x]
    print("train_speed: %d configs, %d failed, %s s" % (len(r["results"]), len(bad),
                                                       r.get("total_wall_s")))
    for line in bad:
        print("  ", line)
EOF
echo "== total $(elapsed) s; files: $(ls "$OUT" | tr '\n' ' ')"
