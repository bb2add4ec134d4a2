"""Tests for PIQA scoring and metrics (``tango_fairscale.evaluation``).

Metrics follow lm-evaluation-harness's multiple-choice ``process_results``: ``acc`` is the argmax
of the log-likelihoods, ``acc_norm`` the argmax of log-likelihood / ``len(choice)`` in characters
(the raw ``sol`` string, without the target delimiter's leading space), ``np.argmax`` breaking ties
towards the first choice, and the standard errors are ``mean_stderr`` (sample standard deviation
over √n).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import choice_queries

from tango_fairscale.data.queries import Query
from tango_fairscale.data.schedules import length_sorted_batches
from tango_fairscale.evaluation.scoring import score_queries
from tango_fairscale.evaluation.steps import PiqaMetricsStep, PiqaPredictionsStep
from tango_fairscale.evaluation.validation import validate_piqa
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.piqa import (
    correct_counts,
    metrics_from_predictions,
    piqa_predictions,
    read_piqa,
)

CPU = torch.device("cpu")


# lm-eval's definitions, transcribed -----------------------------------------------------------


def lm_eval_mean_stderr(arr: Sequence[float]) -> float:
    """``lm_eval.api.metrics.mean_stderr``."""
    mu = sum(arr) / len(arr)
    return math.sqrt(sum((x - mu) ** 2 for x in arr) / (len(arr) - 1)) / math.sqrt(len(arr))


def lm_eval_piqa_metrics(
    lls_per_example: Sequence[Sequence[float]],
    choices_per_example: Sequence[Sequence[str]],
    golds: Sequence[int],
) -> dict[str, float]:
    """lm-eval's multiple-choice ``process_results`` per example, then mean / mean_stderr."""
    accs, acc_norms = [], []
    for lls, choices, gold in zip(lls_per_example, choices_per_example, golds, strict=True):
        completion_len = np.array([float(len(choice)) for choice in choices])
        accs.append(1.0 if int(np.argmax(lls)) == gold else 0.0)
        acc_norms.append(1.0 if int(np.argmax(np.array(lls) / completion_len)) == gold else 0.0)
    return {
        "acc": sum(accs) / len(accs),
        "acc_stderr": lm_eval_mean_stderr(accs),
        "acc_norm": sum(acc_norms) / len(acc_norms),
        "acc_norm_stderr": lm_eval_mean_stderr(acc_norms),
    }


def prediction(lls: Sequence[float], sols: Sequence[str], label: int) -> dict[str, Any]:
    return {
        "label": label,
        "loglikelihoods": list(lls),
        "char_lengths": [len(sol) for sol in sols],
    }


# Metrics --------------------------------------------------------------------------------------


def test_acc_is_argmax_of_loglikelihood() -> None:
    predictions = [
        prediction([-1.0, -2.0], ["a", "b"], 0),  # hit
        prediction([-3.0, -2.0], ["a", "b"], 1),  # hit
        prediction([-1.0, -2.0], ["a", "b"], 1),  # miss
        prediction([-5.0, -4.0], ["a", "b"], 0),  # miss
    ]
    metrics = metrics_from_predictions(predictions)
    assert metrics["acc"] == 0.5
    assert metrics["num_examples"] == 4
    assert set(metrics) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "num_examples"}


def test_acc_norm_divides_by_characters_of_sol_without_the_leading_space() -> None:
    # sol1 "a" (1 char), sol2 "abc" (3 chars): -2 / 1 = -2 < -5 / 3 ≈ -1.67, so sol2 wins.
    # Counting the continuation's leading space would give -2 / 2 = -1 > -5 / 4 and pick sol1.
    predictions = [prediction([-2.0, -5.0], ["a", "abc"], 1)]
    assert correct_counts(predictions) == (0, 1)
    predictions.append(prediction([-2.0, -5.0], ["a", "abc"], 0))
    metrics = metrics_from_predictions(predictions)
    assert (metrics["acc"], metrics["acc_norm"]) == (0.5, 0.5)
    lm_eval = lm_eval_piqa_metrics([[-2.0, -5.0]] * 2, [["a", "abc"]] * 2, [1, 0])
    assert metrics == pytest.approx({**lm_eval, "num_examples": 2}, rel=1e-12)


