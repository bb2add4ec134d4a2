"""Where a process's peak GPU memory goes (``train_speed.py --memory-peak``): the allocator's
history recorded over the timed steps, replayed to the moment the most memory was allocated, and
the allocations alive then grouped by the first package line that made them.

Memory allocated before the recording (weights, optimizer state, anything the steps keep) is the
``baseline``; what the steps add on top of it is listed. A CUDA graph's replays allocate nothing:
its memory shows where it was captured, as it was allocated then.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

#: Allocator events kept (a 124M eager step makes a few thousand).
MAX_ENTRIES = 2_000_000
#: Groups listed, largest first.
TOP = 15
#: Allocations and frees of a MiB or more listed before the peak's (a third as many after).
AROUND = 45


def start() -> int:
    """Record every allocation from now on (Python stacks); the bytes allocated now."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    return torch.cuda.memory_allocated()


def recordable(recording: bool) -> contextlib.AbstractContextManager[Any]:
    """Where ``recording``: activation checkpoints recompute whole blocks. Their early stop
    raises an exception through the recomputation, and a Python stack taken for an allocation
    meanwhile loses it (torch 2.11: "run_backward returned NULL without setting an exception");
    the memory a step holds is the same."""
    if not recording:
        return contextlib.nullcontext()
    import torch.utils.checkpoint

    return torch.utils.checkpoint.set_checkpoint_early_stop(False)


def breakdown(baseline: int) -> dict[str, Any]:
    """Stop recording; the peak the history reaches from ``baseline`` and what was alive then."""
    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [
        event
        for event in snapshot["device_traces"][torch.cuda.current_device()]
        if event["action"] in ("alloc", "free_requested")
    ]
    peak_index, peak = _peak(events, baseline)
    alive: dict[int, dict[str, Any]] = {}
    for event in events[: peak_index + 1]:
        if event["action"] == "alloc":
            alive[event["addr"]] = event
        else:
            alive.pop(event["addr"], None)
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in alive.values():
        group = groups[where(event)]
        group[0] += event["size"]
        group[1] += 1
    ranked = sorted(groups.items(), key=lambda item: -item[1][0])
    gib = 1 << 30
    return {
        "baseline_gib": round(baseline / gib, 3),
        "peak_gib": round(peak / gib, 3),
        "added_at_peak_gib": round(sum(size for size, _ in groups.values()) / gib, 3),
        "peak_made_by": where(events[peak_index]) if events else None,
        "alive_at_peak": [
            {"where": name, "mib": round(size / (1 << 20), 1), "tensors": count}
            for name, (size, count) in ranked[:TOP]
        ],
        "around_peak": _around(events, peak_index),
    }


def _around(events: list[dict[str, Any]], peak_index: int) -> list[str]:
    """The allocations and frees of at least a MiB just before and after the peak's."""
    large = [i for i, event in enumerate(events) if event["size"] >= 1 << 20]
    before = [i for i in large if i <= peak_index][-AROUND:]
    after = [i for i in large if i > peak_index][: AROUND // 3]
    return [
        f"{'>' if i == peak_index else ' '} {events[i]['action']:<14} "
        f"{events[i]['size'] / (1 << 20):8.1f} MiB  stream {events[i].get('stream', '?')}  "
        f"{where(events[i])}"
        for i in before + after
    ]


def _peak(events: list[dict[str, Any]], baseline: int) -> tuple[int, int]:
    """The index of the event after which the most was allocated, and that many bytes (a free
    of memory allocated before the recording lowers the baseline)."""
    current = peak = baseline
    peak_index = 0
    for index, event in enumerate(events):
        if event["action"] == "alloc":
            current += event["size"]
            if current > peak:
                peak, peak_index = current, index
        else:
            current -= event["size"]
    return peak_index, peak


def where(event: dict[str, Any]) -> str:
    """The first package frame of an allocation (else its first frame): ``file:line function``."""
    frames = event.get("frames") or []
    for frame in frames:
        if "tango_fairscale/" in frame["filename"]:
            name = frame["filename"].split("tango_fairscale/", 1)[1]
            return f"{name}:{frame['line']} {frame['name']}"
    if frames:
        frame = frames[0]
        return f"{frame['filename'].rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"
    return "(no Python frame)"
