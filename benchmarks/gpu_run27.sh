#!/usr/bin/env bash
# Twenty-seventh GPU call (kind nvidia-h200), from the repository root, ending by 300 s: which
# Python code takes the host-bound PIQA steps' time (run 25: FairScale bf16 + checkpointing at
# 124M batch 16 keeps the GPU busy 12 of 78 ms). train_profile.py --cprofile at world size 1:
# 124M batch 16 padded (issue 3's workload) for ddp bf16, fairscale bf16 with and without
# checkpointing, fsdp2 bf16 + checkpointing; 1.5B batch 16 packed with fused AdamW for fsdp2 and
# fairscale. Needs .whl/ and .gpudata/ carried; writes under $OUT (at most 7 files).
set -u -o pipefail
DEFAULT_TOTAL_S=300
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh

shape_of() { [ "${BENCH_TINY:-0}" = 1 ] && echo tiny || echo "$1"; }
for run in "124m ddp" "124m fairscale" "124m fairscale --checkpointing" \
    "124m fsdp2 --checkpointing" "1.5b fsdp2 --packed --fused" "1.5b fairscale --packed --fused"; do
  read -r shape engine options <<<"$run"
  name="cprofile_${shape}_${engine}$(echo "${options:-}" | tr -d ' ' | sed 's/--/-/g')"
  [ "$(left)" -lt 40 ] && { echo "== $name: skipped, $(left) s left"; continue; }
  echo "== $name" | tee -a "$LOG"
  # shellcheck disable=SC2086
  timeout -k 5 $(( $(left) - 10 )) $PY benchmarks/train_profile.py --piqa "$PIQA" \
    --tokenizer "$TOK" --shape "$(shape_of "$shape")" --engine "$engine" --precision bf16-mixed \
    --batch-size 16 --warmup 8 --steps 10 --rows 45 --cprofile ${options:-} \
    >"$OUT/$name.txt" 2>&1
  echo "== rc=$? after $(elapsed) s"
  grep "cProfile: step wall" "$OUT/$name.txt"
done