def test_ties_go_to_the_first_choice() -> None:
    tie = [-3.0, -3.0]
    assert correct_counts([prediction(tie, ["ab", "cd"], 0)]) == (1, 1)
    assert correct_counts([prediction(tie, ["ab", "cd"], 1)]) == (0, 0)
    # A tie only after normalising: -2 / 2 == -4 / 4.
    assert correct_counts([prediction([-2.0, -4.0], ["ab", "abcd"], 0)]) == (1, 1)
    assert correct_counts([prediction([-2.0, -4.0], ["ab", "abcd"], 1)]) == (0, 0)


def test_stderr_is_lm_eval_mean_stderr() -> None:
    outcomes = [1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 1]
    predictions = [prediction([-1.0, -2.0], ["x", "y"], 1 - hit) for hit in outcomes]
    metrics = metrics_from_predictions(predictions)
    assert metrics["acc"] == 7 / 11
    assert metrics["acc_stderr"] == pytest.approx(lm_eval_mean_stderr(outcomes), rel=1e-12)
    assert metrics["acc_norm_stderr"] == pytest.approx(lm_eval_mean_stderr(outcomes), rel=1e-12)
    every = metrics_from_predictions([prediction([-1.0, -2.0], ["x", "y"], 0)] * 5)
    assert (every["acc"], every["acc_stderr"]) == (1.0, 0.0)
    assert math.isnan(metrics_from_predictions(predictions[:1])["acc_stderr"])


def test_metrics_equal_lm_eval_on_random_predictions_with_ties() -> None:
    rng = random.Random(0)
    lls, sols, golds = [], [], []
    for _ in range(500):
        # Few distinct values so that raw and normalised ties occur often.
        lls.append([float(-rng.randint(1, 6)), float(-rng.randint(1, 6))])
        sols.append(["x" * rng.randint(1, 3), "y" * rng.randint(1, 3) + " "])
        golds.append(rng.randint(0, 1))
    predictions = [prediction(*args) for args in zip(lls, sols, golds, strict=True)]
    metrics = metrics_from_predictions(predictions)
    expected = lm_eval_piqa_metrics(lls, sols, golds)
    assert metrics["acc"] == expected["acc"]
    assert metrics["acc_norm"] == expected["acc_norm"]
    assert metrics["acc_stderr"] == pytest.approx(expected["acc_stderr"], rel=1e-12)
    assert metrics["acc_norm_stderr"] == pytest.approx(expected["acc_norm_stderr"], rel=1e-12)
    assert metrics["num_examples"] == 500


def test_unlabelled_predictions_are_left_out() -> None:
    predictions = [
        prediction([-1.0, -2.0], ["a", "b"], 0),
        prediction([-1.0, -2.0], ["a", "b"], -1),
        prediction([-1.0, -2.0], ["a", "b"], 1),
    ]
    metrics = metrics_from_predictions(predictions)
    assert (metrics["acc"], metrics["num_examples"]) == (0.5, 2)
    with pytest.raises(ValueError, match="no labelled predictions"):
        metrics_from_predictions(predictions[1:2])


def test_metrics_step_runs_metrics_from_predictions() -> None:
    predictions = [prediction([-1.0, -2.0], ["a", "bb"], label) for label in (0, 1, 0)]
    assert PiqaMetricsStep().run(predictions) == metrics_from_predictions(predictions)


def test_piqa_predictions_layout() -> None:
    examples = [
        {"goal": "g0", "sol1": "replace drawer with bobby pin ", "sol2": "b", "label": 1},
        {"goal": "g1", "sol1": "two  spaces", "sol2": "caf\u00e9", "label": -1},
    ]
    queries = [Query((1, 2, 3), 2), Query((1, 2), 1), Query((4, 5, 6, 7), 3), Query((4, 8), 1)]
    lengths = [query.continuation_length for query in queries]
    result = piqa_predictions(examples, [-1.5, -2.5, -3.5, -4.5], lengths)
    assert result == [
        {
            "index": 0,
            "label": 1,
            "loglikelihoods": [-1.5, -2.5],
            "token_lengths": [2, 1],
            "char_lengths": [30, 1],  # trailing space counted, no leading space
        },
        {
            "index": 1,
            "label": -1,
            "loglikelihoods": [-3.5, -4.5],
            "token_lengths": [3, 1],
            "char_lengths": [11, 4],
        },
    ]


