"""Where a scoring pass's wall time goes on one GPU: the host (packing, Python through the model)
or the GPU, and whether anything in a forward waits for the device.

A GPT-2 124M (random weights, bf16-mixed as ``task_scores`` scores) scores the synthetic suite's
shapes with random tokens: HellaSwag's (10,000 contexts of 60-140 tokens, four endings of 20-45)
and MMLU's (12,000 contexts of 80-300 tokens, one-token answers), in the package's packed
batches, in a scoring step's precision context as ``task_scores`` scores:

- ``first_pass_s``: :func:`~tango_fairscale.evaluation.scoring.score_queries` as the step calls
  it, once (kernels chosen); ``pass_s``: again;
- ``nvml_busy_pct_*``: NVML's utilisation over each pass, as ``lm_eval_speed.py`` samples it
  (``_by_arrival``: the samples whose line arrived inside the pass);
- ``pack_s``: building its packed batches on the host alone;
- ``enqueue_s`` / ``forwards_s``: the same forwards over batches packed and moved beforehand,
  queued without a wait: the host's time to queue them, then the time until the GPU is done
  (``forwards_s`` near ``enqueue_s``: the host never got far ahead, whether bound by its own
  work or held back by the GPU, through a full launch queue or a copy that waits);
- ``kernel_ms``, ``launch_ms``, ``alone_ms``: one forward at a time (:func:`one_forward_figures`);
- ``device_waits``: the places in one forward where the host waits for the GPU
  (``torch.cuda.set_sync_debug_mode("warn")``), with their Python stack.

    python benchmarks/scoring_probe.py [--tokenizer DIR] [--out scoring_probe.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()


def task_queries(task: str, scale: float = 1.0, seed: int = 0) -> list[Any]:
    """Random-token queries in the synthetic task's shape (see the module docstring), ``scale``
    times as many."""
    from tango_fairscale.data.queries import Query

    rng = random.Random(seed)

    def tokens(low: int, high: int) -> tuple[int, ...]:
        return tuple(rng.randrange(50000) for _ in range(rng.randint(low, high)))

    queries = []
    if task == "hellaswag":
        for _ in range(int(10000 * scale)):
            context = tokens(60, 140)
            for _ in range(4):
                ending = tokens(20, 45)
                queries.append(Query(context + ending, len(ending)))
    else:
        for _ in range(int(12000 * scale)):
            queries.append(Query(tokens(80, 300) + tokens(1, 1), 1))
    return queries


#: How torch's one-time notice that its sync debug mode is a prototype begins (not a wait).
SYNC_DEBUG_NOTICE = "Synchronization debug mode is a prototype feature"


def device_waits(forward: Any, batch: dict[str, torch.Tensor]) -> list[str]:
    """Each wait for the device in one ``forward(batch)``: its message and the innermost
    package or transformers frames of its Python stack."""
    found: list[str] = []

    def record(message: Any, *args: Any, **kwargs: Any) -> None:
        if str(message).startswith(SYNC_DEBUG_NOTICE):  # printed at the mode's first use
            return
        frames = [
            f"{frame.filename.split('/')[-1]}:{frame.lineno} {frame.name}"
            for frame in traceback.extract_stack()
            if "tango_fairscale" in frame.filename or "transformers" in frame.filename
        ]
        found.append(f"{str(message)[:120]} | {' < '.join(reversed(frames[-4:]))}")

    if batch["input_ids"].device.type != "cuda":
        return []
    torch.cuda.synchronize()
    shown = warnings.showwarning
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                forward(batch)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    finally:
        warnings.showwarning = shown
    return found


#: Batch sizes probed by default: the scoring step's defaults, then 256 queries and 16,384 tokens.
DEFAULT_SIZES = "1024x32768,256x16384"

#: Forwards measured one at a time (from a quarter into the pass: full batches).
DETAILED_FORWARDS = 8


def one_forward_figures(model: Any, batches: list[dict[str, Any]], on_gpu: bool) -> dict[str, Any]:
    """Per forward of ``batches`` (on the device), mean ms: ``kernel_ms`` (the GPU's kernels, by
    torch.profiler), ``launch_ms`` (the host's time until the call returns, the GPU idle
    before it) and ``alone_ms`` (until the GPU is done too)."""
    if not on_gpu:
        return {}
    launch, alone = [], []
    for batch in batches:
        torch.cuda.synchronize()
        started = time.perf_counter()
        model(**batch)
        launch.append(time.perf_counter() - started)
        torch.cuda.synchronize()
        alone.append(time.perf_counter() - started)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for batch in batches:
            model(**batch)
        torch.cuda.synchronize()
    kernel_us = sum(  # the kernels' rows only: an operator's row sums its kernels again
        event.self_device_time_total
        for event in profile.key_averages()
        if event.device_type == DeviceType.CUDA
    )
    return {
        "kernel_ms": round(kernel_us / 1e3 / len(batches), 2),
        "launch_ms": round(sum(launch) * 1e3 / len(batches), 2),
        "alone_ms": round(sum(alone) * 1e3 / len(batches), 2),
    }


def probe_task(
    model: Any, task: str, options: Any, scale: float, sampler: _bench.GpuSampler
) -> dict[str, Any]:
    from tango_fairscale.data.batches import packed_batch
    from tango_fairscale.data.schedules import scoring_batches
    from tango_fairscale.evaluation.scoring import SCORING_WIDTH_MULTIPLE, score_queries
    from tango_fairscale.runtime.devices import move_batch

    device = next(model.parameters()).device
    queries = task_queries(task, scale)

    def forward(batch: dict[str, torch.Tensor]) -> Any:
        return model(**move_batch(batch, device))

    pad = model.pad_token_id

    def score() -> Any:
        return score_queries(forward, queries, options, pad_token_id=pad, device=device)

    on_gpu = device.type == "cuda"

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    started = time.perf_counter()
    score()  # as a command's pass: kernels chosen
    synchronize()
    first_pass = (started, time.perf_counter())
    started = time.perf_counter()
    score()
    synchronize()
    second_pass = (started, time.perf_counter())

    started = time.perf_counter()
    indices = scoring_batches(queries, options.batch_size, options.max_batch_tokens, True)
    batches = [
        packed_batch([queries[i] for i in rows], pad, width_multiple=SCORING_WIDTH_MULTIPLE)
        for rows in indices
    ]
    pack_s = time.perf_counter() - started
    moved = [move_batch(batch, device) for batch in batches]
    synchronize()
    started = time.perf_counter()
    outputs = [model(**batch)["loglikelihood"] for batch in moved]
    enqueue_s = time.perf_counter() - started
    synchronize()
    forwards_s = time.perf_counter() - started
    del outputs
    detail = one_forward_figures(model, moved[len(moved) // 4 :][:DETAILED_FORWARDS], on_gpu)
    return {
        "task": task,
        "queries": len(queries),
        "forwards": len(batches),
        "tokens": sum(int(batch["input_ids"].numel()) for batch in batches),
        "first_pass_s": round(first_pass[1] - first_pass[0], 3),
        "pass_s": round(second_pass[1] - second_pass[0], 3),
        "nvml_busy_pct_first_pass": sampler.busy(first_pass),
        "nvml_busy_pct_pass": sampler.busy(second_pass),
        "nvml_busy_pct_pass_by_arrival": sampler.busy(second_pass, by_arrival=True),
        "pack_s": round(pack_s, 3),
        "enqueue_s": round(enqueue_s, 3),
        "forwards_s": round(forwards_s, 3),
        "host_ms_per_forward": round((pack_s + enqueue_s) / len(batches) * 1e3, 2),
        **detail,
        "device_waits": device_waits(lambda batch: model(**batch), moved[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _bench.add_data_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("scoring_probe.json"))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test (2%% of the queries)")
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help="batch sizes to probe, comma-separated QUERIESxTOKENS (batch_size x max_batch_tokens)",
    )
    args = parser.parse_args()
    from tango_fairscale.evaluation.call import EvalOptions
    from tango_fairscale.evaluation.lm import scoring_precision
    from tango_fairscale.model.causal_lm import ModelWrapper
    from tango_fairscale.parallel.precision import resolve_precision

    device = torch.device("cpu" if args.tiny else "cuda")
    shape = "tiny" if args.tiny else "124m"
    model = ModelWrapper(config=_bench.gpt2_config(shape), tokenizer=str(args.tokenizer))
    model.eval().to(device)
    rows = []
    sampler = _bench.GpuSampler()  # NVML's busy share of each pass, as lm_eval_speed.py reads it
    sampler.start()
    with scoring_precision(model, resolve_precision("bf16-mixed", device)):
        for size in args.sizes.split(","):
            batch_size, max_batch_tokens = (int(n) for n in size.split("x"))
            options = EvalOptions(batch_size, max_batch_tokens, packed=True, progress=False)
            for task in ("hellaswag", "mmlu"):
                row = probe_task(model, task, options, 0.02 if args.tiny else 1.0, sampler)
                rows.append({"batch_size": batch_size, "max_batch_tokens": max_batch_tokens, **row})
                print(json.dumps(rows[-1]), flush=True)
    sampler.stopped.set()
    environment = {**_bench.environment(None), "nvml_max_lag_s": round(sampler.max_lag_s(), 2)}
    _bench.write_json(args.out, {"environment": environment, "tasks": rows})


if __name__ == "__main__":
    main()
