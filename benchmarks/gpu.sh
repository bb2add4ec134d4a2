#!/usr/bin/env bash
# The GPU benchmarks as named suites, in ONE device call, from the repository root:
#
#   bash benchmarks/gpu.sh SUITE [SUITE...]     # e.g. bash benchmarks/gpu.sh tests eval
#   bash benchmarks/gpu.sh --list               # the suites: GPUs, seconds, the figure each makes
#   bash benchmarks/gpu.sh --dry-run SUITE...   # print the commands only (no GPU, no install)
#
# Each suite runs the invocations that produce the current figure of one README performance
# target. Needs, carried with the repository: .whl/ (bash ../shared/tools/gpu-wheels.sh .whl),
# .gpudata/piqa and .gpudata/gpt2-tokenizer (or PIQA_DIR / TOKENIZER_DIR). Writes each suite's
# files under $OUT/SUITE/ (its full output in $OUT/SUITE/log.txt), then prints an index of the
# results. BENCH_TOTAL_S (default 540) bounds the whole call: suites share what is left after
# setup in proportion to their nominal seconds, and each one's commands stop by then. Also:
# BENCH_COMMIT (the commit measured, when the copy has no .git), BENCH_PROFILE=1 (torch-train:
# each command's main process under cProfile, the top functions in SUITE/profile/; its rates are
# not figures), BENCH_TINY=1 (CPU smoke test: --tiny sizes, GPU counts not checked),
# BENCH_SKIP_INSTALL=1, PYTHON, LM_EVAL_SUITES (the lm-eval suite's own suites, in this order:
# piqa,synthetic measures the PIQA command first; default synthetic,piqa), LM_EVAL_TOOLS (its
# tools: package,lm-eval by default; package alone has no peer in the call), MEMORY_PEAK_CONFIGS (the memory-peak suite's configurations, default ddp-fp32,fairscale-bf16-packed,fairscale-bf16-ckpt-packed), PRECISION_RUNS (the precision suite's runs, default 32-true,bf16-mixed,16-mixed; PRECISION+RECIPE adds float8), PRECISION_ENGINE (its engine, default fairscale), SYNTHETIC_CONFIGS (the train-synthetic suites' configurations, default $SYNTHETIC_DEFAULT below; ddp-bf16 is their base), SCORING_PROBE_SIZES
# (the scoring probe's batch sizes, QUERIESxTOKENS,...; default the step's and 256x16384).
#
# Suites (name | GPUs | nominal seconds | the figure it produces); `gpu.sh --list` and
# benchmarks/index.py read these lines:
#@ main-job | 1 | 330 | the README's main job as a user runs it (random 124M, official PIQA): every default (the machine's first command), engine=ddp precision=32-true, every default again; wall time, time split, GPU busy share, step time
#@ profile-main-job | 1 | 300 | where the main job's host time goes: the command (300 steps) under cProfile, then the default and DDP fp32 steps under torch.profiler
#@ checkpoint-1.5b | 1 | 380 | a checkpoint's visible cost in the loop against its background write time, GPT-2 1.5B (the main job's command, 150 steps): the default engine's rank files, then fsdp2's DCP
#@ tests | 1 | 120 | GPU-only tests pass (compiled loss, packed batches on a GPU, fp16 overflow in every engine)
#@ e2e | 1 | 330 | the whole flow: tango run configs/gpt2_piqa.jsonnet with every engine on the visible GPUs (pipe on a Llama shape), and a command's fixed cost
#@ train-synthetic-124m | 1 | 240 | MFU >= 30 % at GPT-2 124M (3 steps profiled: kernels by kind, the costliest kernels); sharded engines >= 1.3x ddp bf16 autocast (124M)
#@ train-synthetic-1.5b | 1 | 400 | MFU >= 45 % at GPT-2 1.5B; FairScale within 10 % of FSDP2; sharded engines >= 1.3x ddp bf16 (1.5B)
#@ train-piqa | 1 | 300 | FairScale bf16 on PIQA batches of 16 per GPU against DDP fp32 (packed steps on one GPU replayed from CUDA graphs, as the main job trains): the default units >= 1.5x its tokens/s at <= 0.5x its memory, with checkpointing >= 1.0x at <= 0.35x
#@ memory-peak | 1 | 120 | what PIQA steps hold at their peak (124M, batches of 16): DDP fp32, FairScale bf16 packed, with checkpointing; the allocations alive at the peak by the line that made them
#@ profile | 1 | 330 | where short PIQA steps' time goes: GPU kernels by kind and Python functions (124M and 1.5B)
#@ eval | 1 | 150 | PIQA evaluation >= 20,000 queries/s (GPT-2 124M)
#@ precision | 1 | 330 | bf16 / fp16 mixed precision: 300 steps, no NaN, final loss within 2 % of fp32
#@ max-model | 1 | 540 | largest model that trains 10 steps: >= 6B on one H200, >= 12B on two
#@ pipe | 2 | 300 | pipe engine over two GPUs against one: throughput, memory per device, the bubble
#@ multinode | 2 | 540 | two torchrun "nodes" end bit-identical to the single-node run (fsdp2, hybrid_shard, fairscale)
#@ lm-eval | 1 | 520 | the whole command <= 1/4 of lm-eval hf bf16 at its best batch size (64, 256, auto), a second model <= 1/10 of lm-eval's --cache_requests rerun (a command of its own; a checkpoint more in one tango-fairscale eval command), scoring >= 3x with the GPU busy >= 70 % of it; PIQA eval-only through tango run
#@ profile-lm-eval | 1 | 240 | where the package's evaluation commands spend their wall time: the synthetic suite (a fresh workspace, then a second model) and PIQA eval-only, each command sampled by py-spy (needs its wheel in .whl/), each scoring pass under torch.profiler
#@ generation | 1 | 420 | the package's generate_until >= 3x lm-eval's HF backend (generated tokens/s, bf16), GSM8K-shaped: 2,000 prompts x 256 new tokens; whole commands
#@ scoring-events | 1 | 90 | where the GPU idles in the package's own scoring passes: the synthetic suite's package commands (fresh workspace, second model), each pass timed forward by forward with CUDA events, its kernel-busy share by the kernels' own timestamps (profile_hook/scoring_events.py)
#@ graph-probe | 1 | 240 | static-shape packed PIQA steps (bucketed lengths) captured as CUDA graphs against eager steps, bare 124M on one GPU: step and GPU kernel ms against eager fp32 (target <= 1/2), 300-step loss parity, capture cost and buckets of the 2,000-step schedule
#@ scoring-probe | 1 | 150 | where a scoring pass's time goes (GPT-2 124M, bf16-mixed, the synthetic suite's shapes): packing, the host queueing forwards, the GPU; each wait for the device in a forward
#@ first-pass-probe | 1 | 100 | a process's first scoring pass forward by forward (GPT-2 124M, bf16-mixed, the synthetic suite's shapes): the first forward's one-time cost, new shapes against seen ones, GPU gaps; as scored and with shapes bucketed
#@ attention-probe | 1 | 60 | the first call of each attention kernel at each new packed length (bf16, boolean mask): why forwards on a GPU leave cuDNN's attention out; and each kernel's steady time at the synthetic training benchmark's fixed causal shapes (124M, 1.5B)
#@ checkpoint-write-probe | 1 | 90 | one checkpoint file's write on this host by part (4 GiB of fp32 through torch.save): plain, with the manifest's SHA-256 overlapped with the write, and hashed before each write; the digest alone; the kernel's dirty-page limits
#@ cross-entropy-probe | 1 | 90 | one chunk of the training loss on a GPU (GPT-2's vocabulary, 4,096 and 256 rows): the cross-entropy and its gradient eager, compiled in place and out of place; the weight gradient's accumulation
#@ torch-train | 1 | 200 | Tango's torch::train with the fsdp2 engine (bf16-mixed) next to tango_fairscale::train: tokens/s
# Groups: train-synthetic = train-synthetic-124m train-synthetic-1.5b.
set -u -o pipefail

