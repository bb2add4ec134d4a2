"""Token queries → model batches: right-padded rows (:func:`collate`) or packed rows
(:func:`packed_batch`).

A padded batch is a dict of three ``(B, L)`` tensors: ``input_ids``, ``attention_mask`` (1 on real
tokens) and ``labels`` (the token id on continuation tokens, ``-100`` on context and padding);
:meth:`~tango_fairscale.model.causal_lm.ModelWrapper.forward` scores position ``t`` from positions
``< t``. A packed batch puts several queries in a row and adds what keeps them apart
(``position_ids``, ``query_ids``).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .queries import Query

IGNORE_INDEX = -100


#: Training batches are padded to a multiple of this width: a handful of distinct shapes, so GPU
#: kernels chosen for a shape are reused (every new bf16 GEMM shape costs a kernel search).
TRAINING_WIDTH_MULTIPLE = 64


def collate(
    queries: Sequence[Query],
    pad_token_id: int,
    width_multiple: int = 1,
    max_width: int | None = None,
) -> dict[str, torch.Tensor]:
    """Right-pad ``queries`` into one batch (right padding keeps GPT-2's positions exact).

    The width is rounded up to ``width_multiple``, but not past ``max_width`` (the model's
    ``max_length + 1``).
    """
    width = max(len(query) for query in queries)
    width = -(-width // width_multiple) * width_multiple
    if max_width is not None:
        width = min(width, max(max_width, max(len(query) for query in queries)))
    # One tensor from padded Python rows, masks by comparing positions with lengths: per-row
    # tensor writes cost more CPU time than the GPU spends scoring a batch (measured: 2/3 of the
    # PIQA scoring step on an H200).
    input_ids = torch.tensor(
        [query.tokens + (pad_token_id,) * (width - len(query)) for query in queries],
        dtype=torch.long,
    )
    lengths = torch.tensor([len(query) for query in queries])
    starts = lengths - torch.tensor([query.continuation_length for query in queries])
    positions = torch.arange(width)
    real = positions < lengths[:, None]
    attention_mask = real.long()
    labels = torch.where(real & (positions >= starts[:, None]), input_ids, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


#: Packed rows are filled up to this many tokens (a longer segment takes a row of its own). The
#: attention of a packed row is computed over the whole row and masked: wider rows waste more.
PACKED_ROW_TOKENS = 512


def packed_batch(
    queries: Sequence[Query], pad_token_id: int, width_multiple: int = 1
) -> dict[str, torch.Tensor]:
    """``queries`` packed end to end into rows, with what the model needs to keep them apart.

    Unlike :func:`collate`'s rows, packed rows are *shifted*: ``input_ids[r, t]`` is fed to the
    model and ``labels[r, t]`` is the token it predicts there (``-100``: not scored), so a query
    of ``n`` tokens takes ``n - 1`` places. Queries with the same context tokens (PIQA's two
    choices of one goal) form one *segment*: the context once (but its last token), then each
    query's own tokens from there (each predicts its first continuation token from its own copy
    of the context's last token). Segments, longest first, fill rows of ``PACKED_ROW_TOKENS``
    (next fit), padded to a multiple of ``width_multiple``.

    Besides ``input_ids``, ``labels`` and ``attention_mask`` (1 on real tokens), the batch holds
    ``position_ids`` (each token's position in its own query; 0 on padding) and ``query_ids``
    (the index in ``queries`` of the query a token belongs to; -1 on shared context and padding).
    A token attends to the earlier tokens of its segment (a segment starts at position 0) that
    are shared or its query's own — what it sees in its own unpacked row, so every score equals
    :func:`collate`'s up to float rounding.
    """
    pieces = [segment_pieces(queries, members) for members in context_groups(queries)]
    sizes = [segment_length(segment) for segment in pieces]
    rows = _next_fit_rows(sizes)
    width = max(sum(sizes[s] for s in row) for row in rows)
    width = -(-width // width_multiple) * width_multiple
    inputs, nexts, placed, filled = _laid_out(queries, pieces, rows, width, pad_token_id)
    # Labels, positions and owners from each piece's numbers, with numpy (per-token Python
    # lists for them took ~1/4 of a 16,000-token batch's host time).
    lengths = np.array([piece.length for piece in placed])
    first = np.cumsum(lengths) - lengths  # each piece's first place in the flat rows
    within = np.arange(int(lengths.sum())) - np.repeat(first, lengths)
    scored = within >= np.repeat([piece.scored_from for piece in placed], lengths)
    real = np.repeat([piece.source >= 0 for piece in placed], lengths)
    positions = np.where(real, np.repeat([piece.start for piece in placed], lengths) + within, 0)
    owners = np.repeat([piece.query_id for piece in placed], lengths)
    shape = (len(rows), width)
    return {
        "input_ids": _long_tensor(inputs).view(shape),
        "attention_mask": (torch.arange(width) < torch.tensor(filled)[:, None]).long(),
        "labels": torch.from_numpy(np.where(scored, nexts, IGNORE_INDEX)).view(shape),
        "position_ids": torch.from_numpy(positions).view(shape),
        "query_ids": torch.from_numpy(owners).view(shape),
    }


def _laid_out(
    queries: Sequence[Query],
    pieces: list[list[_Piece]],
    rows: list[list[int]],
    width: int,
    pad_token_id: int,
) -> tuple[list[int], list[int], list[_Piece], list[int]]:
    """The rows' input tokens, flat; each input's next token in its own query; the pieces in
    the order they are laid out, each row's padding a piece of its own (``source`` -1, nothing
    scored); and each row's real tokens."""
    inputs: list[int] = []
    nexts: list[int] = []
    placed: list[_Piece] = []
    filled = []
    for row in rows:
        used = 0
        for index in row:
            for piece in pieces[index]:
                source, start = queries[piece.source].tokens, piece.start
                end = start + piece.length
                inputs.extend(source[start:end])
                nexts.extend(source[start + 1 : end + 1])
                placed.append(piece)
                used += piece.length
        padding = width - used
        inputs.extend([pad_token_id] * padding)
        nexts.extend([pad_token_id] * padding)
        placed.append(_Piece(-1, -1, 0, padding, padding))
        filled.append(used)
    return inputs, nexts, placed, filled


def _next_fit_rows(sizes: list[int]) -> list[list[int]]:
    """The segments of ``sizes`` (their indices) in rows of ``PACKED_ROW_TOKENS`` (or the longest
    segment's size), longest first, each into the last row if it fits, else into a new one."""
    order = sorted(range(len(sizes)), key=lambda s: (-sizes[s], s))
    capacity = max(PACKED_ROW_TOKENS, sizes[order[0]])
    rows: list[list[int]] = []
    fill = capacity
    for index in order:
        if fill + sizes[index] > capacity:
            rows.append([])
            fill = 0
        rows[-1].append(index)
        fill += sizes[index]
    return rows


def _long_tensor(values: list[int]) -> torch.Tensor:
    """``torch.tensor(values)``, 6x faster for long lists (through a C array)."""
    return torch.frombuffer(array.array("q", values), dtype=torch.long)


class _Piece(NamedTuple):
    """Consecutive input tokens of one query in a packed row."""

    source: int  # the query whose tokens these are
    query_id: int  # the query they belong to; -1 for a context shared by several
    start: int  # first token (and its position)
    length: int
    scored_from: int  # offset in the piece of the first input whose target is scored


def context_groups(queries: Sequence[Query]) -> list[list[int]]:
    """Indices of ``queries`` grouped by identical context tokens, in order of appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    last_context: tuple[int, ...] | None = None
    last_group: list[int] = []
    for index, query in enumerate(queries):
        tokens = query.tokens
        context = tokens[: len(tokens) - query.continuation_length]
        # A task's choices of one document come one after another: comparing with the last
        # context skips most dictionary lookups (hashing a context costs as much as comparing).
        if context != last_context:
            last_context, last_group = context, groups.setdefault(context, [])
        last_group.append(index)
    return list(groups.values())


def _shared_length(queries: Sequence[Query], members: Sequence[int]) -> int:
    """Tokens a group shares in a packed row: its context but the last token (none alone)."""
    if len(members) < 2:
        return 0
    first = queries[members[0]]
    return len(first) - first.continuation_length - 1


def segment_pieces(queries: Sequence[Query], members: Sequence[int]) -> list[_Piece]:
    """One group's pieces: the shared context if any, then each member's inputs from there
    (all its tokens but the last, which is only predicted)."""
    shared = _shared_length(queries, members)
    pieces = [_Piece(members[0], -1, 0, shared, shared)] if shared else []
    for index in members:
        query = queries[index]
        scored_from = len(query) - query.continuation_length - 1 - shared
        pieces.append(_Piece(index, index, shared, len(query) - 1 - shared, scored_from))
    return pieces


def segment_length(pieces: Sequence[_Piece]) -> int:
    """Places a segment takes in a packed row."""
    return sum(piece.length for piece in pieces)


def segment_size(queries: Sequence[Query], members: Sequence[int]) -> int:
    """:func:`segment_length` of the group's :func:`segment_pieces`, without building them (a
    scoring schedule sizes every group of a task before its first forward)."""
    shared = _shared_length(queries, members)
    return shared + sum(len(queries[index].tokens) - 1 - shared for index in members)


def training_batch(
    queries: Sequence[Query], pad_token_id: int, max_length: int, packed: bool = False
) -> dict[str, torch.Tensor]:
    """A training micro-batch: :func:`collate` (or, ``packed``, :func:`packed_batch`), its
    positions a multiple of ``TRAINING_WIDTH_MULTIPLE``."""
    if packed:
        return packed_batch(queries, pad_token_id, TRAINING_WIDTH_MULTIPLE)
    return collate(queries, pad_token_id, TRAINING_WIDTH_MULTIPLE, max_width=max_length + 1)
