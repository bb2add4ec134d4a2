"""What stops a run early: non-finite or diverged losses, and a preemption signal that every
rank agrees on."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..runtime.process_group import alone


class NonFiniteLossError(RuntimeError):
    """Training produced non-finite losses for longer than the engine tolerates."""


class DivergedError(NonFiniteLossError):
    """Training produced a loss past the divergence bound (:attr:`NonFiniteGuard.DIVERGENCE`)."""


class NonFiniteGuard:
    """Watches each step's loss (read on the host) and raises on the step it breaks.

    Under ``16-mixed`` the grad scaler skips overflowing steps, and up to ``SCALER_TOLERANCE``
    consecutive non-finite losses are tolerated; otherwise one non-finite loss is fatal (the
    optimizer has applied it). A finite loss above ``DIVERGENCE`` × ln(vocabulary size) — ten
    times the loss of a uniform guess over the vocabulary (GPT-2: 108) — is divergence, fatal
    too. ``examples_of(step)`` names the step's training examples.
    """

    SCALER_TOLERANCE = 10
    DIVERGENCE = 10

    def __init__(
        self, scaled: bool, examples_of: Callable[[int], list[int]], vocab_size: int
    ) -> None:
        self.bound = self.SCALER_TOLERANCE if scaled else 0
        self.divergence_bound = self.DIVERGENCE * math.log(vocab_size)
        self.examples_of = examples_of
        self.streak = 0

    def observe(self, step: int, loss: float) -> None:
        """Record step ``step``'s (1-based) loss; raise :class:`NonFiniteLossError` when the run
        broke (:class:`DivergedError` for a finite loss past the divergence bound)."""
        if math.isfinite(loss) and loss > self.divergence_bound:
            raise DivergedError(
                f"training diverged: loss {loss:.4g} at step {step} exceeds "
                f"{self.DIVERGENCE} x ln(vocabulary size) = {self.divergence_bound:.1f}; its "
                f"training examples: {self.examples_of(step - 1)}; training stopped, its last "
                "checkpoint is kept — lower lr or set max_grad_norm"
            )
        self.streak = 0 if math.isfinite(loss) else self.streak + 1
        if self.streak > self.bound:
            first = step - self.bound
            raise NonFiniteLossError(
                f"non-finite loss at step {first} ({self.streak} step(s) in a row, "
                f"{self.bound} tolerated); its training examples: {self.examples_of(first - 1)}; "
                "training stopped, its last checkpoint is kept — lower lr, set max_grad_norm, "
                "or use 32-true"
            )


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is true on any rank (one all-reduce; call on every rank)."""
    if alone():
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
