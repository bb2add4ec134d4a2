"""In-training validation: every rank of the job scores its share through the engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..data.queries import encode_pairs
from ..tasks import piqa
from .scoring import Forward, score_on_all_ranks


def validate_piqa(
    forward: Forward,
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    packed: bool,
    progress: bool,
) -> dict[str, float | int]:
    """PIQA ``acc`` / ``acc_norm`` over ``examples``, scored by every rank together
    (:func:`~tango_fairscale.evaluation.scoring.score_on_all_ranks`): call on every rank."""
    queries = encode_pairs(tokenizer, piqa.choice_pairs(examples), max_length)
    scores = score_on_all_ranks(
        forward,
        queries,
        batch_size=batch_size,
        pad_token_id=tokenizer.pad_token_id,
        device=device,
        packed=packed,
        progress=progress,
    )
    lengths = [query.continuation_length for query in queries]
    hits, hits_norm = piqa.correct_counts(piqa.piqa_predictions(examples, scores, lengths))
    n = len(examples)
    return {"acc": hits / n, "acc_norm": hits_norm / n, "num_examples": n}
