"""train_speed.py's launcher: one fresh process group per configuration, and its result row.

:func:`run_config` starts ``world_size`` processes (:func:`_train_worker.worker`), waits at most
``timeout_s`` and turns what they wrote into one row (:func:`summarize`): step times, tokens/s
per GPU, MFU, peak memory per device; or the error (``OOM``, ``timeout``, ``crash``,
``error``), so that one failing configuration never stops the others. ``max_model.py`` runs its
trials through it too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench
import _train_profile
import _train_worker

#: Imported once by the forkserver, so that each configuration's workers start with them loaded
#: (a name that does not import is skipped: only the start-up gets slower).
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",  # these three: what fsdp2.py imports when used (FSDP2_CODE)
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "transformers",
    "transformers.models.gpt2.modeling_gpt2",
    "tango",
    "tango.integrations.torch",
    "fairscale",
    "tango_fairscale.model.causal_lm",
    "tango_fairscale.parallel.ddp",
    "tango_fairscale.parallel.fairscale",
    "tango_fairscale.parallel.fsdp2",
    "tango_fairscale.parallel.pipe",
    "tango_fairscale.data.batches",
]

#: Keys of a configuration's spec that its row repeats.
SPEC_KEYS = (
    "world_size", "data", "shape", "config", "engine", "precision", "modifiers", "sharding",
    "pipe", "batch_size", "seq_len", "warmup", "steps", "n_params",
)  # fmt: skip


def run_config(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Start ``world_size`` processes for one configuration; collect what they report.

    With ``start_method`` ``forkserver`` the workers fork from a server that imported
    :data:`PRELOAD` once; if no rank of the first such run reports anything, the caller falls
    back to ``spawn`` (:func:`forkserver_failed`).
    """
    import torch.multiprocessing as mp

    result_dir = Path(tempfile.mkdtemp(prefix="train-speed-"))
    started = time.perf_counter()
    failure = None
    try:
        context = mp.start_processes(
            _train_worker.worker,
            args=(spec, str(result_dir)),
            nprocs=spec["world_size"],
            join=False,
            start_method=spec["start_method"],
        )
        deadline = started + timeout_s
        while True:
            try:
                if context.join(timeout=2, grace_period=5):
                    break
            except Exception as error:  # a rank exited non-zero; the others were stopped
                failure = _bench.short_error(error)
                break
            if time.perf_counter() > deadline:
                failure = f"timeout: no result within {timeout_s:.0f} s"
                for process in context.processes:
                    if process.is_alive():
                        process.terminate()
                for process in context.processes:
                    process.join(10)
                    if process.is_alive():
                        process.kill()
                        process.join()
                break
        ranks = []
        for rank in range(spec["world_size"]):
            path = result_dir / f"rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.is_file() else {"rank": rank})
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    wall_s = round(time.perf_counter() - started, 1)
    row = summarize(spec, ranks, failure, wall_s)
    row["start_method"] = spec["start_method"]
    row["no_rank_reported"] = all(len(r) == 1 for r in ranks)
    return row


def forkserver_failed(row: dict[str, Any]) -> bool:
    """Did a run fail in a way that ``spawn`` might not (no worker reported, or CUDA and fork)?"""
    if "error" not in row or row["error"] in ("timeout", "skipped"):
        return False
    message = str(row.get("message") or "")
    return bool(row.get("no_rank_reported")) or any(
        text in message for text in ("fork", "initialization error", "Cannot re-initialize")
    )


