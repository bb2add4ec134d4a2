#!/usr/bin/env bash
# Second GPU run, in ONE device call (kind nvidia-h200-x2), run from the repository root:
#
#   bash benchmarks/gpu_run2.sh          # everything, by importance; ends by BENCH_TOTAL_S (480 s)
#   bash benchmarks/gpu_run2.sh piqa     # (i)   only train_speed --data piqa, world size 2 then 1
#   bash benchmarks/gpu_run2.sh eval     # (iii) only eval_speed
#   bash benchmarks/gpu_run2.sh synth    # (ii)  only train_speed synthetic seq 1024, world size 1
#
# (i)   the issue's must-show: GPT-2 124M on PIQA, batch 16 per GPU, world size 2 and 1:
#       ddp-fp32, fairscale-bf16-ckpt (target), ddp-bf16, fairscale-bf16, fsdp2-bf16-ckpt,
#       fsdp2-bf16, fairscale-bf16-ckpt-offload; warmup 3, 10 timed steps each;
# (iii) PIQA validation scoring speed (all 3,676 queries) of the piqa_predictions step, 124M;
# (ii)  synthetic seq-1024 at world size 1 (the first run had no time left for it): 124M and 1.5B.
#
# Needs, carried with the repository: .whl/ (bash ../shared/tools/gpu-wheels.sh .whl),
# .gpudata/piqa and .gpudata/gpt2-tokenizer (or PIQA_DIR / TOKENIZER_DIR). Writes under $OUT
# (7 files): train_speed_piqa.json/.md, eval_speed.json/.md, train_speed_synth_ws1.json/.md and
# log.txt (every sub-run's full output). Set BENCH_COMMIT when the copy has no .git.
# CPU smoke test: BENCH_TINY=1 BENCH_SKIP_INSTALL=1 PYTHON=python OUT=/tmp/x bash ...
set -u -o pipefail

part=${1:-all}
DEFAULT_TOTAL_S=480
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh
EVAL_RESERVE=${BENCH_EVAL_RESERVE_S:-100}  # kept for (iii) while (i) runs

if [ "$part" = all ] || [ "$part" = piqa ]; then
  reserve=10
  [ "$part" = all ] && reserve=$EVAL_RESERVE
  budget=$(( $(left) - reserve ))
  [ "$budget" -gt 300 ] && budget=300
  echo "== (i) train_speed --data piqa, budget ${budget} s (log: $LOG)" | tee -a "$LOG"
  timeout -k 10 $(( budget + 20 )) \
    $PY benchmarks/train_speed.py "${TINY[@]}" --data piqa --piqa "$PIQA" --tokenizer "$TOK" \
      --world-size 2,1 \
      --plan 124m:ddp-fp32,fairscale-bf16-ckpt,ddp-bf16,fairscale-bf16,fsdp2-bf16-ckpt,fsdp2-bf16,fairscale-bf16-ckpt-offload \
      --batch-size 16 --warmup 3 --steps 10 --compare-to ddp-fp32 --target fairscale-bf16-ckpt \
      --config-timeout 90 --budget-s "$budget" \
      --out "$OUT/train_speed_piqa.json" >>"$LOG" 2>&1
  echo "== (i) rc=$? after $(elapsed) s"
fi

if [ "$part" = all ] || [ "$part" = eval ]; then
  budget=$(( $(left) - 15 ))
  [ "$budget" -gt 150 ] && budget=150
  echo "== (iii) eval_speed, budget ${budget} s (log: $LOG)" | tee -a "$LOG"
  timeout -k 10 "$budget" \
    $PY benchmarks/eval_speed.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" --shape 124m \
      --batch-sizes 32,128,512 --single-queries 200 --repeats 3 \
      --variants fp32,tf32,bf16-autocast --budget-s $(( budget - 30 )) \
      --out "$OUT/eval_speed.json" >>"$LOG" 2>&1
  echo "== (iii) rc=$? after $(elapsed) s"
fi

if [ "$part" = all ] || [ "$part" = synth ]; then
  budget=$(( $(left) - 12 ))
  echo "== (ii) train_speed synthetic, world size 1, budget ${budget} s (log: $LOG)" | tee -a "$LOG"
  if [ "$budget" -gt 30 ]; then
    timeout -k 10 "$budget" \
      $PY benchmarks/train_speed.py "${TINY[@]}" --world-size 1 --tokenizer "$TOK" \
        --plan 124m:ddp-fp32,ddp-bf16,fairscale-bf16,fairscale-bf16-ckpt,fsdp2-bf16,fsdp2-bf16-compile \
        --plan 1.5b:ddp-bf16,fairscale-bf16-ckpt,fsdp2-bf16,fsdp2-bf16-compile \
        --steps 124m=8,1.5b=5,tiny=3 --warmup 124m=2,1.5b=2,tiny=1 --compare-to ddp-fp32 \
        --config-timeout 120 --budget-s $(( budget - 15 )) \
        --out "$OUT/train_speed_synth_ws1.json" >>"$LOG" 2>&1
    echo "== (ii) rc=$? after $(elapsed) s"
  else
    echo "== (ii) skipped: no time left"
  fi
fi

echo
for f in "$OUT/train_speed_synth_ws1.md" "$OUT/eval_speed.md" "$OUT/train_speed_piqa.md"; do
  [ -f "$f" ] && { cat "$f"; echo; }
done
$PY - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("train_speed_piqa.json", "train_speed_synth_ws1.json"):
    p = out / name
    if not p.is_file():
        print(name, "missing")
        continue
    r = json.loads(p.read_text())
    bad = [f"{x['world_size']}/{x['shape']}/{x['config']}: {x['error']} "
           f"{(x.get('message') or '')[:120]}" for x in r["results"] if "error" in x]
    print(f"{name}: {len(r['results'])} configs, {len(bad)} failed/skipped, "
          f"{r.get('total_wall_s')} s, start method checked: {r.get('start_method_checked')}")
    for line in bad:
        print("  ", line)
    for c in r.get("target_checks") or []:
        print("   target", json.dumps(c))
e = out / "eval_speed.json"
if e.is_file():
    print("eval_speed summary:", json.dumps(json.loads(e.read_text()).get("summary")))
EOF
echo "== total $(elapsed) s; files: $(ls "$OUT" | tr '\n' ' ')"
