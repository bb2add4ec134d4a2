# Shared setup of benchmarks/gpu.sh and scripts/gpu_*.sh; sourced (not run) from the repository
# root:
#
#   source benchmarks/_gpu_setup.sh
#
# Needs OUT (and NEEDS_PIQA=0 from a script that reads no PIQA files). Defines T0, elapsed(),
# left(), TOTAL (BENCH_TOTAL_S, default $DEFAULT_TOTAL_S or 480), LOG, PIQA, TOK, TINY (array:
# --tiny under BENCH_TINY=1), PY; checks the carried data, installs the carried wheels (.whl/,
# unless BENCH_SKIP_INSTALL=1) into /tmp/site, exports the environment and prints the versions.
# Exits 2 (missing input) or 3 (install failed). Under BENCH_DRY_RUN=1 it only warns about
# missing input and installs and prints nothing.

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
DRY=${BENCH_DRY_RUN:-0}

NEEDED=("$TOK/tokenizer.json")
[ "${NEEDS_PIQA:-1}" = 1 ] && NEEDED+=("$PIQA/train.jsonl" "$PIQA/valid-labels.lst")
for f in "${NEEDED[@]}"; do
  if [ ! -f "$f" ]; then
    echo "missing $f (carry .gpudata/ or set PIQA_DIR / TOKENIZER_DIR)"
    [ "$DRY" = 1 ] || exit 2
  fi
done
if [ "${BENCH_SKIP_INSTALL:-0}" != 1 ] && [ "$DRY" != 1 ]; then
  compgen -G ".whl/*.whl" >/dev/null || { echo "missing .whl/*.whl (gpu-wheels.sh .whl)"; exit 2; }
  if ! python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .whl/*.whl \
      >>"$LOG" 2>&1; then
    echo "wheel install failed:"; tail -20 "$LOG"; exit 3
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
export TOKENIZERS_PARALLELISM=false FILE_FRIENDLY_LOGGING=true PYTHONUNBUFFERED=1
# The device's image sets PYTHONDONTWRITEBYTECODE and ships torch without bytecode, so every
# process compiled torch's sources again: 8.7 s of a 26 s evaluation command (py-spy). pip writes
# the bytecode when it installs a package, so a user's environment has it: here it is compiled
# once, untimed, into a cache of its own (PYTHONPYCACHEPREFIX; the results record both).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
# A copy's .git can be older than its files (the device keeps one between sessions): a tree that
# differs from its HEAD is named "HEAD+modified", never as HEAD.
if [ -z "${BENCH_COMMIT:-}" ]; then
  BENCH_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  if [ "$BENCH_COMMIT" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    BENCH_COMMIT="$BENCH_COMMIT+modified"
  fi
fi
export BENCH_COMMIT
PY=${PYTHON:-python3}

if [ "$DRY" != 1 ]; then
  echo "== $(date -u +%FT%TZ) commit $BENCH_COMMIT, NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-<unset>}"
  nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
  $PY - <<'EOF' 2>&1 | tee -a "$LOG"
import torch, transformers, fairscale, tango.version
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count(), "| transformers", transformers.__version__,
      "| fairscale", fairscale.__version__, "| tango", tango.version.VERSION)
EOF
  SITE=$($PY -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  $PY -m compileall -q -j 0 "$SITE" /tmp/site "$PWD/tango_fairscale" >/dev/null 2>&1
  # As scripts/setup.sh does for a user: lm-eval's task index built once, at installation.
  $PY -c "from tango_fairscale.tasks.builtin import builtin_index; builtin_index()" >>"$LOG" 2>&1
  echo "== setup done after $(elapsed) s (bytecode compiled into $PYTHONPYCACHEPREFIX, lm-eval's task index built)"
fi
