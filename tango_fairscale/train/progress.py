"""The training progress bar (rank 0): steps done, wall time, and in its postfix the remaining
time over training steps only, the step time, and the last logged loss, learning rate, tokens/s
and memory.

tqdm's own remaining time and rate average over every second since the last display, so a
validation or a checkpoint inside a step makes them jump; here they come from step times with
those pauses left out (:meth:`TrainingBar.skip`).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

from tango.common import Tqdm
from tqdm import tqdm

#: tqdm's layout with its remaining time and rate left out: the postfix carries ours.
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

#: Weight of the newest step in the step-time average (tqdm's default smoothing).
SMOOTHING = 0.3


class TrainingBar:
    """Iterates over the steps ``start .. total - 1`` under a bar shown when ``enabled``;
    :meth:`stepped` after each step, :meth:`skip` after time that is not training."""

    def __init__(self, start: int, total: int, enabled: bool) -> None:
        self.total = total
        self.done = start
        self.bar = Tqdm.tqdm(
            range(start, total),
            desc="Training",
            initial=start,
            total=total,
            disable=not enabled,
            bar_format=BAR_FORMAT,
        )
        self.step_s: float | None = None
        self.figures: dict[str, str] = {}
        self._since = time.perf_counter()

    def __iter__(self) -> Iterator[int]:
        self.skip()  # the first step's time starts here, not when the run was built
        return iter(self.bar)

    def stepped(self, done: int) -> None:
        """Step ``done`` ended: time it (since the previous step or :meth:`skip`)."""
        now = time.perf_counter()
        seconds, self._since = now - self._since, now
        if self.step_s is None:
            self.step_s = seconds
        else:
            self.step_s = SMOOTHING * seconds + (1 - SMOOTHING) * self.step_s
        self.done = done
        self._show()

    def skip(self) -> None:
        """Leave the time since the last step (validation, a checkpoint) out of the step time."""
        self._since = time.perf_counter()

    def show(self, loss: float, lr: float, figures: dict[str, Any]) -> None:
        """Put a logged step's loss, learning rate and throughput figures
        (:meth:`~tango_fairscale.train.meter.Throughput.report`) in the postfix."""
        self.figures = {"loss": f"{loss:.4f}", "lr": f"{lr:.3g}", **brief_figures(figures)}
        self._show()

    def _show(self) -> None:
        self.bar.set_postfix_str(postfix(self.step_s, self.total - self.done, self.figures), False)


def postfix(step_s: float | None, left: int, figures: dict[str, str]) -> str:
    """``eta=M:SS, S.Ss/it, loss=..., lr=..., tok/s=..., mem=...`` (what is known so far)."""
    shown = []
    if step_s is not None:
        shown += [f"eta={tqdm.format_interval(step_s * left)}", rate(step_s)]
    shown += [f"{key}={value}" for key, value in figures.items()]
    return ", ".join(shown)


def rate(step_s: float) -> str:
    return f"{step_s:.2f}s/it" if step_s >= 1 else f"{1 / max(step_s, 1e-9):.2f}it/s"


def brief_figures(figures: dict[str, Any]) -> dict[str, str]:
    """tokens/s, MFU where known, and memory: the GPU's peak, else this process's peak RSS."""
    shown = {"tok/s": f"{figures['tokens_per_s']:,.0f}"}
    if "mfu" in figures:
        shown["mfu"] = f"{figures['mfu']:.1%}"
    if "peak_memory_gib" in figures:
        shown["mem"] = f"{figures['peak_memory_gib']:.1f}G"
    else:
        shown["rss"] = f"{peak_rss_gib():.1f}G"
    return shown


def peak_rss_gib() -> float:
    """This process's peak resident memory (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)