SELF=benchmarks/gpu.sh
DRY_RUN=0
suites=()
for arg in "$@"; do
  case $arg in
    --dry-run) DRY_RUN=1 ;;
    --list)
      grep '^#@ ' "$SELF" | sed 's/^#@ //' | awk -F' [|] ' \
        '{printf "%-22s %s GPU(s)  %4s s  %s\n", $1, $2, $3, $4}'
      exit 0 ;;
    -h|--help) sed -n '2,/^set -u/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    train-synthetic) suites+=(train-synthetic-124m train-synthetic-1.5b) ;;
    -*) echo "unknown option $arg (use --list, --dry-run)"; exit 2 ;;
    *) suites+=("$arg") ;;
  esac
done
[ ${#suites[@]} -gt 0 ] || { echo "name at least one suite (bash $SELF --list)"; exit 2; }
declare -A GPUS_NEEDED NOMINAL
while IFS='|' read -r name gpus seconds _; do
  name=$(echo "$name" | tr -d ' '); GPUS_NEEDED[$name]=$(echo "$gpus" | tr -d ' ')
  NOMINAL[$name]=$(echo "$seconds" | tr -d ' ')
done < <(grep '^#@ ' "$SELF" | sed 's/^#@ //')
for suite in "${suites[@]}"; do
  [ -n "${NOMINAL[$suite]:-}" ] || { echo "unknown suite $suite (bash $SELF --list)"; exit 2; }
done

DEFAULT_TOTAL_S=540
export BENCH_DRY_RUN=$DRY_RUN
# shellcheck source=benchmarks/_gpu_setup.sh
source benchmarks/_gpu_setup.sh
export PIQA_DIR=$PIQA TOKENIZER_DIR=$TOK  # the scripts this runs read the same data
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c ^GPU)
DATA_ROOT=$(dirname "$PIQA")  # the tests read $TANGO_FAIRSCALE_SHARED_DATA/{piqa,gpt2-tokenizer}

# step SECONDS COMMAND...: run COMMAND under `timeout` with its output in $DIR/log.txt (the
# suite's folder), or print it under --dry-run.
step() {
  local seconds=$1; shift
  if [ "$DRY_RUN" = 1 ]; then
    printf '  timeout %s' "$seconds"
    for arg in "$@"; do
      if [[ $arg =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then printf ' %s' "$arg"
      else printf " '%s'" "${arg//\'/\'\\\'\'}"; fi
    done
    echo
    return 0
  fi
  local label=$1 arg
  for arg in "$@"; do
    case $arg in *.py|*.sh|pytest) label=$(basename "$arg"); break ;; esac
  done
  echo "== $SUITE: $*" >>"$DIR/log.txt"
  timeout -k 10 "$seconds" "$@" >>"$DIR/log.txt" 2>&1
  local rc=$?
  echo "== $SUITE: $label rc=$rc after $(elapsed) s" | tee -a "$LOG"
  return $rc
}
# train_speed SECONDS ARGS...: benchmarks/train_speed.py with the shared arguments.
train_speed() {
  local seconds=$1; shift
  step "$seconds" "$PY" benchmarks/train_speed.py "${TINY[@]}" --tokenizer "$TOK" \
    --budget-s $(( seconds - 15 )) "$@"
}

suite_main_job() {  # main_job.json (+ each command's timestamped output): the two commands
  local steps=2000
  [ ${#TINY[@]} -gt 0 ] && steps=20
  step "$BUDGET" "$PY" benchmarks/main_job.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
    --train-steps "$steps" --variants default,ddp-fp32,default --timeout-s $(( BUDGET / 3 - 5 )) \
    --out "$DIR/main_job.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_profile_main_job() {  # profile.txt: each process of the command under cProfile (profile_hook/)
  local steps=300
  [ ${#TINY[@]} -gt 0 ] && steps=20
  step $(( BUDGET * 3 / 5 )) env BENCH_CPROFILE_DIR="$DIR/prof" \
    PYTHONPATH="$PWD/benchmarks/profile_hook:${PYTHONPATH:-}" "$PY" benchmarks/main_job.py \
    "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" --train-steps "$steps" --variants default \
    --timeout-s $(( BUDGET * 3 / 5 - 10 )) --out "$DIR/main_job_profiled.json"
  [ "$DRY_RUN" = 1 ] && return 0
  "$PY" benchmarks/profile_summary.py "$DIR/prof" --rows 70 >"$DIR/profile.txt" 2>&1
  rm -rf "$DIR/prof"
  train_speed $(( BUDGET * 2 / 5 - 5 )) --data piqa --piqa "$PIQA" --world-size 1 \
    --batch-size 16 --warmup 8 --steps 20 --profile-steps 3 --cprofile-steps 3 \
    --plan 124m:ddp-fp32-packed,fairscale-bf16-fused-packed \
    --compare-to ddp-fp32-packed --target '' --config-timeout 60 \
    --out "$DIR/train_speed_piqa_profiled_default.json"
}

suite_checkpoint_1_5b() {  # main_job.json: checkpoint_writes (count, written_s, visible_share)
  local steps=150
  [ ${#TINY[@]} -gt 0 ] && steps=20
  step "$BUDGET" "$PY" benchmarks/main_job.py "${TINY[@]}" --shape 1.5b --piqa "$PIQA" \
    --tokenizer "$TOK" --train-steps "$steps" --variants default,fsdp2 \
    --timeout-s $(( BUDGET / 2 - 10 )) \
    --out "$DIR/main_job_1.5b.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_tests() {
  local files
  mapfile -t files < <(grep -rl "not torch.cuda.is_available()" tests --include='*.py' | sort)
  step "$BUDGET" env TANGO_FAIRSCALE_SHARED_DATA="$DATA_ROOT" "$PY" -m pytest -q \
    -p no:cacheprovider -rfs "${files[@]}"
  # The failures' names and errors, and what was skipped and why, in the call's own log too (a
  # call brings back 8 files at most).
  [ "$DRY_RUN" = 1 ] || { grep -E '^(FAILED|ERROR|SKIPPED) ' "$DIR/log.txt"; tail -1 "$DIR/log.txt"; } \
    | cut -c1-400 | tee -a "$LOG"
}

suite_e2e() {  # results.txt (the runs x metrics table), curves.png; E2E_DEVICES to override
  step "$BUDGET" env OUT="$DIR" BENCH_SKIP_INSTALL=1 BENCH_TOTAL_S="$BUDGET" \
    E2E_STEPS="${E2E_STEPS:-$([ ${#TINY[@]} -gt 0 ] && echo 4 || echo 40)}" bash scripts/gpu_e2e.sh
}

SYNTHETIC_DEFAULT=ddp-bf16,ddp-bf16-compile-fused,fairscale-bf16-compile-fused,fsdp2-bf16-compile-fused

suite_train_synthetic_124m() {  # seq 1024 batch 64, 25 warm-up steps: the compiled steady state
  train_speed "$BUDGET" --world-size 1 --batch-size 124m=64 --warmup 25 --steps 15 --profile-steps 3 \
    --timeline-steps --plan "124m:${SYNTHETIC_CONFIGS:-$SYNTHETIC_DEFAULT}" \
    --compare-to ddp-bf16 --target '' --config-timeout 90 \
    --out "$DIR/train_speed_synth_124m.json"
}

suite_train_synthetic_1_5b() {  # seq 1024 batch 16, then 3 profiled steps (GPU time by kind)
  train_speed "$BUDGET" --world-size 1 --batch-size 1.5b=16 --warmup 8 --steps 8 \
    --profile-steps 3 --timeline-steps \
    --plan "1.5b:${SYNTHETIC_CONFIGS:-$SYNTHETIC_DEFAULT}" \
    --compare-to ddp-bf16 --target '' --config-timeout 150 \
    --out "$DIR/train_speed_synth_1.5b.json"
}

suite_train_piqa() {  # 124M, 16 PIQA examples per GPU (packed: as the configs train); world size 2 where 2 GPUs are seen
  train_speed "$BUDGET" --data piqa --piqa "$PIQA" --world-size 2,1 --batch-size 16 \
    --warmup 8 --steps 25 \
    --plan 124m:ddp-fp32,ddp-bf16-compile-packed,fairscale-bf16,fairscale-bf16-packed,fairscale-bf16-ckpt-packed,fairscale-bf16-compile-packed,fsdp2-bf16-packed \
    --compare-to ddp-fp32 --config-timeout 60 \
    --target fairscale-bf16-packed:1.5:0.5,fairscale-bf16:1.5:0.5,fairscale-bf16-ckpt-packed:1.0:0.35 \
    --out "$DIR/train_speed_piqa_124m_b16.json"
}

suite_memory_peak() {  # the train-piqa configurations' peaks taken apart (recording slows eager steps)
  train_speed "$BUDGET" --data piqa --piqa "$PIQA" --world-size 1 --batch-size 16 \
    --warmup 4 --steps 8 --memory-peak \
    --plan "124m:${MEMORY_PEAK_CONFIGS:-ddp-fp32,fairscale-bf16-packed,fairscale-bf16-ckpt-packed}" \
    --compare-to '' --target '' --config-timeout 60 \
    --out "$DIR/train_speed_piqa_memory_peak.json"
}

suite_profile() {  # world size 1, PIQA batches of 16: 3 steps under torch.profiler, 3 under cProfile
  local half=$(( BUDGET * 2 / 5 ))
  train_speed "$half" --data piqa --piqa "$PIQA" --world-size 1 --batch-size 16 \
    --warmup 8 --steps 10 --profile-steps 3 --cprofile-steps 3 \
    --plan 124m:ddp-fp32,fairscale-bf16-ckpt,fsdp2-bf16-ckpt \
    --compare-to ddp-fp32 --target fairscale-bf16-ckpt --config-timeout 60 \
    --out "$DIR/train_speed_piqa_profiled_124m_b16.json"
  train_speed $(( BUDGET - half - 5 )) --data piqa --piqa "$PIQA" --world-size 1 \
    --batch-size 16 --warmup 5 --steps 10 --profile-steps 3 --cprofile-steps 3 \
    --plan 1.5b:ddp-bf16-fused-packed,fairscale-bf16-fused-packed,fsdp2-bf16-fused-packed \
    --compare-to ddp-bf16-fused-packed --target '' --config-timeout 90 \
    --out "$DIR/train_speed_piqa_profiled_1.5b_b16.json"
}

suite_eval() {  # the predictions step at max_batch_tokens 16384, fp32 and bf16, packed and padded
  step "$BUDGET" env TOKENIZERS_PARALLELISM=true "$PY" benchmarks/eval_speed.py "${TINY[@]}" \
    --piqa "$PIQA" --tokenizer "$TOK" --shape 124m --batch-sizes 4096 --single-queries 20 \
    --repeats 5 --variants '' --token-budgets 16384 --budget-batch-size 4096 \
    --layouts packed,padded --profile --budget-s $(( BUDGET - 20 )) \
    --out "$DIR/eval_speed.json"
}

suite_precision() {  # the training step, FairScale per block, 1 GPU, PIQA batch 16, 300 steps
  step "$BUDGET" "$PY" benchmarks/precision_run.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
    --precisions "${PRECISION_RUNS:-32-true,bf16-mixed,16-mixed}" ${PRECISION_ENGINE:+--engine "$PRECISION_ENGINE"} \
    --steps 300 --batch-size 16 --world-size 1 \
    --validate-every 100 --budget-s $(( BUDGET * 2 / 3 )) --work-dir /tmp \
    --out "$DIR/precision.json"
}

suite_max_model() {  # bf16 + checkpointing (+ offload), batch 1 x 1024; world size 2 on 2 GPUs
  step "$BUDGET" "$PY" benchmarks/max_model.py "${TINY[@]}" --world-size 1,2 \
    --start 1=6.7b,2=13b --tokenizer "$TOK" --budget-s $(( BUDGET - 20 )) \
    --out "$DIR/max_model.json"
}

suite_pipe() {  # one process, the stages on every visible GPU, against ddp-bf16 on one GPU
  local plan_124m=124m:ddp-bf16,pipe-bf16-c4,pipe-bf16-c4-b8_4
  [ ${#TINY[@]} -gt 0 ] && plan_124m=124m:ddp-bf16,pipe-bf16-c4,pipe-bf16-c4-b1_1  # 2 blocks
  train_speed "$BUDGET" --world-size 1 --pipe-devices all \
    --plan 1.5b:ddp-bf16,pipe-bf16-c4,pipe-bf16-c8,pipe-bf16-c8-ckpt-always,pipe-bf16-c8-ckpt-never \
    --plan "$plan_124m" --batch-size 1.5b=8,124m=16,tiny=8 --steps 1.5b=5,124m=8 \
    --warmup 1.5b=2,124m=2 --compare-to '' --target '' --config-timeout 100 \
    --out "$DIR/train_speed_pipe.json"
}

suite_lm_eval() {  # lm_eval_speed.json: requests/s and command seconds of each tool and setting
  step "$BUDGET" "$PY" benchmarks/lm_eval_speed.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
    ${LM_EVAL_SUITES:+--suites "$LM_EVAL_SUITES"} ${LM_EVAL_TOOLS:+--tools "$LM_EVAL_TOOLS"} \
    --timeout-s 150 --budget-s $(( BUDGET - 25 )) --out "$DIR/lm_eval_speed.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_profile_lm_eval() {  # profile.txt: each package command of lm-eval under py-spy
  step "$BUDGET" "$PY" benchmarks/lm_eval_speed.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
    --tools package --pyspy "$DIR/pyspy" --scoring-profile "$DIR/scoring" --timeout-s 150 \
    --budget-s $(( BUDGET - 25 )) --out "$DIR/lm_eval_speed_profiled.json"
  [ "$DRY_RUN" = 1 ] && return 0
  { "$PY" benchmarks/sampled_summary.py "$DIR"/pyspy/*.txt
    for profiled in "$DIR"/scoring/*/*.txt; do echo "## $profiled"; cat "$profiled"; done
  } >"$DIR/profile.txt" 2>&1
  rm -rf "$DIR/pyspy" "$DIR/scoring"
}

suite_generation() {  # generation_speed.json: generated tokens/s and command seconds of each tool
  step "$BUDGET" "$PY" benchmarks/generation_speed.py "${TINY[@]}" --tokenizer "$TOK" \
    --timeout-s 240 --budget-s $(( BUDGET - 25 )) --out "$DIR/generation_speed.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_torch_train() {  # torch_train_speed.json: tokens/s of torch::train and of the package's step
  step "$BUDGET" "$PY" benchmarks/torch_train_speed.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
    --engine fsdp2 --precision bf16-mixed --timeout-s $(( BUDGET / 2 - 5 )) \
    ${BENCH_PROFILE:+--profile "$DIR/profile"} --out "$DIR/torch_train_speed.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_graph_probe() {  # graph_probe_GPU.json / .md: eager and graph-captured variants, parity, capture cost
  step "$BUDGET" "$PY" benchmarks/graph_probe.py "${TINY[@]}" --piqa "$PIQA" --tokenizer "$TOK" \
    --budget-s $(( BUDGET - 15 )) --variant-timeout-s $(( BUDGET / 2 )) --out "$DIR"
  [ "$DRY_RUN" = 1 ] || cat "$DIR"/graph_probe_*.md 2>/dev/null | tee -a "$LOG"
}

suite_attention_probe() {  # attention_probe.json: first and second calls per kernel
  [ ${#TINY[@]} -gt 0 ] && { echo "(attention-probe needs a GPU)"; return 0; }
  step "$BUDGET" "$PY" benchmarks/attention_probe.py --out "$DIR/attention_probe.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_checkpoint_write_probe() {  # checkpoint_write_probe.json: seconds per variant
  local gib=4
  [ ${#TINY[@]} -gt 0 ] && gib=0.1
  step "$BUDGET" "$PY" benchmarks/checkpoint_write_probe.py --gib "$gib" \
    --out "$DIR/checkpoint_write_probe.json"
}

suite_cross_entropy_probe() {  # cross_entropy_probe.json: GPU ms per chunk by form
  [ ${#TINY[@]} -gt 0 ] && { echo "(cross-entropy-probe needs a GPU)"; return 0; }
  step "$BUDGET" "$PY" benchmarks/cross_entropy_probe.py --out "$DIR/cross_entropy_probe.json"
  [ "$DRY_RUN" = 1 ] || grep '^{' "$DIR/log.txt" | tee -a "$LOG"
}

suite_scoring_probe() {  # scoring_probe.json: host and GPU seconds of each pass
  [ ${#TINY[@]} -gt 0 ] && { echo "(scoring-probe needs a GPU)"; return 0; }
  step "$BUDGET" "$PY" benchmarks/scoring_probe.py --tokenizer "$TOKENIZER_DIR" \
    ${SCORING_PROBE_SIZES:+--sizes "$SCORING_PROBE_SIZES"} --out "$DIR/scoring_probe.json"
}

suite_first_pass_probe() {  # first_pass_probe_VARIANT.json: each variant in a fresh process
  [ ${#TINY[@]} -gt 0 ] && { echo "(first-pass-probe needs a GPU)"; return 0; }
  local variant
  for variant in default bucket; do
    step $(( BUDGET / 2 )) "$PY" benchmarks/first_pass_probe.py --variant "$variant" \
      --tokenizer "$TOKENIZER_DIR" --out "$DIR/first_pass_probe_$variant.json"
  done
}

suite_scoring_events() {  # lm_eval_speed.json + events/PID.jsonl: each pass of each command
  step "$BUDGET" env PYTHONPATH="$PWD/benchmarks/profile_hook${PYTHONPATH:+:$PYTHONPATH}" \
    BENCH_SCORING_EVENTS_DIR="$DIR/events" "$PY" benchmarks/lm_eval_speed.py "${TINY[@]}" \
    --piqa "$PIQA" --tokenizer "$TOK" --suites synthetic --tools package --timeout-s 100 \
    --budget-s $(( BUDGET - 10 )) --out "$DIR/lm_eval_speed.json"
  [ "$DRY_RUN" = 1 ] || cat "$DIR"/events/*.jsonl | tee -a "$LOG"
}

suite_multinode() {  # multinode.json: the largest weight difference of each launch to one node
  step "$BUDGET" env OUT="$DIR" BENCH_SKIP_INSTALL=1 BENCH_TOTAL_S="$BUDGET" \
    bash scripts/gpu_multinode.sh
}

remaining=0
for suite in "${suites[@]}"; do remaining=$(( remaining + NOMINAL[$suite] )); done
for suite in "${suites[@]}"; do
  export SUITE=$suite BENCH_SUITE=$suite
  DIR="$OUT/$suite"
  share=$(( ($(left) - 15) * NOMINAL[$suite] / remaining ))
  remaining=$(( remaining - NOMINAL[$suite] ))
  BUDGET=$share
  [ "$DRY_RUN" = 1 ] && BUDGET=${NOMINAL[$suite]}
  echo "== suite $suite: ${BUDGET} s (${NOMINAL[$suite]} s nominal, ${GPUS_NEEDED[$suite]} GPU(s))" \
    | tee -a "$LOG"
  if [ "$DRY_RUN" != 1 ] && [ ${#TINY[@]} -eq 0 ] && [ "$GPUS" -lt "${GPUS_NEEDED[$suite]}" ]; then
    echo "== $suite skipped: needs ${GPUS_NEEDED[$suite]} GPUs, $GPUS visible" | tee -a "$LOG"
    continue
  fi
  if [ "$BUDGET" -lt 30 ]; then
    echo "== $suite skipped: $BUDGET s left" | tee -a "$LOG"
    continue
  fi
  [ "$DRY_RUN" = 1 ] || mkdir -p "$DIR"
  "suite_$(echo "$suite" | tr -- '-.' '__')"
done

[ "$DRY_RUN" = 1 ] && exit 0
echo
"$PY" benchmarks/index.py --dir "$OUT" --print 2>&1 | tee -a "$LOG"
echo "== total $(elapsed) s; files: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
# A device call returns at most 8 files: more go back as one archive beside the call's log.
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && find . -type f ! -path ./log.txt | sort | tar -czf results.tar.gz -T - \
    && find . -type f ! -name results.tar.gz ! -path ./log.txt -delete)
  echo "== more than 8 files: packed into results.tar.gz (tar -xzf results.tar.gz)"
fi
