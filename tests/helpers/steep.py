"""Log-likelihoods in the thousands, for tests of how scores are summed.

A tiny GPT-2 initialised at scale 0.5 (``STEEP``) gives a random token about 10 nats (the tests'
1,257-token vocabulary) to 15 (GPT-2's own), so that a continuation of a couple of hundred
random tokens (:func:`random_queries`) has a log-likelihood near -2,000. There a float32 step is
1.2e-4: a float32 sum of the per-token log-probabilities is off by a few of them, by an amount
that changes with the order of the additions. :func:`exact_log_likelihood` is the reference:
the per-token log-probabilities as lm-eval's HF backend computes them, summed exactly.
"""

from __future__ import annotations

import random
from typing import Any

import torch

#: Config fields over a tiny GPT-2's: steep logits, room for long queries.
STEEP = {"initializer_range": 0.5, "n_positions": 256}

#: Continuation lengths of the queries alone, as fractions of the longest.
_FRACTIONS = (0.03, 1.0, 0.1, 0.33, 0.92, 0.54, 0.04, 0.81, 0.97, 0.22, 0.7, 0.49)


def random_queries(seed: int, vocab: int, longest: int) -> list[Any]:
    """Random-token queries: 12 alone (continuations of up to ``longest`` tokens after 2 to 19
    context tokens) and 3 groups of 3 sharing a context of 5 to 29 tokens (packed, they share it
    in a row), with continuations of 15 % to 95 % of ``longest``."""
    from tango_fairscale.data.queries import Query

    rng = random.Random(seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab - 1) for _ in range(count))

    queries = []
    for fraction in _FRACTIONS:
        length = max(1, round(fraction * longest))
        queries.append(Query(tokens(rng.randrange(2, 20)) + tokens(length), length))
    for _ in range(3):
        context = tokens(rng.randrange(5, 30))
        for _ in range(3):
            length = rng.randrange(longest * 15 // 100, longest * 95 // 100)
            queries.append(Query(context + tokens(length), length))
    return queries


def exact_log_likelihood(model: torch.nn.Module, query: Any) -> float:
    """lm-eval's HF backend's per-token log-probabilities of ``query``'s continuation (fp32
    ``log_softmax`` of the logits of ``model``, a Hugging Face causal LM, over the unpadded
    query), summed exactly (in float64)."""
    return float(token_log_probs(model, query).double().sum())


def token_log_probs(model: torch.nn.Module, query: Any) -> torch.Tensor:
    """The fp32 log-probabilities of ``query``'s continuation tokens, as lm-eval's HF backend
    computes them with ``batch_size=1``."""
    tokens = torch.tensor([query.tokens])
    with torch.inference_mode():
        log_probs = torch.log_softmax(model(tokens[:, :-1]).logits[0].float(), dim=-1)
    n = query.continuation_length
    return log_probs[-n:].gather(1, tokens[0, -n:, None])[:, 0]
