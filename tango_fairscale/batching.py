"""PIQA instances → token queries → padded or packed batches.

One job: turn PIQA examples into the token sequences that both training and scoring use, exactly as
lm-evaluation-harness's ``piqa`` task defines them:

* context ``"Question: {goal}\\nAnswer:"``, continuations ``" " + sol1`` and ``" " + sol2``;
* ``_encode_pair``: tokenize ``context + continuation`` and take the tokens after the context's own
  token count (trailing spaces of the context move to the continuation first);
* left truncation: the model sees at most ``max_length + 1`` tokens of ``context + continuation``.

A padded batch (:func:`collate`) is a dict of three ``(B, L)`` tensors: ``input_ids``,
``attention_mask`` (1 on real tokens) and ``labels`` (the token id on continuation tokens, ``-100``
on context and padding); :meth:`tango_fairscale.model.ModelWrapper.forward` scores position ``t``
from positions ``< t``. A packed batch (:func:`packed_batch`) puts several queries in a row and adds
what keeps them apart (``position_ids``, ``query_ids``).
"""

from __future__ import annotations

import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Query:
    """One (context, continuation) pair, tokenized and truncated for a model of ``max_length``."""

    tokens: tuple[int, ...]  # context + continuation, left-truncated to max_length + 1
    continuation_length: int  # how many of the last ``tokens`` are scored

    def __len__(self) -> int:
        return len(self.tokens)


def piqa_context(goal: str) -> str:
    return f"Question: {goal}\nAnswer:"


def piqa_continuations(example: Mapping[str, Any]) -> tuple[str, str]:
    return " " + example["sol1"], " " + example["sol2"]


def encode_pair(tokenizer: Any, context: str, continuation: str, max_length: int) -> Query:
    """lm-eval's ``_encode_pair`` followed by its left truncation to ``max_length + 1`` tokens."""
    return encode_pairs(tokenizer, [(context, continuation)], max_length)[0]


def encode_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int) -> list[Query]:
    """:func:`encode_pair` for many pairs, with two batched tokenizer calls in all."""
    moved = [_move_trailing_spaces(context, continuation) for context, continuation in pairs]
    wholes = _token_ids(tokenizer, [context + continuation for context, continuation in moved])
    # Each PIQA context serves two continuations: tokenize it once.
    unique_contexts = list(dict.fromkeys(context for context, _ in moved))
    context_ids = dict(zip(unique_contexts, _token_ids(tokenizer, unique_contexts)))
    queries = []
    for (context, continuation), whole in zip(moved, wholes):
        context_tokens = context_ids[context]
        continuation_tokens = whole[len(context_tokens) :]
        if not continuation_tokens:
            raise ValueError(
                f"continuation {continuation!r} encodes to no tokens after {context!r}"
            )
        # The model sees the context's own tokens, then the continuation's (as lm-eval feeds
        # them), at most max_length + 1 of them.
        tokens = (context_tokens + continuation_tokens)[-(max_length + 1) :]
        # A continuation longer than the window is scored on the tokens the model can predict.
        queries.append(Query(tuple(tokens), min(len(continuation_tokens), len(tokens) - 1)))
    return queries


