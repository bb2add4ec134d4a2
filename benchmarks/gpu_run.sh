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
DEFAULT_TOTAL_S=530  # everything ends by then (the call limit is 600 s)
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

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
