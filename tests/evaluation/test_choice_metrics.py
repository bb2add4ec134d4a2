"""The multiple-choice metrics computed in bulk (``evaluation.choice_metrics``) equal lm-eval's own
``process_results`` per document, value and type: every metric computed there, ties, NaN and
-inf log-likelihoods, gold answers as indices (one out of range), texts and lists, and
``acc_mutual_info``'s unconditional answers. (The nine fixture formats are compared with lm-eval's
whole evaluation in ``tests/integration/evaluation/test_lm_eval_exact.py``.)"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from tango_fairscale.evaluation import choice_metrics

METRICS = ["acc", "acc_norm", "acc_bytes", "exact_match", "f1", "mcc", "acc_mutual_info"]


def lm_eval_task(directory: Path, docs: list[dict], target: str, metrics: list[str]) -> Any:
    """lm-eval's own task over ``docs`` (no checks of the package in between)."""
    from lm_eval.tasks import TaskManager

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "validation.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    config = {
        "task": f"probe_{directory.name}",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"validation": str(path)}},
        "output_type": "multiple_choice",
        "validation_split": "validation",
        "doc_to_text": "{{question}}",
        "doc_to_target": target,
        "doc_to_choice": "choices",
        "metric_list": [{"metric": metric} for metric in metrics],
    }
    (task,) = TaskManager(include_defaults=False).load([config])["tasks"].values()
    return task


def random_answers(rng: random.Random, count: int) -> list[tuple[float, bool]]:
    """Log-likelihoods with ties (one decimal), now and then NaN or -inf."""
    special = [math.nan, -math.inf, 0.0]
    return [
        (
            rng.choice(special) if rng.random() < 0.08 else -round(rng.uniform(0, 3), 1),
            rng.random() < 0.3,
        )
        for _ in range(count)
    ]


def documents(rng: random.Random, gold: Any) -> list[dict]:
    docs = []
    for i in range(60):
        choices = [
            "".join(rng.choice("ab é") for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(2, 5))
        ]
        docs.append({"question": f"q{i}", "choices": choices, "gold": gold(rng, choices)})
    docs[0]["gold"] = gold(random.Random(1), ["a"])  # lm-eval reads the first one at load
    return docs


GOLDS = {
    "index": lambda rng, choices: rng.randint(0, len(choices)),  # len(choices): out of range
    "text": lambda rng, choices: rng.choice(choices + ["none of them"]),
    "indices": lambda rng, choices: sorted(
        rng.sample(range(len(choices) + 1), min(2, len(choices)))
    ),
}


@pytest.mark.parametrize("kind", list(GOLDS))
@pytest.mark.parametrize("mutual_info", [False, True])
def test_bulk_metrics_are_lm_evals_process_results(
    tmp_path: Path, kind: str, mutual_info: bool
) -> None:
    rng = random.Random(f"{kind}{mutual_info}")
    metrics = METRICS if mutual_info else METRICS[:-1]
    docs = documents(rng, GOLDS[kind])
    task = lm_eval_task(tmp_path / kind, docs, "gold", metrics)
    assert choice_metrics.computes(task)
    assert bool(task.multiple_target) == (kind == "indices")
    read = [doc for _, doc in task.doc_iterator(limit=None)]
    answers = [random_answers(rng, len(doc["choices"]) * (2 if mutual_info else 1)) for doc in read]
    if kind == "indices" and mutual_info:  # lm-eval compares an index with a list of them
        with pytest.raises(ValueError, match="truth value of an array"):
            task.process_results(read[1], answers[1])
        with pytest.raises(ValueError, match="truth value of an array"):
            choice_metrics.document_metrics(task, read, answers)
        return
    expected = [task.process_results(doc, doc_answers) for doc, doc_answers in zip(read, answers)]
    got = choice_metrics.document_metrics(task, read, answers)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert list(mine) == list(theirs)  # the same metrics, in the same order
        for metric, value in theirs.items():
            assert repr(mine[metric]) == repr(value), metric  # the same value and type


def test_tasks_with_other_metrics_or_filters_are_left_to_lm_eval(tmp_path: Path) -> None:
    docs = documents(random.Random(0), GOLDS["index"])
    for gold in docs:
        gold["gold"] = min(gold["gold"], len(gold["choices"]) - 1)
    assert not choice_metrics.computes(
        lm_eval_task(tmp_path / "brier", docs, "gold", ["brier_score"])
    )
    task = lm_eval_task(tmp_path / "acc", docs, "gold", ["acc"])
    task._filters[0].name = "strict"  # a task's own filter pipeline
    assert not choice_metrics.computes(task)
