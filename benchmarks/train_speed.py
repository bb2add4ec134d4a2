"""Training throughput and memory of the package's engines on GPT-2-shaped models.

Every configuration runs in its own freshly started process group (one process per GPU, NCCL;
gloo on CPU), so an out-of-memory error or a hang in one is recorded and the rest still run.
Configurations are named ``ENGINE-PRECISION[-MODIFIER...]`` (``_train_configs.py``), e.g.
``ddp-fp32``, ``fairscale-bf16-ckpt``, ``fsdp2-bf16-compile-fused``, ``pipe-bf16-c8-ckpt-always``.

Data (``--data``):

* ``synthetic`` (default): a fixed random batch of ``batch_size x seq_len`` tokens per GPU, every
  token scored; throughput from the median step.
* ``piqa``: PIQA training examples as the training step feeds them (the ``BatchSchedule`` global
  batch ``batch_size x world_size``, rank ``r`` takes the ``r``-th slice; the correct answer only;
  right-padded rows, or packed for ``-packed`` configs). Every configuration of one world size
  sees the same examples. Reported: real (non-pad) tokens/s, tokens/s of all positions fed,
  padding fraction; throughput over the summed timed steps.

The parts, each readable alone: ``_train_configs.py`` (configuration names -> engine
``Params``), ``_train_worker.py`` (the measured loop in every process), ``_train_profile.py``
(``--profile-steps``: GPU kernel time by kind; ``--cprofile-steps``: Python functions),
``_train_launch.py`` (process groups and result rows), ``_train_compare.py`` (ratios to the
same-run baselines, the target check), ``_train_pipe.py`` (pipe runs against one GPU) and
``_train_report.py`` (the Markdown).

Run by path (``benchmarks/`` is not a package)::

    python benchmarks/train_speed.py --world-size 1,2 --shapes 124m \
        --configs ddp-fp32,ddp-bf16,fairscale-bf16,fairscale-bf16-ckpt \
        --tokenizer .gpudata/gpt2-tokenizer --out /tmp/speed.json
    python benchmarks/train_speed.py --data piqa --piqa .gpudata/piqa --world-size 2,1 \
        --configs ddp-fp32,fairscale-bf16-ckpt --compare-to ddp-fp32 --out /tmp/speed-piqa.json
    python benchmarks/train_speed.py --world-size 1 --batch-size 8 --steps 5 --warmup 2 \
        --plan 1.5b:ddp-bf16,pipe-bf16-c4,pipe-bf16-c8,pipe-bf16-c8-ckpt-always \
        --compare-to '' --target '' --out /tmp/speed-pipe.json  # pipe over every visible GPU
    python benchmarks/train_speed.py --tiny --world-size 1,2 --out /tmp/speed-cpu.json  # CPU smoke

Writes ``--out`` (JSON, rewritten after every configuration) and the same name with ``.md``: a table
with ratios against the DDP baseline of the same shape and world size measured in this run
(``x base``), ratios against ``--compare-to`` (default ``ddp-fp32``), and a check of ``--target``
(default ``fairscale-bf16-ckpt``) against it: peak memory at most 1/3, throughput at least 1x.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

import _piqa  # noqa: E402
import _train_compare  # noqa: E402
import _train_configs  # noqa: E402
import _train_launch  # noqa: E402
import _train_pipe  # noqa: E402
import _train_report  # noqa: E402

from tango_fairscale.runtime.process_group import free_port  # noqa: E402

#: GPT-2's dropout probabilities, which ``--dropout`` sets together.
GPT2_DROPOUTS = ("embd_pdrop", "attn_pdrop", "resid_pdrop")
DEFAULT_BATCH = "124m=16,355m=16,774m=8,1.5b=8,tiny=2"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", default="1", help="comma list, e.g. 1,2")
    parser.add_argument(
        "--shapes", default="124m", help=f"comma list of {', '.join(_bench.SHAPES)}"
    )
    parser.add_argument("--configs", default="ddp-fp32,ddp-bf16,fairscale-fp32,fairscale-bf16")
    parser.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="SHAPE:CONFIG,CONFIG",
        help="instead of --shapes x --configs: one shape with its configs (repeatable)",
    )
    parser.add_argument(
        "--batch-size",
        default=None,
        help="per GPU (pipe: the whole pipe's batch): N for all shapes or SHAPE=N,... "
        f"(default {DEFAULT_BATCH}; --tiny: 2 unless given)",
    )
    parser.add_argument("--steps", default="10", help="timed steps: N or SHAPE=N,...")
    parser.add_argument("--warmup", default="3", help="untimed steps first: N or SHAPE=N,...")
    parser.add_argument(
        "--data",
        choices=("synthetic", "piqa"),
        default="synthetic",
        help="synthetic: fixed random seq-len rows; piqa: real PIQA training batches",
    )
    parser.add_argument(
        "--piqa",
        type=Path,
        default=_bench.REPO_ROOT / ".gpudata" / "piqa",
        help="official PIQA files (with --data piqa)",
    )
    parser.add_argument("--seq-len", type=int, default=1024, help="synthetic data only")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-grad-norm", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="every dropout of the GPT-2 shape (embeddings, attention, residuals); default "
        "GPT-2's own 0.1, as the training step trains it",
    )
    parser.add_argument(
        "--tokenizer", default=str(_bench.REPO_ROOT / ".gpudata" / "gpt2-tokenizer")
    )
    parser.add_argument(
        "--init-device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the random init runs on a GPU machine (cpu = exactly the "
        "training step's path; offload configs always init on CPU)",
    )
    parser.add_argument(
        "--baseline",
        default="ddp-bf16,ddp-fp32",
        help="fallback baseline order when no DDP run has the same precision",
    )
    parser.add_argument(
        "--compare-to",
        default="ddp-fp32",
        help="also give every run's ratios to this config (same shape, world size, batch); "
        "'' for none",
    )
    parser.add_argument(
        "--target",
        default="fairscale-bf16-ckpt",
        help="check these configs against --compare-to (comma-separated CONFIG or "
        "CONFIG:THROUGHPUT:MEMORY; a config alone: throughput >= 1x, memory <= 1/3)",
    )
    parser.add_argument(
        "--start-method",
        choices=("forkserver", "spawn"),
        default="forkserver",
        help="forkserver: workers fork from a process that imported torch/transformers/tango "
        "once (falls back to spawn if the first run's workers never report)",
    )
    parser.add_argument(
        "--pipe-devices",
        default="all",
        help="the pipe configs' stage devices, comma list (e.g. cuda:0,cuda:1); 'all': every "
        "visible GPU, or cpu,cpu without GPUs",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after the timed steps, this many more under torch.profiler (rank 0, GPU): GPU "
        "kernel time per step by kind (GEMM, attention, ...) in the JSON and a Markdown section",
    )
    parser.add_argument(
        "--memory-peak",
        action="store_true",
        help="record the GPU allocator's history over the timed steps: the allocations alive at "
        "the peak, by the package line that made them (slows eager steps: no speed figures)",
    )
    parser.add_argument(
        "--timeline-steps",
        action="store_true",
        help="after the timed steps (each synchronised at its start and end), their batches "
        "again without synchronising between steps, as the training loop runs (one GPU per "
        "process): each step's time on the GPU's timeline, by CUDA events, and its MFU",
    )
    parser.add_argument(
        "--cprofile-steps",
        type=int,
        default=0,
        help="after those, this many more under Python's cProfile (rank 0): the functions that "
        "take a host-bound step's time, in the JSON and a Markdown section",
    )
    parser.add_argument("--config-timeout", type=float, default=240.0, help="seconds per config")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip configs that would start after this many seconds",
    )
    parser.add_argument("--commit", default=None, help="code commit (default BENCH_COMMIT / git)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON (and .md beside it)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke test: shape tiny, seq 64, batch 2, 3 steps, 1 warmup "
        "(PIQA from ../shared/data/piqa when --piqa is not a directory)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.shapes, args.seq_len = "tiny", 64
        args.batch_size = args.batch_size or "2"
        if "=" in args.batch_size and "tiny=" not in args.batch_size:
            args.batch_size += ",tiny=2"
        args.steps, args.warmup = "3", "1"
        args.plan = [p.replace(p.split(":")[0], "tiny", 1) for p in args.plan]
        shared = _bench.REPO_ROOT.parent / "shared" / "data" / "piqa"
        if not args.piqa.is_dir() and shared.is_dir():
            args.piqa = shared
    args.batch_size = args.batch_size or DEFAULT_BATCH
    try:
        _train_compare.parse_targets(args.target)
    except ValueError as error:
        parser.error(str(error))
    if args.data == "piqa" and not (args.piqa / "train.jsonl").is_file():
        raise SystemExit(f"--piqa {args.piqa} holds no train.jsonl (official PIQA files)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    started = time.perf_counter()
    world_sizes = [int(w) for w in args.world_size.split(",")]
    plan = [
        (shape, [c for c in configs.split(",") if c])
        for shape, _, configs in (entry.partition(":") for entry in args.plan)
    ] or [(s, [c for c in args.configs.split(",") if c]) for s in args.shapes.split(",")]
    parsed = {c: _train_configs.parse_config(c) for _, configs in plan for c in configs}
    tokenizer = str(Path(args.tokenizer).resolve())
    if not Path(tokenizer).is_dir():
        raise SystemExit(f"--tokenizer {tokenizer} is not a directory (GPT-2 tokenizer files)")
    train_examples = None
    if args.data == "piqa":
        train_examples = _piqa.examples(args.piqa, "train")
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    stage_devices = _train_configs.pipe_devices(args.pipe_devices, cuda, gpus)
    start_method = args.start_method
    if start_method == "forkserver":
        import multiprocessing

        # Fork-safe CUDA availability checks, should an import in the server make one.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        multiprocessing.set_forkserver_preload(_train_launch.PRELOAD)

    environment = _bench.environment(args.commit, query_gpu=False)
    report: dict[str, Any] = {
        "benchmark": "train_speed",
        "environment": environment,
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "plan": plan,
            "device": "cuda" if cuda else "cpu",
            "optimizer": {"type": "torch::AdamW", "lr": args.lr, "weight_decay": 0.0},
            "pipe_devices_resolved": stage_devices,
            "root_only_patterns": _train_configs.ROOT_ONLY_PATTERNS,
            "mfu_formula": _bench.MFU_FORMULA,
            "peak_flops": _bench.PEAK_FLOPS,
            **_train_report.SETTINGS_NOTES,
        },
        "results": [],
        "start_method_checked": False,
    }
    n_params: dict[str, int] = {}
    for world_size in world_sizes:
        for shape, configs in plan:
            model_config = _bench.gpt2_config(shape)
            if args.dropout is not None:
                model_config.update(dict.fromkeys(GPT2_DROPOUTS, args.dropout))
            if shape not in n_params:
                n_params[shape] = _train_configs.count_parameters(model_config)
            batch_size = _bench.per_shape(args.batch_size, shape)
            steps = _bench.per_shape(args.steps, shape)
            warmup = _bench.per_shape(args.warmup, shape)
            piqa_batches = None
            if train_examples is not None:
                piqa_batches = _train_configs.piqa_rank_batches(
                    train_examples, batch_size, world_size, warmup + steps, args.seed
                )
            for name in configs:
                spec = {
                    **parsed[name],
                    "data": args.data,
                    "piqa_batches": piqa_batches,
                    "start_method": start_method,
                    "world_size": world_size,
                    "shape": shape,
                    "model_config": model_config,
                    "n_params": n_params[shape],
                    "batch_size": batch_size,
                    "steps": steps,
                    "warmup": warmup,
                    "seq_len": None if args.data == "piqa" else args.seq_len,
                    "lr": args.lr,
                    "max_grad_norm": args.max_grad_norm,
                    "seed": args.seed,
                    "profile_steps": args.profile_steps,
                    "cprofile_steps": args.cprofile_steps,
                    "memory_peak": args.memory_peak,
                    "timeline_steps": args.timeline_steps,
                    "tokenizer": tokenizer,
                    "init_device": args.init_device,
                    "cuda": cuda,
                    "port": free_port(),
                    "pipe": parsed[name].get("pipe"),
                    "pipe_devices": stage_devices if parsed[name]["engine"] == "pipe" else None,
                }
                row = run_or_skip(spec, args, report, started, gpus)
                start_method = spec["start_method"]  # spawn from now on if forkserver failed
                report["results"].append(row)
                if "gpu_info" in row:
                    environment.update(row.pop("gpu_info"))
                update(report, args, started)
                print(
                    f"=== world {world_size} {shape} {name}: {_train_report.one_line(row)}",
                    flush=True,
                )
    print(_train_report.markdown(report), flush=True)
    return 0


def run_or_skip(
    spec: dict[str, Any],
    args: argparse.Namespace,
    report: dict[str, Any],
    started: float,
    gpus: int,
) -> dict[str, Any]:
    """One configuration's row: skipped (a pipe at world size > 1, too few GPUs, budget spent)
    or measured, under ``spawn`` once ``forkserver`` has failed to start a first run."""
    elapsed = time.perf_counter() - started
    remaining = None if args.budget_s is None else args.budget_s - elapsed
    skip = None
    if spec["engine"] == "pipe" and spec["world_size"] != 1:
        skip = "pipe runs as one process: world size 1 only"  # not data parallel here
    elif spec["cuda"] and spec["world_size"] > gpus:
        skip = f"needs {spec['world_size']} GPUs, {gpus} visible"
    elif remaining is not None and remaining < 20:
        skip = "budget spent"
    if skip:
        return {**_train_launch.summarize(spec, [], skip, 0.0), "error": "skipped"}
    timeout = args.config_timeout if remaining is None else min(args.config_timeout, remaining)
    label = f"world {spec['world_size']} {spec['shape']} {spec['config']}"
    print(f"=== {label}: start (timeout {timeout:.0f} s)", flush=True)
    row = _train_launch.run_config(spec, timeout)
    if (
        spec["start_method"] == "forkserver"
        and not report["start_method_checked"]
        and _train_launch.forkserver_failed(row)
    ):
        print(f"=== {label}: failed under forkserver ({row.get('message')}); using spawn")
        report["forkserver_failure"] = row.get("message")
        spec["start_method"] = "spawn"
        row = _train_launch.run_config(spec, timeout)
    report["start_method_checked"] = report["start_method_checked"] or "error" not in row
    row.pop("no_rank_reported", None)
    return row


def update(report: dict[str, Any], args: argparse.Namespace, started: float) -> None:
    """Ratios, target checks and the pipe analysis over the rows so far; JSON and Markdown."""
    rows = report["results"]
    _train_compare.add_ratios(rows, args.baseline.split(","), args.compare_to or None)
    report["target_checks"] = _train_compare.target_checks(report)
    report["pipe_analysis"] = _train_pipe.pipe_analysis(report)
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    _bench.write_json(args.out, report)
    _bench.write_text(args.out.with_suffix(".md"), _train_report.markdown(report))


if __name__ == "__main__":
    sys.exit(main())
