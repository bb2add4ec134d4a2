"""train_speed.py's comparisons within one run: ratios to baselines, and the memory target.

* ``x base``: every row against the DDP run of the same shape and world size (the same precision
  if measured, else the first of ``--baseline``);
* ``x COMPARE``: against ``--compare-to`` at the same shape, world size and batch;
* the target check: ``--target`` against ``--compare-to``, peak memory at most 1/3 and
  throughput at least 1x (FairScale bf16 + checkpointing against DDP fp32 on PIQA batches).
"""

from __future__ import annotations

from typing import Any

#: A target configuration's peak memory at most this fraction of the comparison
#: configuration's, and its throughput at least this multiple, at the same batch, unless
#: ``--target`` gives its own (``CONFIG:THROUGHPUT:MEMORY``).
TARGET_MEMORY_RATIO = 1 / 3
TARGET_THROUGHPUT_RATIO = 1.0


def parse_targets(text: str | None) -> list[tuple[str, float, float]]:
    """``--target``'s comma-separated ``CONFIG[:THROUGHPUT:MEMORY]`` entries as (config,
    throughput floor, memory ceiling), the defaults where an entry gives a config alone."""
    targets = []
    for entry in filter(None, (text or "").split(",")):
        config, *bounds = entry.split(":")
        if bounds and len(bounds) != 2:
            raise ValueError(f"--target {entry!r}: give CONFIG or CONFIG:THROUGHPUT:MEMORY")
        throughput, memory = (
            map(float, bounds) if bounds else (TARGET_THROUGHPUT_RATIO, TARGET_MEMORY_RATIO)
        )
        targets.append((config, throughput, memory))
    return targets


def baseline_for(row: dict[str, Any], rows: list[dict[str, Any]], preference: list[str]) -> Any:
    """DDP of the same precision, shape and world size if measured, else per ``preference``."""
    group = [
        r
        for r in rows
        if r["engine"] == "ddp"
        and "error" not in r
        and r["shape"] == row["shape"]
        and r["world_size"] == row["world_size"]
    ]
    same = [r for r in group if r["precision"] == row["precision"]]
    if same:
        return same[0]
    for name in preference:
        for r in group:
            if r["config"] == name:
                return r
    return group[0] if group else None


def add_ratios(
    rows: list[dict[str, Any]], preference: list[str], compare_to: str | None = None
) -> None:
    """``*_vs_baseline`` (same-precision DDP) and ``*_vs_compare`` (``compare_to``) ratios."""
    for row in rows:
        base = baseline_for(row, rows, preference)
        row["baseline"] = base["config"] if base else None
        if base is not None and "error" not in row:
            row["tokens_per_s_vs_baseline"] = ratio(row, base, "tokens_per_s_per_gpu")
            row["peak_allocated_vs_baseline"] = ratio(row, base, "peak_allocated_gib")
        other = same_group(row, rows, compare_to) if compare_to else None
        row["compare_to"] = compare_to if other else None
        if other is not None and "error" not in row:
            row["tokens_per_s_vs_compare"] = ratio(row, other, "tokens_per_s_per_gpu")
            row["peak_allocated_vs_compare"] = ratio(row, other, "peak_allocated_gib")
            row["peak_reserved_vs_compare"] = ratio(row, other, "peak_reserved_gib")


def same_group(row: dict[str, Any], rows: list[dict[str, Any]], config: str) -> Any:
    """The error-free run of ``config`` with the same shape, world size and batch size."""
    for other in rows:
        if (
            other["config"] == config
            and "error" not in other
            and other["shape"] == row["shape"]
            and other["world_size"] == row["world_size"]
            and other["batch_size"] == row["batch_size"]
        ):
            return other
    return None


def ratio(row: dict[str, Any], base: dict[str, Any], key: str) -> float | None:
    if not row.get(key) or not base.get(key):
        return None
    return round(row[key] / base[key], 3)


def target_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each ``--target`` against ``--compare-to``, per shape and world size."""
    settings = report["settings"]
    compare_to = settings.get("compare_to")
    if not compare_to:
        return []
    checks = []
    for target, throughput_target, memory_target in parse_targets(settings.get("target")):
        for row in report["results"]:
            if row["config"] == target:
                checks.append(
                    _check(row, report["results"], compare_to, throughput_target, memory_target)
                )
    return checks


def _check(
    row: dict[str, Any],
    rows: list[dict[str, Any]],
    compare_to: str,
    throughput_target: float,
    memory_target: float,
) -> dict[str, Any]:
    base = same_group(row, rows, compare_to)
    check: dict[str, Any] = {
        "world_size": row["world_size"],
        "shape": row["shape"],
        "batch_size": row["batch_size"],
        "target": row["config"],
        "compare_to": compare_to,
        "memory_target": round(memory_target, 4),
        "throughput_target": throughput_target,
    }
    if "error" in row or base is None:
        check["status"] = (
            f"{row['config']}: {row['error']}" if "error" in row else f"{compare_to} not measured"
        )
        return check
    memory = row.get("peak_allocated_vs_compare")
    throughput = row.get("tokens_per_s_vs_compare")
    check.update(
        peak_allocated_gib=row.get("peak_allocated_gib"),
        compare_peak_allocated_gib=base.get("peak_allocated_gib"),
        peak_allocated_ratio=memory,
        peak_reserved_ratio=row.get("peak_reserved_vs_compare"),
        tokens_per_s_per_gpu=row["tokens_per_s_per_gpu"],
        compare_tokens_per_s_per_gpu=base["tokens_per_s_per_gpu"],
        tokens_per_s_ratio=throughput,
        memory_met=None if memory is None else memory <= memory_target,
        throughput_met=None if throughput is None else throughput >= throughput_target,
        status="measured",
    )
    return check
