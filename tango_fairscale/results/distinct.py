"""What tells runs apart: reruns that started no step folded into the run whose result they
reused, and labels that name only the settings in which the runs shown differ."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .summary import RunSummary

#: Settings a label may name, in this order: (label, how to read it from a summary).
SETTINGS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("engine", "engine"),
    ("devices", "device_count"),
    ("precision", "precision"),
    ("steps", "train_steps"),
    ("batch", "batch_size"),
    ("lr", "lr"),
    ("seed", "seed"),
    ("tasks", "task_names"),
    ("limit", "limit"),
)


def fold_reruns(summaries: Sequence[RunSummary]) -> list[RunSummary]:
    """``summaries`` with each completed run that started no step (every result reused) folded
    into the earliest run shown that has the same metrics result and started steps itself: that
    run's ``reruns`` names them. A rerun whose original is not shown stays a row of its own."""
    originals: dict[str, int] = {}
    folded: list[RunSummary] = []
    for summary in summaries:
        key = _result_key(summary)
        if key is not None and summary.status == "completed" and key not in originals:
            if not _started_nothing(summary):
                originals[key] = len(folded)
        if key in originals and _started_nothing(summary) and summary.status == "completed":
            index = originals[key]
            reruns = (*folded[index].reruns, summary.name)
            folded[index] = dataclasses.replace(folded[index], reruns=reruns)
            continue
        folded.append(summary)
    return folded


def labels(summaries: Sequence[RunSummary]) -> dict[str, str]:
    """Each run's label: the settings whose values differ between ``summaries``
    (``engine=fsdp2, devices=2``); the run's name where none does, or where two runs would
    share a label."""
    differing = [
        (label, attribute)
        for label, attribute in SETTINGS
        if len({_shown(getattr(s, attribute)) for s in summaries}) > 1
    ]
    made = {
        s.name: ", ".join(f"{label}={_shown(getattr(s, attr))}" for label, attr in differing)
        for s in summaries
    }
    counts: dict[str, int] = {}
    for label in made.values():
        counts[label] = counts.get(label, 0) + 1
    return {
        name: label if label and counts[label] == 1 else (f"{name}: {label}" if label else name)
        for name, label in made.items()
    }


def _result_key(summary: RunSummary) -> str | None:
    metrics = next((s for n, s in summary.steps.items() if n == "metrics"), None)
    return None if metrics is None else metrics.record.unique_id


def _started_nothing(summary: RunSummary) -> bool:
    steps = summary.steps.values()
    return bool(summary.steps) and all(s.reused and not s.own for s in steps)


def _shown(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and len(value) > 30:
        return "…" + value[-29:]
    return "-" if value is None else str(value)
