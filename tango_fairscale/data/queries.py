"""(context, continuation) text pairs → token queries, exactly as lm-evaluation-harness's HF backend
encodes them.

* ``_encode_pair``: tokenize ``context + continuation`` and take the tokens after the context's own
  token count (trailing spaces of the context move to the continuation first);
* text is encoded with the tokenizer's own special tokens (a tokenizer that adds a BOS token adds
  it to the context and to the whole alike), except text that already starts with the BOS text;
* an empty context: the continuation alone (no special tokens), after the prefix token (BOS, else
  EOS) — or, when the continuation starts with that token, after its own first token;
* left truncation: the model sees at most ``max_length + 1`` tokens of ``context + continuation``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .context_cuts import context_cutter

#: Texts per thread below which a batch is encoded in one call (a thread's start costs more).
TEXTS_PER_THREAD = 1024


@dataclass(frozen=True)
class Query:
    """One (context, continuation) pair, tokenized and truncated for a model of ``max_length``."""

    tokens: tuple[int, ...]  # context + continuation, left-truncated to max_length + 1
    continuation_length: int  # how many of the last ``tokens`` are scored
    # Continuation tokens cut off by the truncation: the model predicts max_length at most.
    unscored: int = field(default=0, compare=False)

    def __len__(self) -> int:
        return len(self.tokens)


def encode_pair(tokenizer: Any, context: str, continuation: str, max_length: int) -> Query:
    """lm-eval's ``_encode_pair`` followed by its left truncation to ``max_length + 1`` tokens."""
    return encode_pairs(tokenizer, [(context, continuation)], max_length)[0]


def encode_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int) -> list[Query]:
    """:func:`encode_pair` for many pairs, with a few batched tokenizer calls in all."""
    return [
        query_of(ids, context_length, max_length)
        for ids, context_length in pair_ids(tokenizer, pairs)
    ]


def pair_ids(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], int]]:
    """Each pair's untruncated tokens, context then continuation (the model's window plays no
    part), and how many of them are the context's."""
    moved = [_move_trailing_spaces(context, continuation) for context, continuation in pairs]
    # A context shared by several continuations (the choices of a question) is tokenized once.
    contexts = list(dict.fromkeys(context for context, _ in moved if context))
    context_ids = dict(zip(contexts, token_ids(tokenizer, contexts)))
    whole = _whole_ids(tokenizer, moved, context_ids)
    alone = [continuation for context, continuation in moved if not context]
    ids_alone = dict(zip(alone, token_ids(tokenizer, alone, special_tokens=False)))
    encoded = []
    for (context, continuation), whole_ids in zip(moved, whole, strict=True):
        if context:
            context_tokens = context_ids[context]
            continuation_tokens = whole_ids[len(context_tokens) :]
        else:
            context_tokens, continuation_tokens = _after_prefix(tokenizer, ids_alone[continuation])
        if not continuation_tokens:
            raise ValueError(
                f"continuation {continuation!r} encodes to no tokens after {context!r}"
            )
        encoded.append((context_tokens + continuation_tokens, len(context_tokens)))
    return encoded


def _whole_ids(
    tokenizer: Any, moved: Sequence[tuple[str, str]], context_ids: Mapping[str, list[int]]
) -> list[list[int]]:
    """Each pair's ``context + continuation`` encoded (``[]`` without a context): from its
    context's tokens up to a cut and the rest of the text where the tokenizer allows it
    (:mod:`.context_cuts`), else whole."""
    cutter = context_cutter(tokenizer)
    cuts = {}
    if cutter is not None:
        cuts = dict(zip(context_ids, cutter.cuts(list(context_ids), list(context_ids.values()))))
    texts: list[str] = []  # (the rest of) each pair's text
    kept: list[int | None] = []  # the context's tokens it starts with (None: encoded whole)
    for context, continuation in moved:
        cut = cuts.get(context)
        if cut is not None and cutter is not None and cutter.fits(context, continuation):
            texts.append(context[len(context) - cut[1] :] + continuation)
            kept.append(cut[0])
        else:
            texts.append(context + continuation if context else "")
            kept.append(None)
    rests = [text for text, count in zip(texts, kept) if count is not None]
    wholes = [text for text, count in zip(texts, kept) if count is None and text]
    ids = dict(zip(wholes, token_ids(tokenizer, wholes)))
    rest_ids = dict(zip(rests, token_ids(tokenizer, rests, special_tokens=False)))
    return [
        (ids.get(text, []) if count is None else context_ids[context][:count] + rest_ids[text])
        for (context, _), text, count in zip(moved, texts, kept, strict=True)
    ]