def _move_trailing_spaces(context: str, continuation: str) -> tuple[str, str]:
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def _token_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    # A fast tokenizer's Rust backend directly: the same ids without the Python BatchEncoding
    # around them (a quarter of the time on PIQA validation), and without character offsets
    # (``encode_batch_fast``: a fifth less).
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        encodings = backend.encode_batch_fast(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def choice_queries(
    examples: Sequence[Mapping[str, Any]], tokenizer: Any, max_length: int
) -> list[Query]:
    """Both choices of every example, in order: ``[ex0.sol1, ex0.sol2, ex1.sol1, ...]``."""
    pairs = [
        (piqa_context(example["goal"]), continuation)
        for example in examples
        for continuation in piqa_continuations(example)
    ]
    return encode_pairs(tokenizer, pairs, max_length)


def training_queries(
    examples: Sequence[Mapping[str, Any]], tokenizer: Any, max_length: int
) -> list[Query]:
    """The correct choice of every labelled example (the fine-tuning objective)."""
    pairs = []
    for example in examples:
        label = example["label"]
        if label not in (0, 1):
            raise ValueError(f"training needs labelled examples; got label {label!r}")
        pairs.append((piqa_context(example["goal"]), piqa_continuations(example)[label]))
    return encode_pairs(tokenizer, pairs, max_length)


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
    pieces = [_segment_pieces(queries, members) for members in _context_groups(queries)]
    sizes = [_segment_length(segment) for segment in pieces]
    order = sorted(range(len(pieces)), key=lambda s: (-sizes[s], s))
    capacity = max(PACKED_ROW_TOKENS, sizes[order[0]])
    rows: list[list[int]] = []
    fill = capacity
    for index in order:  # next fit: segments come longest first
        if fill + sizes[index] > capacity:
            rows.append([])
            fill = 0
        rows[-1].append(index)
        fill += sizes[index]
    width = max(sum(sizes[s] for s in row) for row in rows)
    width = -(-width // width_multiple) * width_multiple
    # Flat Python lists, one tensor each at the end (building them from tensors per piece, or
    # with torch.repeat_interleave, cost 15x the CPU time).
    inputs: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    owners: list[int] = []
    filled = []
    for row in rows:
        used = 0
        for index in row:
            for piece in pieces[index]:
                source = queries[piece.source].tokens
                start, length, scored = piece.start, piece.length, piece.scored_from
                inputs.extend(source[start : start + length])
                labels.extend([IGNORE_INDEX] * scored)
                labels.extend(source[start + scored + 1 : start + length + 1])
                positions.extend(range(start, start + length))
                owners.extend([piece.query_id] * length)
                used += length
        padding = width - used
        inputs.extend([pad_token_id] * padding)
        labels.extend([IGNORE_INDEX] * padding)
        positions.extend([0] * padding)
        owners.extend([-1] * padding)
        filled.append(used)
    shape = (len(rows), width)
    return {
        "input_ids": _long_tensor(inputs).view(shape),
        "attention_mask": (torch.arange(width) < torch.tensor(filled)[:, None]).long(),
        "labels": _long_tensor(labels).view(shape),
        "position_ids": _long_tensor(positions).view(shape),
        "query_ids": _long_tensor(owners).view(shape),
    }


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


def _context_groups(queries: Sequence[Query]) -> list[list[int]]:
    """Indices of ``queries`` grouped by identical context tokens, in order of appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, query in enumerate(queries):
        groups.setdefault(query.tokens[: len(query) - query.continuation_length], []).append(index)
    return list(groups.values())


def _shared_length(queries: Sequence[Query], members: Sequence[int]) -> int:
    """Tokens a group shares in a packed row: its context but the last token (none alone)."""
    if len(members) < 2:
        return 0
    first = queries[members[0]]
    return len(first) - first.continuation_length - 1


def _segment_pieces(queries: Sequence[Query], members: Sequence[int]) -> list[_Piece]:
    """One group's pieces: the shared context if any, then each member's inputs from there
    (all its tokens but the last, which is only predicted)."""
    shared = _shared_length(queries, members)
    pieces = [_Piece(members[0], -1, 0, shared, shared)] if shared else []
    for index in members:
        query = queries[index]
        scored_from = len(query) - query.continuation_length - 1 - shared
        pieces.append(_Piece(index, index, shared, len(query) - 1 - shared, scored_from))
    return pieces


def _segment_length(pieces: Sequence[_Piece]) -> int:
    """Places a segment takes in a packed row."""
    return sum(piece.length for piece in pieces)


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
        for group in _context_groups(queries)
        for start in range(0, len(group), batch_size)
    ]
    sizes = [_segment_length(_segment_pieces(queries, group)) for group in groups]
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


def training_batch(
    queries: Sequence[Query], pad_token_id: int, max_length: int, packed: bool = False
) -> dict[str, torch.Tensor]:
    """A training micro-batch: :func:`collate` (or, ``packed``, :func:`packed_batch`), its
    positions a multiple of ``TRAINING_WIDTH_MULTIPLE``."""
    if packed:
        return packed_batch(queries, pad_token_id, TRAINING_WIDTH_MULTIPLE)
    return collate(queries, pad_token_id, TRAINING_WIDTH_MULTIPLE, max_width=max_length + 1)


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
