#!/usr/bin/env bash
# Fourteenth GPU call (kind nvidia-h200), from the repository root, ending by 240 s: after the
# scoring step moved from inference_mode to no_grad (autocast's weight-cast cache works only
# there) and scoring's loss became one log-softmax pass: the GPU-only loss tests, eval_speed.py
# as in gpu_run8.sh, and eval_profile.py (bf16, 16384-token batches).
# Needs .whl/ and .gpudata/ carried; writes under $OUT. Set BENCH_COMMIT.
set -u -o pipefail
DEFAULT_TOTAL_S=240
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

gpu_tests tests/test_model.py

eval_speed_standard eval_speed

echo "== eval_profile" | tee -a "$LOG"
TOKENIZERS_PARALLELISM=true timeout -k 10 $(( $(left) - 5 )) $PY benchmarks/eval_profile.py \
  --piqa "$PIQA" --tokenizer "$TOK" --precision bf16-mixed --batch-size 4096 \
  --max-batch-tokens 16384 > "$OUT/eval_profile.txt" 2>&1
echo "== rc=$? after $(elapsed) s"
grep "step wall" "$OUT/eval_profile.txt"
