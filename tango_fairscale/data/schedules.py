"""Which queries go together: scoring batches (length-sorted, token budgets) and the training
schedule (which examples every rank sees at every step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .batches import context_groups, segment_size
from .queries import Query


def scoring_batches(
    queries: Sequence[Query],
    batch_size: int,
    max_tokens: int | None = None,
    packed: bool = False,
) -> list[list[int]]:
    """Indices of ``queries`` in scoring batches, longest first.

    Unpacked: :func:`length_sorted_batches` (``max_tokens`` counts padded tokens). Packed (for
    :func:`packed_batch`): queries sharing a context stay together, groups of similar length go
    in one batch of at most ``batch_size`` queries and ``max_tokens`` tokens (packed rows leave
    little padding, so tokens are counted without it).
    """
    if not packed:
        return length_sorted_batches(queries, batch_size, max_tokens)
    groups = [
        group[start : start + batch_size]
        for group in context_groups(queries)
        for start in range(0, len(group), batch_size)
    ]
    sizes = [segment_size(queries, group) for group in groups]
    batches: list[list[int]] = []
    count = tokens = 0
    for index in sorted(range(len(groups)), key=lambda g: (-sizes[g], g)):
        group = groups[index]
        if (
            batches
            and count + len(group) <= batch_size
            and (max_tokens is None or tokens + sizes[index] <= max_tokens)
        ):
            batches[-1].extend(group)
            count += len(group)
            tokens += sizes[index]
        else:
            batches.append(list(group))
            count, tokens = len(group), sizes[index]
    return batches


def length_sorted_batches(
    queries: Sequence[Query], batch_size: int, max_tokens: int | None = None
) -> list[list[int]]:
    """Indices of ``queries`` grouped into batches of similar length, longest first.

    A batch holds at most ``batch_size`` queries and, with ``max_tokens``, at most that many
    padded tokens (queries × the longest): batches of short queries grow, of long ones shrink (a
    query longer than ``max_tokens`` is a batch of its own). Longest first (as lm-eval does)
    makes an out-of-memory error happen on the first batch.
    """
    order = sorted(range(len(queries)), key=lambda i: (-len(queries[i]), i))
    batches: list[list[int]] = []
    for index in order:
        batch = batches[-1] if batches else None
        if (
            batch is None
            or len(batch) == batch_size
            or (max_tokens is not None and (len(batch) + 1) * len(queries[batch[0]]) > max_tokens)
        ):
            batches.append([index])
        else:
            batch.append(index)
    return batches


@dataclass(frozen=True)
class BatchSchedule:
    """Which training examples every rank sees at every step: a pure function of the step.

    Each epoch is a seeded permutation of the examples, cut into global batches of ``batch_size``
    (the last incomplete batch is dropped). Rank ``r`` of ``world_size`` takes the ``r``-th
    contiguous slice of each global batch, cut again into ``grad_accum`` micro-batches. Because the
    global batch does not depend on the world size, a run can resume on another number of
    processes and continue the same trajectory; resuming at step ``s`` needs no replay.
    """

    num_examples: int
    batch_size: int
    seed: int
    world_size: int = 1
    rank: int = 0
    grad_accum: int = 1

    def __post_init__(self) -> None:
        per_step = self.world_size * self.grad_accum
        if self.batch_size % per_step:
            raise ValueError(
                f"batch_size {self.batch_size} must be divisible by device_count × grad_accum = "
                f"{per_step}; change batch_size to a multiple of {per_step}"
            )
        if self.num_examples < self.batch_size:
            raise ValueError(
                f"only {self.num_examples} training examples for batch_size {self.batch_size}; "
                "raise limit or lower batch_size"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.num_examples // self.batch_size

    def global_batch(self, step: int) -> list[int]:
        epoch, index = divmod(step, self.steps_per_epoch)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.num_examples, generator=generator)
        return order[index * self.batch_size : (index + 1) * self.batch_size].tolist()

    def micro_batches(self, step: int) -> list[list[int]]:
        per_rank = self.batch_size // self.world_size
        mine = self.global_batch(step)[self.rank * per_rank : (self.rank + 1) * per_rank]
        size = per_rank // self.grad_accum
        return [mine[start : start + size] for start in range(0, per_rank, size)]
