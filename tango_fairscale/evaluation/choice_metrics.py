"""lm-eval's common multiple-choice metrics of all a task's documents at once, over arrays: the
values its ``ConfigurableTask.process_results`` gives each document, computed without a call per
document.

A task qualifies (:func:`computes`) when it is ``multiple_choice`` with lm-eval's own
``process_results``, its one filter ``none`` (each answer its first response) and metrics among
:data:`BULK_METRICS`, which need nothing but the answers, the choices' lengths and the gold
index. Every other task and metric goes through lm-eval's own code. The predictions are the
arrays' ``argmax`` per row (padding ``-inf``: ties and NaNs resolve as ``np.argmax`` of the
document's own values does), so each value is the one lm-eval computes, of the same type.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: The metrics computed here, in the order ``process_results`` lists them.
BULK_METRICS = ("acc", "f1", "mcc", "acc_norm", "acc_bytes", "exact_match", "acc_mutual_info")


def computes(task: Any) -> bool:
    """Whether :func:`document_metrics` gives ``task``'s per-document metrics."""
    from lm_eval.api.task import ConfigurableTask

    metrics = getattr(task, "_metric_fn_list", None)
    return (
        isinstance(task, ConfigurableTask)
        and type(task).process_results is ConfigurableTask.process_results
        and getattr(task, "OUTPUT_TYPE", None) == "multiple_choice"
        and not callable(task.config.process_results)
        and bool(metrics)
        and set(metrics or ()) <= set(BULK_METRICS)
        and [ensemble.name for ensemble in getattr(task, "_filters", [])] == ["none"]
    )


def document_metrics(
    task: Any,
    documents: Sequence[Mapping[str, Any]],
    answers: Sequence[Sequence[tuple[float, bool]]],
    targets: Sequence[Any] | None = None,
) -> list[dict[str, Any]]:
    """``task.process_results(document, its answers)`` for every document (a task that
    :func:`computes`): ``answers`` are each document's ``(log-likelihood, greedy)`` per request,
    in request order; ``targets``, if given, each document's ``task.doc_to_target``."""
    wanted = [metric for metric in BULK_METRICS if metric in task._metric_fn_list]
    choices = [task.doc_to_choice(doc) for doc in documents]
    conditional = []
    unconditional = []
    for doc_choices, doc_answers in zip(choices, answers, strict=True):
        doc_lls = [answer[0] for answer in doc_answers]
        count = len(doc_choices)
        if 2 * count == len(doc_lls) and "acc_mutual_info" in wanted:  # ("", choice) requests
            conditional.append(doc_lls[:count])
            unconditional.append(doc_lls[count:])
        else:
            conditional.append(doc_lls)
    predicted, predicted_norm, predicted_bytes = _predictions(conditional, choices)
    predicted_mutual = None
    if "acc_mutual_info" in wanted:
        if len(unconditional) != len(documents):
            raise ValueError  # as process_results: a document without its unconditional answers
        mutual = [
            [c - u for c, u in zip(conditional_lls, unconditional_lls, strict=True)]
            for conditional_lls, unconditional_lls in zip(conditional, unconditional, strict=True)
        ]
        predicted_mutual = _padded(mutual, -np.inf).argmax(axis=1)
    results = []
    for i, doc in enumerate(documents):
        target = targets[i] if targets is not None else None
        gold = _gold(task, doc, choices[i], target)
        greedy = [answer[1] for answer in answers[i]]
        pred, pred_norm, pred_bytes = predicted[i], predicted_norm[i], predicted_bytes[i]
        values: dict[str, Any]
        if task.multiple_target:
            values = {
                "acc": 1.0 if pred in gold else 0.0,
                "acc_norm": 1.0 if pred_norm in gold else 0.0,
                "acc_bytes": 1.0 if pred_bytes in gold else 0.0,
                "exact_match": int(any(greedy[g] if g != -100 else 0 for g in gold)),
            }
        else:
            values = {
                "acc": 1.0 if pred == gold else 0.0,
                "acc_norm": 1.0 if pred_norm == gold else 0.0,
                "acc_bytes": 1.0 if pred_bytes == gold else 0.0,
                "exact_match": int(greedy[gold]) if gold != -100 else 0,
            }
        values |= {"f1": (gold, pred), "mcc": (gold, pred)}
        if predicted_mutual is not None:
            values["acc_mutual_info"] = 1.0 if predicted_mutual[i] == gold else 0.0
        results.append({metric: values[metric] for metric in wanted})
    return results


def _predictions(lls: list[list[float]], choices: list[list[str]]) -> list[np.ndarray]:
    """Each document's argmax of its log-likelihoods, of them over its choices' lengths in
    characters, and in UTF-8 bytes (``process_results``' ``pred``, ``pred_norm``,
    ``pred_byte``)."""
    padded = _padded(lls, -np.inf)
    characters = _padded([[float(len(c)) for c in cs] for cs in choices], 1.0)
    utf8_bytes = _padded([[float(len(c.encode("utf-8"))) for c in cs] for cs in choices], 1.0)
    return [
        padded.argmax(axis=1),
        (padded / characters).argmax(axis=1),
        (padded / utf8_bytes).argmax(axis=1),
    ]


def _padded(rows: list[list[float]], fill: float) -> np.ndarray:
    """``rows`` as one float64 array, short rows filled with ``fill``."""
    width = max((len(row) for row in rows), default=0)
    array = np.full((len(rows), width), fill, dtype=np.float64)
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


def _gold(task: Any, doc: Mapping[str, Any], choices: list[str], target: Any) -> Any:
    """The gold index (a list of them for ``multiple_target`` tasks) as ``process_results``
    reads it (``target``: ``doc_to_target``'s, if known): ``-100`` for one that is not among
    ``choices``, with lm-eval's warning."""
    if task.multiple_input:
        gold = task.doc_to_text(doc)
    else:
        gold = task.doc_to_target(doc) if target is None else target
    if isinstance(gold, list):
        gold = [index if index < len(choices) else -100 for index in gold]
        out_of_range = -100 in gold
    else:
        if isinstance(gold, int):
            gold = gold if gold < len(choices) else -100
        elif isinstance(gold, str):
            gold = choices.index(gold) if gold in choices else -100
        out_of_range = gold == -100
    if out_of_range:
        logger.warning(
            "a document's gold answer is not among its %d choices: %s", len(choices), doc
        )
    return gold
