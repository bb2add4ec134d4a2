"""The fine-tuning pairs of an lm-eval multiple-choice task: each training document's context and
correct continuation, as lm-eval formats its requests."""

from __future__ import annotations

from typing import Any

from tango.common.exceptions import ConfigurationError

from .answers import BadAnswer, answer_indices
from .documents import plain_rows


def training_pairs(task: Any, name: str) -> list[tuple[str, str]]:
    """(context, continuation) of the correct choice of every training document of a
    multiple-choice ``task``, formatted as lm-eval formats its requests (its few-shot setting
    included): the rank-classification fine-tuning objective."""
    if task.get_config("output_type") != "multiple_choice":
        raise ConfigurationError(
            f"training needs a multiple_choice task; {name!r} has output_type "
            f"{task.get_config('output_type')!r}"
        )
    if not task.has_training_docs():
        raise ConfigurationError(
            f"task {name!r} has no training split (training_split is not set); train on another "
            "task or give one with a 'config' or 'yaml' of your own"
        )
    num_fewshot = task.get_config("num_fewshot") or 0
    pairs = []
    for doc_id, doc in enumerate(plain_rows(task.training_docs())):
        context = task.fewshot_context(doc, num_fewshot)
        requests = task.construct_requests(doc=doc, ctx=context, metadata=(name, doc_id, 1))
        try:
            gold = answer_indices(task, doc)[0]
        except BadAnswer as bad:
            raise ConfigurationError(
                f"task {name!r}: training document {doc_id} has no correct choice (its answer "
                f"{bad}); train on a labelled split"
            ) from None
        pairs.append(tuple(requests[gold].args[:2]))
    return pairs