# Scoring with a tiny model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> ModelWrapper:
    return ModelWrapper(str(tiny_model_dir)).eval()


@pytest.fixture(scope="module")
def examples(piqa_dir: Path) -> list[Mapping[str, Any]]:
    return list(read_piqa(piqa_dir, limit=16)["validation"])


def forward_of(model: ModelWrapper) -> Any:
    def forward(batch: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        with torch.inference_mode():
            return model(**batch)

    return forward


def cpu_scores(model: ModelWrapper, queries: list, batch_size: int, **options: Any) -> list[float]:
    """``score_queries`` through ``model`` on the CPU (``options``: forward, num_forwards, ...)."""
    forward = options.pop("forward", forward_of(model))
    return score_queries(
        forward,
        queries,
        batch_size=batch_size,
        pad_token_id=model.pad_token_id,
        device=CPU,
        progress=False,
        **options,
    )


def one_query_log_likelihood(model: ModelWrapper, query: Query) -> float:
    """Plain HF forward of one unpadded query; sum of log_softmax at the continuation tokens."""
    tokens = torch.tensor([query.tokens])
    with torch.inference_mode():
        logits = model.model(tokens[:, :-1]).logits[0]
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    n = query.continuation_length
    targets = tokens[0, -n:]
    return float(log_probs[-n:].gather(1, targets[:, None]).sum())


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("max_length", [128, 12])  # 12: most queries are left-truncated
def test_batched_scores_equal_one_query_at_a_time(
    model: ModelWrapper, examples: list, max_length: int, packed: bool
) -> None:
    queries = choice_queries(examples, model.tokenizer, max_length)
    if max_length == 12:
        assert sum(len(q) == 13 for q in queries) > len(queries) // 2
        assert any(q.continuation_length == 12 for q in queries)
    scores = cpu_scores(model, queries, 7, packed=packed)
    expected = [one_query_log_likelihood(model, query) for query in queries]
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("packed", [False, True])
def test_scores_do_not_depend_on_batch_size(
    model: ModelWrapper, examples: list, packed: bool
) -> None:
    queries = choice_queries(examples[:8], model.tokenizer, model.max_length)
    results = [cpu_scores(model, queries, size, packed=packed) for size in (1, 4, 64)]
    np.testing.assert_allclose(results[0], results[1], atol=1e-4)
    np.testing.assert_allclose(results[0], results[2], atol=1e-4)


def test_num_forwards_pads_with_discarded_forwards(model: ModelWrapper, examples: list) -> None:
    queries = choice_queries(examples[:5], model.tokenizer, model.max_length)
    calls: list[int] = []

    def counting(batch: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        calls.append(len(batch["input_ids"]))
        return forward_of(model)(batch)

    plain = cpu_scores(model, queries, 4, forward=counting)
    assert calls == [4, 4, 2]
    calls.clear()
    padded = cpu_scores(model, queries, 4, forward=counting, num_forwards=6)
    assert calls == [4, 4, 2, 1, 1, 1]
    assert padded == plain
    calls.clear()  # packed: one row per forward here (a batch's queries fit in one row)
    packed = cpu_scores(model, queries, 4, forward=counting, num_forwards=4, packed=True)
    assert calls == [1, 1, 1, 1]
    np.testing.assert_allclose(packed, plain, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_validate_piqa_single_process_equals_score_queries_and_metrics(
    model: ModelWrapper, examples: list, packed: bool
) -> None:
    result = validate_piqa(
        forward_of(model),
        examples,
        model.tokenizer,
        max_length=model.max_length,
        batch_size=8,
        device=CPU,
        packed=packed,
        progress=False,
    )
    queries = choice_queries(examples, model.tokenizer, model.max_length)
    scores = cpu_scores(model, queries, 8)
    lengths = [query.continuation_length for query in queries]
    metrics = metrics_from_predictions(piqa_predictions(examples, scores, lengths))
    assert metrics["num_examples"] == len(examples)
    assert result == {
        "acc": metrics["acc"],
        "acc_norm": metrics["acc_norm"],
        "num_examples": len(examples),
    }
    # And against lm-eval's metric definitions on one-query-at-a-time scores.
    lls = [one_query_log_likelihood(model, q) for q in queries]
    lm_eval = lm_eval_piqa_metrics(
        [lls[i : i + 2] for i in range(0, len(lls), 2)],
        [[e["sol1"], e["sol2"]] for e in examples],
        [e["label"] for e in examples],
    )
    assert (result["acc"], result["acc_norm"]) == (lm_eval["acc"], lm_eval["acc_norm"])


def test_predictions_step_scores_every_example(
    model: ModelWrapper, examples: list, tiny_model_dir: Path
) -> None:
    from tango.common.dataset_dict import DatasetDict
    from tango.common.exceptions import ConfigurationError

    dataset = DatasetDict(splits={"validation": examples[:10], "train": []})
    step = PiqaPredictionsStep()
    result = step.run(model=model, dataset_dict=dataset, split="validation", batch_size=4)
    queries = choice_queries(examples[:10], model.tokenizer, model.max_length)
    assert [p["index"] for p in result] == list(range(10))
    assert [p["token_lengths"] for p in result] == [
        [queries[2 * i].continuation_length, queries[2 * i + 1].continuation_length]
        for i in range(10)
    ]
    expected = [one_query_log_likelihood(model, q) for q in queries]
    got = [ll for p in result for ll in p["loglikelihoods"]]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    packed = step.run(model=model, dataset_dict=dataset, batch_size=4, pack_sequences=True)
    got = [ll for p in packed for ll in p["loglikelihoods"]]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    with pytest.raises(ConfigurationError, match="pack_sequences must be true or false, got 1"):
        step.run(model=model, dataset_dict=dataset, pack_sequences=1)
    flash = ModelWrapper(str(tiny_model_dir))
    flash.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigurationError, match="pack_sequences needs an attention that takes"):
        step.run(model=flash, dataset_dict=dataset, pack_sequences=True)
    with pytest.raises(ConfigurationError, match="split 'test' is not in the dataset"):
        step.run(model=model, dataset_dict=dataset, split="test")
    with pytest.raises(ConfigurationError, match="split 'train' holds no examples"):
        step.run(model=model, dataset_dict=dataset, split="train")
    with pytest.raises(ConfigurationError, match="batch_size must be a positive integer, got 0"):
        step.run(model=model, dataset_dict=dataset, batch_size=0)


def test_length_sorted_scoring_restores_query_order(model: ModelWrapper, examples: list) -> None:
    queries = choice_queries(examples[:8], model.tokenizer, model.max_length)
    assert length_sorted_batches(queries, 16)[0] != list(range(len(queries)))  # really reordered
    scores = cpu_scores(model, list(reversed(queries)), 16)
    forward_scores = cpu_scores(model, queries, 16)
    np.testing.assert_allclose(scores[::-1], forward_scores, atol=1e-5)
    budgeted = cpu_scores(model, queries, 16, max_batch_tokens=4 * max(len(q) for q in queries))
    np.testing.assert_allclose(budgeted, forward_scores, atol=1e-5)


def test_predictions_step_scores_in_bf16_when_asked(model: ModelWrapper, examples: list) -> None:
    from tango.common.dataset_dict import DatasetDict
    from tango.common.exceptions import ConfigurationError

    dataset = DatasetDict(splits={"validation": examples[:6]})
    step = PiqaPredictionsStep()
    exact = step.run(model=model, dataset_dict=dataset, batch_size=4)
    fast = step.run(model=model, dataset_dict=dataset, batch_size=4, precision="bf16-mixed")
    exact_scores = [ll for p in exact for ll in p["loglikelihoods"]]
    fast_scores = [ll for p in fast for ll in p["loglikelihoods"]]
    assert exact_scores != fast_scores  # bf16 really ran
    np.testing.assert_allclose(fast_scores, exact_scores, rtol=2e-2)
    with pytest.raises(ConfigurationError, match="scoring precision must be"):
        step.run(model=model, dataset_dict=dataset, precision="bf16-true")
