"""Scoring forwards' trunk (embeddings, blocks, final norm) replayed from CUDA graphs: a packed
batch padded to a few shapes, each captured the second time it comes.

Scoring on one GPU is bound by the host, not the GPU: GPT-2 124M on the synthetic suite's
16,000-token batches spends ~18 ms of Python and kernel launches a forward on an H100's host for
~9 ms of kernels (``scoring_probe_h100_9784119.json``). A replay launches the trunk's kernels at
once; the scored positions' vocabulary projection and the sums stay eager (their sizes change
from batch to batch). A batch's rows are padded to a multiple of :data:`ROW_MULTIPLE` and its
width to :data:`PACKED_ROW_TOKENS` (or a multiple of it): each padding token is a segment of its
own, unscored (position 0, no query), so every real token attends to what it attended to
before and its score moves by float rounding only. A shape seen once (a task's last, shorter
batch) stays eager: capturing costs a few forwards.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..data.batches import PACKED_ROW_TOKENS

logger = logging.getLogger(__name__)

#: A replayed batch's rows are padded up to a multiple of this.
ROW_MULTIPLE = 4
#: Graphs kept at most (their activations share one memory pool).
MAX_GRAPHS = 16
#: Trunk passes on a side stream before a shape is captured (lazy initialisations, kernels).
WARMUP_PASSES = 2

Trunk = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def padded_shape(rows: int, width: int) -> tuple[int, int]:
    """The shape a ``(rows, width)`` packed batch is replayed at."""
    padded_rows = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
    return padded_rows, -(-width // PACKED_ROW_TOKENS) * PACKED_ROW_TOKENS


class _Graph:
    """One captured shape: its static inputs and the hidden states its replay writes."""

    def __init__(self, trunk: Trunk, shape: tuple[int, int], device: torch.device, pool: Any):
        self.input_ids = torch.zeros(shape, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(shape, dtype=torch.long, device=device)
        self.query_ids = torch.full(shape, -1, dtype=torch.long, device=device)
        inputs = (self.input_ids, self.position_ids, self.query_ids)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_PASSES):
                trunk(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.hidden = trunk(*inputs)

    def __call__(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_ids: torch.Tensor
    ) -> torch.Tensor:
        padded = (self.input_ids, self.position_ids, self.query_ids)
        load_padded(padded, (input_ids, position_ids, query_ids))
        self.graph.replay()
        return self.hidden[: input_ids.shape[0], : input_ids.shape[1]]


def load_padded(padded: tuple[torch.Tensor, ...], batch: tuple[torch.Tensor, ...]) -> None:
    """Write a packed ``batch`` (``input_ids``, ``position_ids``, ``query_ids``) into the top
    left of the larger ``padded`` ones, and padding everywhere else: token 0, position 0 and no
    query (-1), so that each padding token is a segment of its own, which no real token sees."""
    rows, width = batch[0].shape
    for target, source, fill in zip(padded, batch, (0, 0, -1), strict=True):
        target.fill_(fill)
        target[:rows, :width] = source


class TrunkGraphs:
    """``trunk(input_ids, position_ids, query_ids) -> hidden`` (every tensor on one GPU) through
    a CUDA graph per :func:`padded_shape`, captured the second time a shape comes, under the
    autocast state of that call with its weight cache off (the casts are in the graph); eager
    for a shape seen once, past :data:`MAX_GRAPHS`, or where capturing failed (logged once).
    Without gradients only; the hidden states a call returns are valid until the next call."""

    def __init__(self, trunk: Trunk) -> None:
        self.trunk = trunk
        self.graphs: dict[tuple[Any, ...], _Graph | None] = {}
        self.seen: set[tuple[Any, ...]] = set()
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_ids: torch.Tensor
    ) -> torch.Tensor:
        autocast = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        key = (*padded_shape(*input_ids.shape), *autocast)
        if key not in self.graphs:
            if key not in self.seen or len(self.graphs) >= MAX_GRAPHS:
                self.seen.add(key)
                return self.trunk(input_ids, position_ids, query_ids)
            self.graphs[key] = self._captured(key, input_ids.device)
        graph = self.graphs[key]
        if graph is None:
            return self.trunk(input_ids, position_ids, query_ids)
        return graph(input_ids, position_ids, query_ids)

    def _captured(self, key: tuple[Any, ...], device: torch.device) -> _Graph | None:
        rows, width, enabled, dtype = key

        def trunk(*inputs: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False):
                return self.trunk(*inputs)

        try:
            return _Graph(trunk, (rows, width), device, self.pool)
        except RuntimeError as error:  # an operation a graph cannot hold: that shape stays eager
            logger.warning("scoring forwards of %d x %d stay eager: %s", rows, width, error)
            return None


@contextlib.contextmanager
def replayed_trunks(model: Any) -> Iterator[None]:
    """Within the block, ``model`` (a :class:`~tango_fairscale.model.causal_lm.ModelWrapper`
    on a GPU) replays its packed forwards' trunk from :class:`TrunkGraphs` when it runs without
    gradients; the graphs and their memory are dropped after it."""
    device = next(model.parameters()).device
    if device.type != "cuda" or not hasattr(model, "replayed_trunk"):
        yield
        return
    model.replayed_trunk = TrunkGraphs(model.packed_hidden)
    try:
        yield
    finally:
        model.replayed_trunk = None