def query_of(ids: Sequence[int], context_length: int, max_length: int) -> Query:
    """The query of a pair's untruncated ``ids`` (:func:`pair_ids`) for a model of ``max_length``:
    the model sees the context's own tokens, then the continuation's (as lm-eval feeds them), at
    most ``max_length + 1`` of them."""
    tokens = tuple(ids[-(max_length + 1) :])
    continuation_length = len(ids) - context_length
    # A continuation longer than the window is scored on the tokens the model can predict
    # (lm-eval's HF backend refuses it).
    scored = min(continuation_length, len(tokens) - 1)
    return Query(tokens, scored, continuation_length - scored)


def prefix_token_id(tokenizer: Any) -> int | None:
    """The token an empty context stands for: BOS, else EOS (lm-eval's ``prefix_token_id``)."""
    bos = tokenizer.bos_token_id
    return tokenizer.eos_token_id if bos is None else bos


def _after_prefix(tokenizer: Any, tokens: list[int]) -> tuple[list[int], list[int]]:
    prefix = prefix_token_id(tokenizer)
    if prefix is None:
        raise ValueError("an empty context needs a BOS or EOS token, and the tokenizer has neither")
    if tokens and tokens[0] == prefix:
        return tokens[:1], tokens[1:]
    return [prefix], tokens


def _move_trailing_spaces(context: str, continuation: str) -> tuple[str, str]:
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def token_ids(tokenizer: Any, texts: list[str], special_tokens: bool = True) -> list[list[int]]:
    """Each text's token ids. With ``special_tokens``, those the tokenizer adds itself (lm-eval's
    ``tok_encode``), but not for a text that already starts with the BOS text."""
    if not texts:
        return []
    prefix = prefix_token_id(tokenizer) if special_tokens else None
    bos_text = None if prefix is None else tokenizer.decode(prefix)
    starts_with_bos = [
        not special_tokens or (bos_text is not None and text.startswith(bos_text)) for text in texts
    ]
    plain = [i for i, flag in enumerate(starts_with_bos) if flag]
    special = [i for i, flag in enumerate(starts_with_bos) if not flag]
    result: list[list[int]] = [[] for _ in texts]
    for indices, add_special in ((plain, False), (special, True)):
        encoded = _encode([texts[i] for i in indices], tokenizer, add_special)
        for index, ids in zip(indices, encoded):
            result[index] = ids
    return result


def usable_cpus() -> int:
    """The CPUs this process may run on (all of them where the OS does not say: macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _encode(texts: list[str], tokenizer: Any, add_special_tokens: bool) -> list[list[int]]:
    if not texts:
        return []
    # A fast tokenizer's Rust backend directly: the same ids without the Python BatchEncoding
    # around them (a quarter of the time on PIQA validation), and without character offsets
    # (``encode_batch_fast``: a fifth less). Not while the backend pads or truncates (a batched
    # ``tokenizer(..., padding=...)`` call leaves it so): its rows would be padded.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.padding is not None or backend.truncation is not None:
        return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    # The backend releases the GIL while it encodes: slices of a large batch encode in threads
    # of their own, also where TOKENIZERS_PARALLELISM=false keeps each call on one core (the
    # setting guards the Rust thread pool across forks; Python threads do not outlive a call).
    # Each text encodes alone, so the ids do not depend on the slicing.
    num_threads = min(usable_cpus(), len(texts) // TEXTS_PER_THREAD)
    if num_threads < 2:
        encodings = backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]
    bounds = [len(texts) * i // num_threads for i in range(num_threads + 1)]
    slices = [texts[start:end] for start, end in zip(bounds, bounds[1:])]
    with ThreadPoolExecutor(num_threads, thread_name_prefix="tokenize") as pool:
        parts = pool.map(
            lambda part: backend.encode_batch_fast(part, add_special_tokens=add_special_tokens),
            slices,
        )
        return [encoding.ids for part in parts for encoding in part]
