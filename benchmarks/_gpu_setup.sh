# Shared setup of the GPU run scripts; sourced (not run) from the repository root:
#
#   source benchmarks/_gpu_setup.sh
#
# Needs OUT (and NEEDS_PIQA=0 from a script that reads no PIQA files). Defines T0, elapsed(), TOTAL (BENCH_TOTAL_S, default $DEFAULT_TOTAL_S or 480), LOG,
# PIQA, TOK, TINY (array: --tiny under BENCH_TINY=1), PY; checks the carried data, installs the
# carried wheels (.whl/, unless BENCH_SKIP_INSTALL=1) into /tmp/site, exports the environment and
# prints the versions. Exits 2 (missing input) or 3 (install failed).

OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
T0=$(date +%s)
TOTAL=${BENCH_TOTAL_S:-${DEFAULT_TOTAL_S:-480}}
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( TOTAL - $(elapsed) )); }
PIQA=${PIQA_DIR:-.gpudata/piqa}
TOK=${TOKENIZER_DIR:-.gpudata/gpt2-tokenizer}
TINY=()
[ "${BENCH_TINY:-0}" = 1 ] && TINY=(--tiny)

NEEDED=("$TOK/tokenizer.json")
[ "${NEEDS_PIQA:-1}" = 1 ] && NEEDED+=("$PIQA/train.jsonl" "$PIQA/valid-labels.lst")
for f in "${NEEDED[@]}"; do
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

# The GPU-only tests: gpu_tests FILE... (GPU_TESTS_TIMEOUT seconds at most, default 100)
gpu_tests() {
  echo "== GPU tests" | tee -a "$LOG"
  TANGO_FAIRSCALE_SHARED_DATA=.gpudata timeout -k 10 "${GPU_TESTS_TIMEOUT:-100}" \
    $PY -m pytest -q -p no:cacheprovider \
    "$@" 2>&1 | tail -2 | tee -a "$LOG"
}

# eval_speed.py as every evaluation call since gpu_run8.sh runs it (124M; the step path at batch
# 128; token budgets 8192-32768 in fp32 and bf16-mixed; tokenizer thread pool on):
# eval_speed_standard NAME writes $OUT/NAME.json and .md.
eval_speed_standard() {
  echo "== eval_speed" | tee -a "$LOG"
  TOKENIZERS_PARALLELISM=true timeout -k 10 120 $PY benchmarks/eval_speed.py "${TINY[@]}" \
    --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 128 --single-queries 50 \
    --repeats 5 --variants fp32 --token-budgets 8192,16384,32768 --budget-batch-size 4096 \
    --budget-s 100 --out "$OUT/$1.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
  cat "$OUT/$1.md"
}

# eval_speed.py's token-budget section only (124M; the step path at batch 4096, no precision
# variants; fp32 and bf16-mixed, each layout): eval_speed_budgets BUDGETS writes
# $OUT/eval_speed.json and .md (gpu_run16.sh, gpu_run20.sh, gpu_run22.sh).
eval_speed_budgets() {
  echo "== eval_speed" | tee -a "$LOG"
  TOKENIZERS_PARALLELISM=true timeout -k 10 100 $PY benchmarks/eval_speed.py "${TINY[@]}" \
    --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 4096 --single-queries 20 \
    --repeats 5 --variants '' --token-budgets "$1" --budget-batch-size 4096 \
    --budget-s 80 --out "$OUT/eval_speed.json" >>"$LOG" 2>&1
  echo "== rc=$? after $(elapsed) s"
}
