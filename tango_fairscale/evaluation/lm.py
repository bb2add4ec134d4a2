"""The package's model as an lm-evaluation-harness ``LM``: lm-eval builds the requests and computes
the metrics; the log-likelihoods come from the package's batched, packed, sharded scoring, the
generated texts from its batched decoding."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ..data.chat import apply_chat_template
from ..data.queries import Query, encode_pairs, prefix_token_id, token_ids
from .call import EvalOptions, GenerationSettings, ModelCall
from .generation import generate_on_all_ranks
from .scoring import score_on_all_ranks

logger = logging.getLogger(__name__)


class ScorerLM(LM):
    """lm-eval's ``LM`` over a :class:`~tango_fairscale.evaluation.call.ModelCall` (built by
    :class:`~tango_fairscale.evaluation.evaluator.Evaluator`).

    ``loglikelihood`` encodes the requests as lm-eval's HF backend does
    (:mod:`tango_fairscale.data.queries`) and scores them in length-sorted batches of at most
    ``options.batch_size`` queries and ``options.max_batch_tokens`` tokens, packed
    (``options.packed``) when the model takes packed batches (choices that share a context share
    it); each answer is the float64 sum of the query's fp32 per-token log-probabilities, the same
    within 1e-4 (|ll| up to 2,000, ``32-true``) however it is batched and within 1e-4 of the
    exact sum of lm-eval's HF backend's per-token values (whose own answer is their float32 sum).
    Inside a process group, lm-eval runs on every rank as if alone (every rank builds every
    request, so few-shot sampling does not depend on the world size), each rank answers a share
    of the requests and every rank gets all answers
    (:func:`~tango_fairscale.evaluation.scoring.score_on_all_ranks`): call it on every rank.
    ``loglikelihood_rolling`` scores lm-eval's disjoint windows the same way; ``generate_until``
    decodes as lm-eval's HF backend does
    (:func:`~tango_fairscale.evaluation.generation.generate_on_all_ranks`, with ``generation``).
    A continuation longer than the model's window is scored on its last ``max_length`` tokens
    (lm-eval's HF backend refuses it): each ``loglikelihood`` call warns once with how many, and
    ``truncated_continuations`` counts them all.
    """

    def __init__(
        self,
        call: ModelCall,
        options: EvalOptions,
        generation: GenerationSettings | None = None,
    ) -> None:
        super().__init__()
        self.call = call
        self.tokenizer = call.model.tokenizer
        self.max_length = call.model.max_length
        self.options = options
        self.generation = generation or GenerationSettings()
        self.truncated_continuations = 0
        #: Each (context, continuation) pair's query, encoded once for this LM's evaluations.
        self._encoded: dict[tuple[str, str], Query] = {}

    def take_queries(self, queries: Mapping[tuple[str, str], Query]) -> None:
        """Score these pairs' queries, encoded elsewhere for this model's tokenizer and window
        (``tango_fairscale::task_tokens``), instead of encoding them."""
        self._encoded.update(queries)

    def loglikelihood(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        queries = self._queries([(request.args[0], request.args[1]) for request in requests])
        truncated = sum(1 for query in queries if query.unscored)
        if truncated:
            logger.warning(
                "%s of %s continuations are longer than the model's %s-token window: each is "
                "scored on its last %s tokens only (lm-eval's HF backend refuses them)",
                f"{truncated:,}",
                f"{len(queries):,}",
                self.max_length,
                self.max_length,
            )
            self.truncated_continuations += truncated
        return self._score(queries, disable_tqdm)

    def _queries(self, pairs: list[tuple[str, str]]) -> list[Query]:
        """``pairs`` encoded (:func:`~tango_fairscale.data.queries.encode_pairs`), each pair once
        for every evaluation by this LM (each is encoded alone: the same query in any batch)."""
        encoded = self._encoded
        new = [pair for pair in dict.fromkeys(pairs) if pair not in encoded]
        encoded.update(zip(new, encode_pairs(self.tokenizer, new, self.max_length), strict=True))
        return [encoded[pair] for pair in pairs]

    def loglikelihood_rolling(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[float]:
        texts = [request.args[0] for request in requests]
        windows = [list(self._rolling_windows(ids)) for ids in token_ids(self.tokenizer, texts)]
        answers = iter(self._score([query for w in windows for query in w], disable_tqdm))
        return [sum(next(answers)[0] for _ in text_windows) for text_windows in windows]

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        options = self.options
        if disable_tqdm:
            options = dataclasses.replace(options, progress=False)
        return generate_on_all_ranks(self.call, requests, options, self.generation)

    @property
    def tokenizer_name(self) -> str:
        """lm-eval's name of the tokenizer (its request cache's key)."""
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return apply_chat_template(self.tokenizer, chat_history, add_generation_prompt)

    def _score(self, queries: list[Query], disable_tqdm: bool) -> list[tuple[float, bool]]:
        started = time.perf_counter()
        options = self.options
        # Identical requests (two choices equal after left truncation, say) scored once: an exact
        # tie stays exact, and lm-eval's argmax takes the first, whatever the batch-mates. Each
        # query is hashed once: its slot among the distinct ones.
        slot_of: dict[Query, int] = {}
        slots = [slot_of.setdefault(query, len(slot_of)) for query in queries]
        distinct = list(slot_of)
        answers = score_on_all_ranks(
            self.call,
            distinct,
            dataclasses.replace(options, progress=options.progress and not disable_tqdm),
            pad_token_id=self.tokenizer.pad_token_id,
            device=self.call.device,
        )
        seconds = time.perf_counter() - started
        logger.info(
            "scored %s requests in %.2f s (%s/s)",
            f"{len(distinct):,}",
            seconds,
            f"{len(distinct) / max(seconds, 1e-9):,.0f}",
        )
        return [answers[slot] for slot in slots]

    def _rolling_windows(self, ids: list[int]) -> Iterator[Query]:
        """lm-eval's HF backend's windows of a text: each predicts its continuation from at most
        ``max_length`` tokens, the first from the prefix token."""
        windows = get_rolling_token_windows(
            token_list=ids,
            prefix_token=prefix_token_id(self.tokenizer),
            max_seq_len=self.max_length,
            context_len=1,
        )
        for context, continuation in map(make_disjoint_window, windows):
            yield Query(tuple(context + continuation), len(continuation))


@contextlib.contextmanager
def scoring_precision(model: torch.nn.Module, precision: Any) -> Iterator[None]:
    """Score under ``precision`` (a resolved :class:`~tango_fairscale.parallel.precision.
    Precision`): its forward context (autocast for the ``-mixed`` ones, the attention kernels on
    a GPU), the model cast for ``bf16-true``; without gradients (not ``inference_mode``:
    autocast caches its casts of the weights only for tensors that require gradients, and would
    re-cast every weight in every forward)."""
    if precision.param_dtype != torch.float32:
        model.to(precision.param_dtype)
    with torch.no_grad(), precision.forward_context(next(model.parameters()).device):
        yield
