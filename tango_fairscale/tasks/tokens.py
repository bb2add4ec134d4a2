"""A task's log-likelihood requests tokenized once per tokenizer: the (context, continuation) pairs
of a ``task_requests`` result encoded as lm-eval's HF backend encodes them, for every model scored
with that tokenizer (the checkpoints of a run, models of one family)."""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tango import Step
from tango.common.exceptions import ConfigurationError

from .. import compat  # noqa: F401  (Tango fixes)
from ..data.queries import Query, pair_ids, query_of
from ..model.fingerprint import tokenizer_fingerprint
from ..model.loading import load_tokenizer
from .format import TokensFormat
from .requests import unique_id_with

#: The layout of a stored tokens result (``format`` key); another one is refused.
TOKENS_FORMAT = 1


@Step.register("tango_fairscale::task_tokens")
class TaskTokensStep(Step[dict]):
    """Every (context, continuation) pair of a task's log-likelihood requests, tokenized.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::task_tokens"``.

    :param requests: a ``tango_fairscale::task_requests`` result.
    :param tokenizer: the tokenizer's hub id or directory (a model's directory: its tokenizer).

    Returns each distinct pair's untruncated token ids (context, then continuation) and context
    length, in the order :func:`loglikelihood_pairs` lists them, for
    ``tango_fairscale::task_scores``'s ``tokens`` (stored by
    :class:`~tango_fairscale.tasks.format.TokensFormat`). Its cache key: the requests step's and
    the tokenizer's (:func:`~tango_fairscale.model.fingerprint.tokenizer_fingerprint`: a
    directory's files but its weights), so that a second model or checkpoint with the same
    tokenizer tokenizes nothing.

    Example (Jsonnet)::

        tokens_arc: {type: "tango_fairscale::task_tokens", requests: {ref: "requests_arc"},
                     tokenizer: "/models/smollm2"},
    """

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = TokensFormat()

    @property
    def unique_id(self) -> str:
        """Tango's unique id, with the tokenizer hashed by its files, not its path."""
        tokenizer = self.kwargs.get("tokenizer")
        if not isinstance(tokenizer, str):
            return super().unique_id
        return unique_id_with(self, lambda: {"tokenizer": tokenizer_fingerprint(tokenizer)})

    def run(self, requests: dict, tokenizer: str) -> dict:  # type: ignore[override]
        if not isinstance(tokenizer, str):
            raise ConfigurationError("tokenizer must be a hub id or directory (a string)")
        pairs = loglikelihood_pairs(requests)
        fingerprint = tokenizer_fingerprint(tokenizer)
        encoded = pair_ids(shared_tokenizer(tokenizer, fingerprint), pairs)
        lengths = [len(ids) for ids, _ in encoded]
        return {
            "format": TOKENS_FORMAT,
            "tokenizer": list(fingerprint),
            "pairs": pairs_digest(pairs),
            "ids": torch.from_numpy(
                np.fromiter(
                    itertools.chain.from_iterable(ids for ids, _ in encoded),
                    dtype=np.int32,
                    count=sum(lengths),
                )
            ),
            "offsets": torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0),
            "context_lengths": torch.tensor([n for _, n in encoded], dtype=torch.int32),
        }


@functools.lru_cache(maxsize=1)
def shared_tokenizer(source: str, fingerprint: tuple[Any, ...]) -> Any:
    """The tokenizer of ``source``, loaded once for every tokens step of a command while its files
    (``fingerprint``) stay the same: the steps only encode with it (GPT-2's: ~0.8 s a load on
    two cores)."""
    return load_tokenizer(source)


def loglikelihood_pairs(requests: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every distinct (context, continuation) of ``requests``' log-likelihood requests (a
    ``task_requests`` result), in the order they first appear."""
    pairs: dict[tuple[str, str], None] = {}
    for task in requests.get("tasks", {}).values():
        for document in task["documents"]:
            for request in document["requests"]:
                if request["request_type"] == "loglikelihood":
                    context, continuation = request["arguments"]
                    pairs[(context, continuation)] = None
    return list(pairs)


def pairs_digest(pairs: Sequence[tuple[str, str]]) -> str:
    """A digest of ``pairs``, in order (what a tokens result was made from)."""
    digest = hashlib.blake2b(digest_size=16)
    for context, continuation in pairs:
        for text in (context, continuation):
            encoded = text.encode("utf-8", "surrogatepass")
            digest.update(len(encoded).to_bytes(8, "little"))
            digest.update(encoded)
    return digest.hexdigest()


def checked_pairs(
    tokens: Mapping[str, Any], requests: Mapping[str, Any], tokenizer: str
) -> list[tuple[str, str]]:
    """The pairs of ``tokens`` (a ``task_tokens`` result) for scoring ``requests`` with the
    tokenizer of ``tokenizer`` (:func:`loglikelihood_pairs`). Refused in one line: a result of
    another layout, of another tokenizer, or of other requests."""
    label = requests.get("label")
    if tokens.get("format") != TOKENS_FORMAT:
        raise ConfigurationError(
            f"task {label!r}: tokens must be a tango_fairscale::task_tokens result "
            f"(format {TOKENS_FORMAT})"
        )
    if tokens.get("tokenizer") != list(tokenizer_fingerprint(tokenizer)):
        raise ConfigurationError(
            f"task {label!r}: the tokens were made with another tokenizer than the model's "
            f"({tokenizer!r}); make them with the model's tokenizer or give task_scores none"
        )
    pairs = loglikelihood_pairs(requests)
    if tokens.get("pairs") != pairs_digest(pairs):
        raise ConfigurationError(
            f"task {label!r}: the tokens were made from other requests than task_scores' own; "
            "make them from the same task_requests step or give task_scores none"
        )
    return pairs


def known_queries(
    tokens: Mapping[str, Any], pairs: Sequence[tuple[str, str]], max_length: int
) -> dict[tuple[str, str], Query]:
    """The query of each of ``pairs`` (:func:`checked_pairs`) for a model of ``max_length``."""
    ids = tokens["ids"].numpy()  # each query's ints made from its own slice: no list of them all
    offsets = tokens["offsets"].tolist()
    context_lengths = tokens["context_lengths"].tolist()
    return {
        pair: query_of(
            tuple(ids[offsets[i] : offsets[i + 1]].tolist()), context_lengths[i], max_length
        )
        for i, pair in enumerate(pairs)
    }
