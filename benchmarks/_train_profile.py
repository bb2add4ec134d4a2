"""train_speed.py's profiled steps: where a step's GPU time and host time go.

After the timed steps (never counted in them), rank 0 runs

* ``--profile-steps N`` more steps under ``torch.profiler`` (GPU only): wall ms per step and GPU
  kernel ms per step by kind (``_bench.gpu_ms_by_kind``: GEMM, attention, Inductor's compiled
  kernels, optimizer, communication, memcpy, other);
* ``--cprofile-steps N`` more steps under Python's ``cProfile``: the functions that take a
  host-bound step's time, by own and by cumulative time per step.

The other ranks run the same steps unprofiled (they join every collective). The steps reuse the
run's batches from the first. For synthetic data, :func:`kernel_tflops` turns the GEMM and
attention kernel times into achieved TFLOP/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bench

#: Functions listed per cProfile table (by own time, by cumulative time).
CPROFILE_ROWS = 25


def profile(
    engine: Any,
    batch_for: Callable[[int], Any],
    n_steps: int,
    sync: Callable[[], None],
    rank: int,
    spec: dict[str, Any],
) -> dict[str, Any]:
    """``gpu_ms_per_step`` and ``host_profile`` (``None`` where not asked for or not rank 0)."""
    import torch

    def run(count: int) -> None:
        for step in range(count):
            loss, _ = engine.forward_train(batch_for(step % n_steps), 0, 1)
            engine.backward(loss)
            engine.step()

    result: dict[str, Any] = {"gpu_ms_per_step": None, "top_kernels": None, "host_profile": None}
    count = spec.get("profile_steps") or 0
    if count:
        if rank == 0 and torch.cuda.is_available():
            by_kind, top = kernel_time(lambda: run(count), count, sync)
            result.update(gpu_ms_per_step=by_kind, top_kernels=top)
        else:
            run(count)
    count = spec.get("cprofile_steps") or 0
    if count:
        if rank == 0:
            result["host_profile"] = python_time(lambda: run(count), count, sync)
        else:
            run(count)
    return result


def kernel_time(
    run: Callable[[], None], count: int, sync: Callable[[], None]
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Wall ms per step and GPU kernel ms per step by kind, of ``count`` steps; and the kernels
    that take the most GPU time (``_bench.top_kernels``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sync()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        begin = time.perf_counter()
        run()
        sync()
        wall = time.perf_counter() - begin
    totals = _bench.kernel_totals(prof.events())
    by_kind = {"wall": round(1000 * wall / count, 3), **_bench.gpu_ms_by_kind(totals, count)}
    return by_kind, _bench.top_kernels(totals, count)


def python_time(run: Callable[[], None], count: int, sync: Callable[[], None]) -> dict[str, Any]:
    """Wall ms per step under ``cProfile`` and the top functions by own and cumulative ms per
    step (``calls`` per step too)."""
    import cProfile
    import pstats

    sync()
    profiler = cProfile.Profile()
    begin = time.perf_counter()
    profiler.enable()
    run()
    sync()
    profiler.disable()
    wall = time.perf_counter() - begin
    profiled: Any = pstats.Stats(profiler)
    stats = profiled.stats  # {(file, line, name): (primitive calls, calls, own, cumulative, _)}
    rows = [
        {
            "function": function_name(key),
            "calls": round(calls / count, 1),
            "own_ms": round(1000 * own / count, 3),
            "cumulative_ms": round(1000 * cumulative / count, 3),
        }
        for key, (_, calls, own, cumulative, _callers) in stats.items()
        if Path(key[0]).name != "_train_profile.py"  # this module's own loop around the steps
    ]
    return {
        "wall_ms": round(1000 * wall / count, 3),
        "steps": count,
        "by_own_time": sorted(rows, key=lambda r: -r["own_ms"])[:CPROFILE_ROWS],
        "by_cumulative_time": sorted(rows, key=lambda r: -r["cumulative_ms"])[:CPROFILE_ROWS],
    }


def function_name(key: tuple[str, int, str]) -> str:
    """``fairscale/nn/data_parallel/fully_sharded_data_parallel.py:1234(_rebuild_full_params)``:
    the path from the installed package on (or the built-in's name)."""
    path, line, name = key
    if path == "~":
        return name
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages", "tango_fairscale"):
        if marker in parts:
            start = parts.index(marker) + (marker != "tango_fairscale")
            path = "/".join(parts[start:])
            break
    return f"{path}:{line}({name})"


def kernel_tflops(spec: dict[str, Any], gpu_ms: dict[str, float]) -> dict[str, float | None]:
    """Achieved TFLOP/s inside the GEMM and the attention kernels of one synthetic step.

    GEMM FLOPs per token 6 x (12 n_layer n_embd^2 + vocab n_embd) (the blocks' four
    projections and the LM head, forward and backward), attention 12 n_layer n_embd seq_len
    (the MFU formula's term, as if not causal); x 4/3 with activation checkpointing (the
    forward again).
    """
    shape = spec["model_config"]
    layers, width = shape["n_layer"], shape["n_embd"]
    recompute = 4 / 3 if "ckpt" in spec.get("modifiers", []) else 1.0
    tokens = spec["batch_size"] * spec["seq_len"] * recompute
    flops = {
        "gemm": 6 * (12 * layers * width**2 + shape["vocab_size"] * width) * tokens,
        "attention": 12 * layers * width * spec["seq_len"] * tokens,
    }
    return {
        kind: round(flops[kind] / (gpu_ms[kind] / 1000) / 1e12, 1) if gpu_ms.get(kind) else None
        for kind in flops
    }
