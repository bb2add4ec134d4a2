"""Scoring queries: the log-likelihood of each continuation, batched, on one device or with every
rank of a process group scoring a slice.

Batches are length-sorted (or packed), one forward each. Under data-parallel or sharded training
every rank scores its slice *through the engine's wrapped model* (never an inner module) and runs
the same number of forwards (ranks with fewer batches repeat a one-query batch, so FSDP's
all-gathers never hang); the scores are gathered so that every rank holds all of them.

A query's score does not depend on how it is batched: the model sums each query's fp32 per-token
log-probabilities in float64 (:func:`~tango_fairscale.model.loss.row_sums`) and the scores stay
float64 from there to the answers, so batch size, packing, neighbours and world size move a
score only by the fp32 rounding of its per-token values in another batch shape (measured: at
most 3.5e-5 at |ll| up to 2,000 in fp32 on the CPU; ``docs/ARCHITECTURE.md``).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from tango.common import Tqdm
from tango.common.exceptions import ConfigurationError

from ..data.batches import collate, packed_batch
from ..data.queries import Query
from ..data.schedules import scoring_batches
from ..runtime.devices import move_batch
from ..runtime.process_group import rank_and_world_size
from .call import EvalOptions

Forward = Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]]


#: Forwards queued on a GPU at most (a few batches ahead: the GPU never waits for Python between
#: them, yet the progress bar and the memory held by queued batches stay bounded).
QUEUED_FORWARDS = 4

#: Packed scoring rows feed the model a multiple of this many positions (aligned attention masks).
SCORING_WIDTH_MULTIPLE = 8


def score_queries(
    forward: Forward,
    queries: Sequence[Query],
    options: EvalOptions,
    *,
    pad_token_id: int,
    device: torch.device,
    num_forwards: int | None = None,
    batches: Sequence[Sequence[int]] | None = None,
) -> list[tuple[float, bool]]:
    """Each query's ``(log-likelihood of its continuation, whether the continuation is the
    greedy one)`` — lm-eval's ``loglikelihood`` answers — in the order of ``queries``; each
    log-likelihood the float64 sum of the query's per-token log-probabilities, the same (up to
    the per-token values' rounding) in any batch.

    Batches as :func:`~tango_fairscale.data.schedules.scoring_batches` makes them of ``options``'
    sizes: right-padded rows or, ``options.packed`` (for a forward that takes packed batches), rows
    packed by
    :func:`~tango_fairscale.data.batches.packed_batch`. Results stay on the device until the end;
    Python runs at most ``QUEUED_FORWARDS`` forwards ahead of a GPU. ``num_forwards`` (at least
    the number of batches) pads the work with repeated forwards of a one-query batch whose
    results are discarded, so that all ranks call ``forward`` equally often. ``batches``: those
    batches, made by the caller (made once: the GPU waits for them).
    """
    sizes = (options.batch_size, options.max_batch_tokens, options.packed)
    batches = scoring_batches(queries, *sizes) if batches is None else batches
    if options.packed:
        make_batch = functools.partial(
            packed_batch, pad_token_id=pad_token_id, width_multiple=SCORING_WIDTH_MULTIPLE
        )
    else:
        make_batch = functools.partial(collate, pad_token_id=pad_token_id)
    filler = [Query((pad_token_id, pad_token_id), 1)]  # any tokens serve
    results: list[torch.Tensor] = []
    greedy: list[torch.Tensor] = []
    queued: collections.deque[tuple[Any, int]] = collections.deque()  # (done event, rows)
    depth = QUEUED_FORWARDS if device.type == "cuda" else 0  # a CPU forward is done on return
    bar = Tqdm.tqdm(total=len(queries), desc="Scoring", unit="query", disable=not options.progress)
    for index in range(max(num_forwards or 0, len(batches))):
        rows = [queries[i] for i in batches[index]] if index < len(batches) else filler
        try:
            outputs = forward(move_batch(make_batch(rows), device))
        except torch.OutOfMemoryError:
            raise out_of_memory(rows, options) from None
        if index < len(batches):
            results.append(outputs["loglikelihood"].double())
            greedy.append(outputs["greedy"])
        done = torch.cuda.Event() if device.type == "cuda" else None
        if done is not None:
            done.record()
        queued.append((done, len(rows) if index < len(batches) else 0))
        while len(queued) > depth:
            oldest, num_rows = queued.popleft()
            if oldest is not None:
                oldest.synchronize()
            bar.update(num_rows)
    bar.update(sum(num_rows for _, num_rows in queued))
    bar.close()
    return _in_query_order(batches, results, greedy)


def out_of_memory(rows: Sequence[Query], options: EvalOptions) -> ConfigurationError:
    """The one-line error of a scoring batch of ``rows`` that ran out of device memory."""
    tokens = sum(len(query) for query in rows)
    return ConfigurationError(
        f"scoring ran out of GPU memory on a batch of {len(rows):,} queries and {tokens:,} "
        f"tokens: lower the scoring batches' max_batch_tokens (now {options.max_batch_tokens}) "
        f"or batch_size (now {options.batch_size}; the training step's runtime.eval_batch_size, "
        "tango-fairscale eval's --batch_size)"
    )


def _in_query_order(
    batches: Sequence[Sequence[int]], results: list[torch.Tensor], greedy: list[torch.Tensor]
) -> list[tuple[float, bool]]:
    """The batches' ``(log-likelihood, greedy)`` pairs, put in query order on the device and
    read to the host once."""
    if not results:
        return []
    values, flags = torch.cat(results), torch.cat(greedy)
    order = torch.tensor([i for batch_indices in batches for i in batch_indices])
    order = order.to(values.device)
    in_order = torch.empty_like(values).index_copy_(0, order, values)
    flags_in_order = torch.empty_like(flags).index_copy_(0, order, flags)
    return list(zip(in_order.tolist(), flags_in_order.bool().tolist(), strict=True))


def score_on_all_ranks(
    forward: Forward,
    queries: Sequence[Query],
    options: EvalOptions,
    *,
    pad_token_id: int,
    device: torch.device,
) -> list[tuple[float, bool]]:
    """:func:`score_queries` with the work split over the process group (or alone without one).

    Call on every rank with the same ``queries``. Rank ``r`` of ``W`` scores the ``r``-th of ``W``
    contiguous slices (queries that share a context stay together, except at a slice's edge);
    the number of forwards is agreed first (a max all-reduce), so every rank runs as many; the
    scores are gathered, so every rank returns all of them, in the order of ``queries``.
    """
    rank, world_size = rank_and_world_size()
    bounds = [len(queries) * r // world_size for r in range(world_size + 1)]
    mine = queries[bounds[rank] : bounds[rank + 1]]
    batches = scoring_batches(mine, options.batch_size, options.max_batch_tokens, options.packed)
    num_forwards = len(batches)
    if world_size > 1:
        agreed = torch.tensor([num_forwards], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        num_forwards = int(agreed.item())
    scores = score_queries(
        forward,
        mine,
        options,
        pad_token_id=pad_token_id,
        device=device,
        num_forwards=num_forwards,
        batches=batches,
    )
    if world_size == 1:
        return scores
    # (log-likelihood, greedy) rows, padded to the longest slice, gathered from every rank.
    width = max(b - a for a, b in zip(bounds, bounds[1:]))
    mine_padded = torch.zeros(width, 2, dtype=torch.float64, device=device)
    if scores:
        mine_padded[: len(scores)] = torch.tensor(scores, dtype=torch.float64)
    gathered = [torch.empty_like(mine_padded) for _ in range(world_size)]
    dist.all_gather(gathered, mine_padded)
    return [
        (value, bool(flag))
        for r, part in enumerate(gathered)
        for value, flag in part[: bounds[r + 1] - bounds[r]].tolist()
    ]


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
