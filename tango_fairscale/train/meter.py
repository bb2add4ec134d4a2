"""Training throughput for the progress bar and the log: tokens/s over all ranks, model FLOPs
utilisation on GPUs whose peak is known, peak memory, elapsed time."""

from __future__ import annotations

import time
from typing import Any

import torch

#: Dense bf16 peak FLOP/s per GPU, by a name ``torch.cuda.get_device_name`` contains.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or ``None`` (CPUs, GPUs not in :data:`PEAK_BF16_FLOPS`)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


class Throughput:
    """Counts the real (non-padding) tokens each step trains on and turns the tokens and time
    since the last :meth:`report` into figures. MFU counts 6 FLOPs per parameter and token (the
    forward and backward matrix products; attention and recomputation are left out)."""

    def __init__(self, num_parameters: int, device: torch.device, world_size: int) -> None:
        self.flops_per_token = 6 * num_parameters
        self.device = device
        self.peak = peak_flops(device)
        self.world_size = world_size
        self.started = self.since = time.perf_counter()
        self.tokens = 0

    def skip(self) -> None:
        """Leave the time since the last report out of the next interval (validation and
        checkpoints are not training time)."""
        self.since = time.perf_counter()

    def count(self, batch: dict[str, torch.Tensor]) -> None:
        """Add a micro-batch's real tokens (its attention mask, still on the host)."""
        self.tokens += int(batch["attention_mask"].sum())

    def report(self, tokens_on_all_ranks: int) -> dict[str, Any]:
        """``tokens_per_s`` (all ranks), ``mfu`` (on known GPUs), ``peak_memory_gib`` (this
        rank's, on GPUs) and ``elapsed_s`` since the first step, for the interval since the last
        report; ``tokens_on_all_ranks`` is :attr:`tokens` summed over the ranks."""
        now = time.perf_counter()
        tokens_per_s = tokens_on_all_ranks / max(now - self.since, 1e-9)
        self.since, self.tokens = now, 0
        figures: dict[str, Any] = {
            "tokens_per_s": round(tokens_per_s, 1),
            "elapsed_s": round(now - self.started, 2),
        }
        if self.peak is not None:
            mfu = tokens_per_s * self.flops_per_token / (self.peak * self.world_size)
            figures["mfu"] = round(mfu, 4)
        if self.device.type == "cuda":
            figures["peak_memory_gib"] = round(
                torch.cuda.max_memory_allocated(self.device) / 2**30, 2
            )
        return figures


class PhaseClock:
    """Where a run's time goes on this process: ``data`` (the launching step reading the
    training pairs and validation tasks), ``engine`` (joining the process group, the model's
    imports, load and wrapping), ``setup`` (resuming, building the schedule and validation
    tasks), ``first_step`` (to the first step's loss on the host: lazy initialisation
    and compilation), ``steps``, ``validation``, ``checkpoints`` (what the loop waited for) and
    ``final`` (the last checkpoint committed and the model consolidated)."""

    def __init__(self, **earlier: float) -> None:
        """``earlier``: phases timed before the clock started (seconds by phase; zeros left out)."""
        self.mark = time.perf_counter()
        self.seconds: dict[str, float] = {phase: s for phase, s in earlier.items() if s}

    def lap(self, phase: str) -> None:
        """Add the time since the last lap to ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.mark
        self.mark = now

    def summary(self) -> dict[str, float]:
        return {phase: round(seconds, 2) for phase, seconds in self.seconds.items()}

    def describe(self, first: int, steps: int) -> str:
        """One line: each phase's seconds; ``first`` steps were in ``first_step`` (one, unless
        resumed), ``steps`` in all; the other steps' mean."""
        parts = []
        for phase, seconds in self.seconds.items():
            if phase == "first_step" and first > 1:
                parts.append(f"first {first} steps {seconds:.1f} s")
            elif phase == "steps" and steps > first:
                each = seconds / (steps - first) * 1e3
                parts.append(f"{steps - first} more steps {seconds:.1f} s ({each:.1f} ms each)")
            else:
                parts.append(f"{phase.replace('_', ' ')} {seconds:.1f} s")
        return "time split: " + ", ".join(parts)
