"""Batched scoring (``tango_fairscale.evaluation.scoring``) against one query at a time through the
model's own forward, the same scores whatever the batching at log-likelihoods in the thousands,
and the task scores step's own options (precision, packing, bad values); a batch out of device
memory refused in one line. Exactness against lm-evaluation-harness itself is in
``test_lm_eval_exact.py``."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TINY_GPT2, choice_queries
from helpers.steep import STEEP, exact_log_likelihood, random_queries
from helpers.tokenizer import vocabulary_fields
from tango.common.exceptions import ConfigurationError

from tango_fairscale.data.queries import Query
from tango_fairscale.data.schedules import length_sorted_batches, scoring_batches
from tango_fairscale.evaluation.call import EvalOptions
from tango_fairscale.evaluation.scoring import score_queries
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.tasks.piqa import read_piqa

CPU = torch.device("cpu")


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
    """``score_queries``' log-likelihoods through ``model`` on the CPU (``options``: forward,
    num_forwards, ...)."""
    return [score for score, _ in cpu_answers(model, queries, batch_size, **options)]


def cpu_answers(model: ModelWrapper, queries: list, batch_size: int, **options: Any) -> list:
    """``score_queries``' answers; ``options``: ``forward``, ``num_forwards``, and the
    :class:`EvalOptions` fields (no token limit unless ``max_batch_tokens`` is given)."""
    forward = options.pop("forward", forward_of(model))
    num_forwards = options.pop("num_forwards", None)
    sizes = EvalOptions(batch_size, **{"max_batch_tokens": None, "progress": False, **options})
    return score_queries(
        forward, queries, sizes, pad_token_id=model.pad_token_id, device=CPU,
        num_forwards=num_forwards,
    )  # fmt: skip


def one_query_log_likelihood(model: ModelWrapper, query: Query) -> float:
    """Plain HF forward of one unpadded query; sum of log_softmax at the continuation tokens."""
    return one_query_answer(model, query)[0]


def one_query_answer(model: ModelWrapper, query: Query) -> tuple[float, bool]:
    """(log-likelihood, greedy) by a plain HF forward of one unpadded query."""
    tokens = torch.tensor([query.tokens])
    with torch.inference_mode():
        logits = model.model(tokens[:, :-1]).logits[0]
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    n = query.continuation_length
    targets = tokens[0, -n:]
    greedy = bool((log_probs[-n:].argmax(dim=-1) == targets).all())
    return float(log_probs[-n:].gather(1, targets[:, None]).sum()), greedy


def test_a_batch_out_of_device_memory_says_which_sizes_to_lower(model, examples) -> None:
    queries = choice_queries(examples[:5], model.tokenizer, model.max_length)

    def out_of_memory(batch: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    options = EvalOptions(batch_size=4, max_batch_tokens=512)
    with pytest.raises(ConfigurationError) as refused:
        score_queries(out_of_memory, queries, options, pad_token_id=0, device=torch.device("cpu"))
    message = str(refused.value)
    assert message.startswith("scoring ran out of GPU memory on a batch of 4 queries and ")
    assert "max_batch_tokens (now 512)" in message and "batch_size (now 4;" in message
    assert "\n" not in message


def test_a_pass_makes_its_batches_once(model, examples, monkeypatch) -> None:
    # The GPU waits for the batches before its first forward (0.1-0.2 s for 32,000 HellaSwag
    # queries on the CPU).
    from tango_fairscale.evaluation import scoring

    made = []

    def counted(*args: Any, **kwargs: Any) -> list[list[int]]:
        made.append(args[0])
        return scoring_batches(*args, **kwargs)

    monkeypatch.setattr(scoring, "scoring_batches", counted)
    queries = choice_queries(examples[:6], model.tokenizer, model.max_length)
    options = EvalOptions(batch_size=4, max_batch_tokens=None, packed=True, progress=False)
    answers = scoring.score_on_all_ranks(
        forward_of(model), queries, options, pad_token_id=model.pad_token_id, device=CPU
    )
    assert len(made) == 1 and len(answers) == len(queries)


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
def test_greedy_flags_equal_the_argmax_of_one_query_at_a_time(
    model: ModelWrapper, examples: list, packed: bool
) -> None:
    """A continuation is greedy when every token is the argmax; queries built from the model's
    own argmax predictions are, one token changed is not."""
    queries = choice_queries(examples[:6], model.tokenizer, model.max_length)
    greedy_queries = []
    for query in queries:  # continue each context with the model's own greedy tokens
        context = list(query.tokens[: len(query) - query.continuation_length])
        for _ in range(3):
            with torch.inference_mode():
                context.append(int(model.model(torch.tensor([context])).logits[0, -1].argmax()))
        greedy_queries.append(Query(tuple(context), 3))
    almost = [Query(q.tokens[:-1] + ((q.tokens[-1] + 1) % 50257,), 3) for q in greedy_queries]
    everything = queries + greedy_queries + almost
    answers = cpu_answers(model, everything, 5, packed=packed)
    expected = [one_query_answer(model, query) for query in everything]
    assert [flag for _, flag in answers] == [flag for _, flag in expected]
    assert all(flag for _, flag in answers[len(queries) : 2 * len(queries)])
    assert not any(flag for _, flag in answers[2 * len(queries) :])


# The same scores whatever the batching, at log-likelihoods in the thousands -------------------


@pytest.fixture(scope="module")
def steep_model(tokenizer_dir: Path) -> ModelWrapper:
    """A tiny seeded GPT-2 with log-likelihoods in the thousands (``helpers/steep.py``)."""
    config = {**TINY_GPT2, **vocabulary_fields(tokenizer_dir), **STEEP}
    return ModelWrapper(config=config, tokenizer=str(tokenizer_dir), seed=1).eval()


def test_scores_do_not_depend_on_batching_at_large_log_likelihoods(
    steep_model: ModelWrapper,
) -> None:
    """Every query's log-likelihood, to |ll| ~2,000, is the same within 1e-4 alone, in batches of
    1, 3 and 16, packed or not, among other neighbours, and equals the exact sum of its
    per-token log-probabilities (float32 sums in batch order: up to 3.4e-4 off, 2.4e-4 apart)."""
    model = steep_model
    vocab = model.model.config.vocab_size
    queries = random_queries(0, vocab, longest=185)
    exact = np.array([exact_log_likelihood(model.model, query) for query in queries])
    assert 1_000 < np.abs(exact).max() <= 2_000
    alone = np.array([cpu_scores(model, [query], 1)[0] for query in queries])
    np.testing.assert_allclose(alone, exact, rtol=0, atol=1e-4)
    others = random_queries(1, vocab, longest=185)
    order = list(range(len(queries)))
    random.Random(2).shuffle(order)
    for packed in (False, True):
        for size in (1, 3, 16):
            scores = cpu_scores(model, queries, size, packed=packed)
            np.testing.assert_allclose(scores, alone, rtol=0, atol=1e-4, err_msg=f"{size} {packed}")
        # Other neighbours: shuffled, among other queries.
        mixed = cpu_scores(model, [queries[i] for i in order] + others, 5, packed=packed)
        np.testing.assert_allclose(mixed[: len(queries)], alone[order], rtol=0, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="scoring on a GPU")
def test_gpu_scores_do_not_depend_on_batching_at_large_log_likelihoods(
    tokenizer_dir: Path,
) -> None:
    """On a GPU (fp32, its own kernels per batch shape): every query scored in batches of 1, 3
    and 16, packed or not, is within 1e-4 of itself scored alone, to |ll| ~2,000."""
    config = {**TINY_GPT2, **vocabulary_fields(tokenizer_dir), **STEEP}
    model = ModelWrapper(config=config, tokenizer=str(tokenizer_dir), seed=1).eval().cuda()
    queries = random_queries(0, model.model.config.vocab_size, longest=185)
    cuda = torch.device("cuda")

    def scores(batch: list[Query], size: int, packed: bool) -> np.ndarray:
        sizes = EvalOptions(size, max_batch_tokens=None, packed=packed, progress=False)
        answers = score_queries(
            forward_of(model), batch, sizes, pad_token_id=model.pad_token_id, device=cuda
        )
        return np.array([score for score, _ in answers])

    alone = np.concatenate([scores([query], 1, False) for query in queries])
    assert 1_000 < np.abs(alone).max() <= 2_000
    for packed in (False, True):
        for size in (1, 3, 16):
            batched = scores(queries, size, packed)
            np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-4, err_msg=f"{size}")


def piqa_spec(examples: list) -> TaskSpec:
    from tango.common.dataset_dict import DatasetDict

    return TaskSpec(name="piqa", dataset=DatasetDict(splits={"validation": examples}))


def request_scores(result: dict) -> list[float]:
    return [resp[0][0] for sample in result["samples"]["piqa"] for resp in sample["resps"]]


def test_task_scores_step_scores_every_request(
    model: ModelWrapper, examples: list, tiny_model_dir: Path
) -> None:
    from tango.common.exceptions import ConfigurationError

    step = TaskScoresStep()
    spec = piqa_spec(examples[:10])
    scored = ModelWrapper(str(tiny_model_dir))  # the step moves it to its device (a GPU, say)
    result = step.run(model=scored, task=spec, batch_size=4, pack_sequences=False)
    queries = choice_queries(examples[:10], model.tokenizer, model.max_length)
    assert [sample["doc_id"] for sample in result["samples"]["piqa"]] == list(range(10))
    expected = [one_query_log_likelihood(model, q) for q in queries]
    np.testing.assert_allclose(request_scores(result), expected, rtol=1e-5, atol=1e-4)
    packed = step.run(model=scored, task=spec, batch_size=4, pack_sequences=True)
    np.testing.assert_allclose(request_scores(packed), expected, rtol=1e-5, atol=1e-4)
    assert packed["results"]["piqa"]["acc,none"] == result["results"]["piqa"]["acc,none"]
    with pytest.raises(ConfigurationError, match="pack_sequences must be true or false, got 1"):
        step.run(model=scored, task=spec, pack_sequences=1)
    flash = ModelWrapper(str(tiny_model_dir))
    flash.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigurationError, match="pack_sequences needs an attention that takes"):
        step.run(model=flash, task=spec, pack_sequences=True)
    with pytest.raises(ConfigurationError, match="batch_size must be a positive integer, got 0"):
        step.run(model=scored, task=spec, batch_size=0)


def test_length_sorted_scoring_restores_query_order(model: ModelWrapper, examples: list) -> None:
    queries = choice_queries(examples[:8], model.tokenizer, model.max_length)
    assert length_sorted_batches(queries, 16)[0] != list(range(len(queries)))  # really reordered
    scores = cpu_scores(model, list(reversed(queries)), 16)
    forward_scores = cpu_scores(model, queries, 16)
    np.testing.assert_allclose(scores[::-1], forward_scores, atol=1e-5)
    budgeted = cpu_scores(model, queries, 16, max_batch_tokens=4 * max(len(q) for q in queries))
    np.testing.assert_allclose(budgeted, forward_scores, atol=1e-5)


def test_task_scores_step_scores_in_bf16_when_asked(tiny_model_dir: Path, examples: list) -> None:
    from tango.common.exceptions import ConfigurationError

    model = ModelWrapper(str(tiny_model_dir))  # the step moves it to its device
    step = TaskScoresStep()
    spec = piqa_spec(examples[:6])
    exact = request_scores(step.run(model=model, task=spec, batch_size=4))
    fast = request_scores(step.run(model=model, task=spec, batch_size=4, precision="bf16-mixed"))
    assert exact != fast  # bf16 really ran
    np.testing.assert_allclose(fast, exact, rtol=2e-2)
    with pytest.raises(ConfigurationError, match="unknown precision 'bogus'"):
        step.run(model=model, task=spec, precision="bogus")
