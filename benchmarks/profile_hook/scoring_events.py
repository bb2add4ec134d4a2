"""Benchmarks only, through ``sitecustomize.py``: each of the package's log-likelihood passes
(``ScorerLM._score``) timed forward by forward: CUDA events around each forward (the GPU's time
in it, its gaps, its idle time before the first forward and after the last), the host's time
scheduling, packing and launching, and on a GPU the share of the pass in which a kernel ran, from
the kernels' own start and end times (CUPTI through ``torch.profiler`` with GPU activity only: no
host operators recorded; NVML's utilization samples the same quantity over windows of its own,
which for passes of one or two seconds take in the idle time around them). One JSON line per pass
appended to ``DIR/<pid>.jsonl``."""

import json
import os
import sys
import time


class _HostEvent:
    """``torch.cuda.Event``'s stand-in on a machine without a GPU (host time)."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, other: "_HostEvent") -> float:
        return (other.at - self.at) * 1e3


def _timed(function, totals, key):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + (time.perf_counter() - started) * 1e3

    return wrapper


def _kernel_busy(kernels, pass_ms):  # type: ignore[no-untyped-def]
    """The profiled pass's kernel milliseconds and their share of its ``pass_ms``."""
    kernel_ms = _union_ms(kernels.profiler.kineto_results.events())
    return {
        "kernel_ms": round(kernel_ms, 1),
        "kernel_busy_pct": round(100 * kernel_ms / pass_ms, 1),
    }


def _union_ms(events) -> float:  # type: ignore[no-untyped-def]
    """Milliseconds in which at least one of the profiled GPU kernels ran (copies left out, as
    NVML's utilization leaves them out)."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in events
        if e.device_type() == DeviceType.CUDA and not e.name().startswith(("Memcpy", "Memset"))
    )
    total, reached = 0, None
    for start, end in spans:
        if reached is None or start > reached:
            total += end - start
            reached = end
        elif end > reached:
            total += end - reached
            reached = end
    return total / 1e6


def evented(score, folder):  # type: ignore[no-untyped-def]
    import functools

    import torch

    scoring = sys.modules["tango_fairscale.evaluation.scoring"]
    batches = sys.modules["tango_fairscale.data.batches"]
    on_gpu = torch.cuda.is_available()
    event = torch.cuda.Event if on_gpu else _HostEvent

    @functools.wraps(score)
    def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        totals: dict = {}
        forwards: list = []
        call = self.call
        forward = call.forward
        kernels = None
        if on_gpu:  # started before the pass's clock: CUPTI's start is not the pass's
            from torch.profiler import ProfilerActivity, profile

            kernels = profile(activities=[ProfilerActivity.CUDA])
            kernels.__enter__()
        started = time.perf_counter()

        def evented_forward(batch):  # type: ignore[no-untyped-def]
            begin, end = event(enable_timing=True), event(enable_timing=True)
            launched = time.perf_counter()
            begin.record()
            outputs = forward(batch)
            end.record()
            forwards.append((begin, end, launched, time.perf_counter()))
            return outputs

        patched = {
            (scoring, "scoring_batches"): _timed(scoring.scoring_batches, totals, "schedule_ms"),
            (scoring, "packed_batch"): _timed(batches.packed_batch, totals, "pack_ms"),
            (scoring, "collate"): _timed(batches.collate, totals, "pack_ms"),
        }
        originals = {key: getattr(*key) for key in patched}
        for (module, name), value in patched.items():
            setattr(module, name, value)
        call.forward = evented_forward
        first, last = event(enable_timing=True), event(enable_timing=True)
        first.record()
        try:
            result = score(self, *args, **kwargs)
        finally:
            last.record()
            call.forward = forward
            for (module, name), value in originals.items():
                setattr(module, name, value)
        ended = time.perf_counter()
        busy: dict = {}
        if kernels is not None:
            torch.cuda.synchronize()
            kernels.__exit__(None, None, None)
            busy = _kernel_busy(kernels, first.elapsed_time(last))  # type: ignore[arg-type]
        if forwards:
            gpu = [begin.elapsed_time(end) for begin, end, _, _ in forwards]
            gaps = [a[1].elapsed_time(b[0]) for a, b in zip(forwards, forwards[1:])]
            row = {
                "pass_s": round(ended - started, 3),
                "forwards": len(forwards),
                "gpu_ms_sum": round(sum(gpu), 1),
                "event_busy_pct": round(100 * sum(gpu) / 1e3 / (ended - started), 1),
                "first_forward_gpu_ms": round(gpu[0], 1),
                "gaps_ms_sum": round(sum(gaps), 1),
                "gpu_idle_before_first_ms": round(first.elapsed_time(forwards[0][0]), 1),
                "gpu_idle_after_last_ms": round(forwards[-1][1].elapsed_time(last), 1),
                "host_before_first_forward_ms": round((forwards[0][2] - started) * 1e3, 1),
                "host_after_last_forward_ms": round((ended - forwards[-1][3]) * 1e3, 1),
                "host_forward_ms_sum": round(sum(b - a for _, _, a, b in forwards) * 1e3, 1),
                **busy,
                **{key: round(value, 1) for key, value in totals.items()},
            }
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as file:
                file.write(json.dumps(row) + "\n")
        return result

    return wrapper