def summarize(
    spec: dict[str, Any], ranks: list[dict[str, Any]], failure: str | None, wall_s: float
) -> dict[str, Any]:
    """One configuration's row: the spec's settings, then its measurements or its error."""
    row: dict[str, Any] = {key: spec.get(key) for key in SPEC_KEYS}
    row["wall_s"] = wall_s
    errors = [r for r in ranks if "error" in r]
    if errors or failure:
        first = next((r for r in errors if r["error"] == "OOM"), errors[0] if errors else None)
        row["error"] = first["error"] if first else (failure or "crash").split(":")[0]
        if row["error"] not in ("timeout", "OOM", "error"):
            row["error"] = "crash"
        row["message"] = first["message"] if first else failure
        if first:
            row["traceback"] = first.get("traceback")
        return row
    main = ranks[0]
    warmup = spec["warmup"]
    times = main["step_times_s"][warmup:]
    step_s = _bench.median(times)
    # GPUs (devices) doing the work: one per rank, or every stage of a pipe's one process.
    gpus = sum(len(r.get("devices") or [None]) for r in ranks)
    shape = spec["model_config"]
    # Tokens of the timed steps, summed over ranks (ranks' batches differ in length under piqa);
    # the steps of all ranks take the same time (gradients are reduced in every step).
    real = sum(sum(r["tokens"]["real"][warmup:]) for r in ranks)
    padded = sum(sum(r["tokens"]["padded"][warmup:]) for r in ranks)
    widths = [w for r in ranks for w in r["tokens"]["width"][warmup:]]
    # PIQA batches differ from step to step: throughput over the whole timed span; one fixed
    # synthetic batch: the median step is the step.
    span_s = sum(times) if spec["data"] == "piqa" else step_s * len(times)
    tokens_per_s = real / span_s / gpus
    mean_width = sum(widths) / len(widths)  # positions the model reads per row
    seq_for_flops = spec["seq_len"] or mean_width
    flops_per_token = 6 * spec["n_params"] + 12 * shape["n_layer"] * shape["n_embd"] * seq_for_flops
    losses = main["losses"]
    timeline = main.get("timeline_step_times_s")
    if timeline:  # the same batches, steps not synchronised (--timeline-steps)
        timeline_s = sum(timeline) / len(timeline)
        flops_per_step = flops_per_token * real / len(times) / gpus
        row.update(
            timeline_step_times_s=timeline,
            timeline_step_time_s_mean=round(timeline_s, 5),
            mfu_timeline=round(flops_per_step / timeline_s / _bench.PEAK_FLOPS, 6),
            mfu_synchronised_mean=round(
                flops_per_step * len(times) / sum(times) / _bench.PEAK_FLOPS, 6
            ),
        )
    row.update(
        step_time_s_median=round(step_s, 5),
        step_time_s_mean=round(sum(times) / len(times), 5),
        step_time_s_min=min(times),
        step_time_s_max=max(times),
        step_times_s=main["step_times_s"],
        gpus=gpus,
        tokens_per_step_per_gpu=round(real / len(times) / gpus, 1),
        tokens_per_s_per_gpu=round(tokens_per_s, 1),
        tokens_per_s_total=round(tokens_per_s * gpus, 1),
        padded_tokens_per_s_per_gpu=round(padded / span_s / gpus, 1),
        padding_fraction=round(1 - real / padded, 4),
        mean_positions_per_row=round(mean_width, 1),
        scored_tokens_timed=sum(sum(r["tokens"]["scored"][warmup:]) for r in ranks),
        real_tokens_timed=real,
        padded_tokens_timed=padded,
        mfu=round(flops_per_token * tokens_per_s / _bench.PEAK_FLOPS, 6),
        loss_first=losses[0],
        loss_last=losses[-1],
        losses_finite=all(x == x and abs(x) != float("inf") for x in losses),
        setup_s=main["setup_s"],
        init_device=main["init_device"],
        fsdp_units=main["fsdp_units"],
        graphed_lengths=main.get("graphed_lengths", []),
        grad_scale_final=main.get("grad_scale_final"),
        devices=[d for r in ranks for d in r.get("devices") or []],
    )
    if spec["engine"] == "pipe":
        row.update(stage_devices=main.get("stage_devices"), balance=main.get("balance"))
    gpu_ms = main.get("gpu_ms_per_step")
    if gpu_ms:
        row["gpu_ms_per_step"] = gpu_ms
        if spec["data"] == "synthetic" and spec["engine"] != "pipe":
            row["kernel_tflops"] = _train_profile.kernel_tflops(spec, gpu_ms)
    if main.get("top_kernels"):
        row["top_kernels"] = main["top_kernels"]
    if main.get("host_profile"):
        row["host_profile"] = main["host_profile"]
    if main.get("memory_at_peak"):
        row["memory_at_peak"] = main["memory_at_peak"]
    if "peak_allocated" in main:
        row.update(memory_row(main, ranks))
    if "gpu_info" in main:
        row["gpu_info"] = main["gpu_info"]
    return row


def memory_row(main: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak memory: the largest over GPUs, and per device in rank order (a pipe: its stages)."""

    def per_device(key: str) -> list[float | None]:
        return [_bench.gib(x) for r in ranks for x in r[key]]

    return {
        "device_name": main.get("device_name"),
        "peak_allocated_gib": _bench.gib(max(r["peak_allocated"] for r in ranks)),
        "peak_reserved_gib": _bench.gib(max(r["peak_reserved"] for r in ranks)),
        "peak_allocated_gib_per_rank": [_bench.gib(r["peak_allocated"]) for r in ranks],
        "peak_reserved_gib_per_rank": [_bench.gib(r["peak_reserved"]) for r in ranks],
        "peak_allocated_gib_per_device": per_device("peak_allocated_per_device"),
        "peak_reserved_gib_per_device": per_device("peak_reserved_per_device"),
        "allocated_after_setup_gib_per_device": per_device("allocated_after_setup_per_device"),
    }
