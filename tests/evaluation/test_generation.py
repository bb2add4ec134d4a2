"""Properties of the package's decoding: answers that do not depend on the batch size, on the
kind of key/value cache, or (sampling, seeded per request) on anything but the seed; repeats of
a sampled request differ; the seam is called equally often on every rank."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT
from helpers.peaked import save_peaked_model

from tango_fairscale.evaluation import decoder
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model import decoding
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(FIXTURES))
from lm_eval_fixtures import generation_kwargs, task_config  # noqa: E402

SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> ModelWrapper:
    directory = tmp_path_factory.mktemp("peaked-gpt2")
    return ModelWrapper(str(save_peaked_model(directory, gpt2_tokenizer_dir, "gpt2")))


def gsm8k(**gen_kwargs: Any) -> TaskSpec:
    """lm-eval's gsm8k on the fixture, 12 new tokens at most, one-shot, 6 documents."""
    config = task_config(
        "gsm8k", generation_kwargs={**generation_kwargs("gsm8k", 12), **gen_kwargs}
    )
    return TaskSpec(config={**config, "num_fewshot": 1}, limit=6)


def answers(model: ModelWrapper, spec: TaskSpec, **arguments: Any) -> list[list[str]]:
    result = TaskScoresStep().run(model=model, task=spec, **arguments)
    samples = [s for s in result["samples"]["gsm8k"] if s["filter"] == "strict-match"]
    return [list(sample["resps"][0]) for sample in samples]  # a request's repeats


def test_greedy_answers_do_not_depend_on_the_batch_or_the_cache(
    model: ModelWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = answers(model, gsm8k(), batch_size=1)
    assert answers(model, gsm8k(), batch_size=7) == one
    assert decoding.takes_static_cache(model.model)  # a preallocated cache so far; now growing
    model.model.set_attn_implementation("eager")  # explicit masks: additive there
    try:
        assert answers(model, gsm8k(), batch_size=5) == one
    finally:
        model.model.set_attn_implementation("sdpa")
    monkeypatch.setattr(decoder, "new_cache", lambda hf_model, _: decoding.new_cache(hf_model))
    assert answers(model, gsm8k(), batch_size=4) == one


def test_sampling_is_seeded_per_request(model: ModelWrapper) -> None:
    spec = TaskSpec(config={**gsm8k(**SAMPLING).config, "repeats": 3}, limit=6)  # type: ignore[dict-item]
    sampled = answers(model, spec, batch_size=1)
    assert answers(model, spec, batch_size=16) == sampled
    assert all(len(repeats) == 3 for repeats in sampled)
    assert any(len(set(repeats)) > 1 for repeats in sampled)  # each repeat samples anew
    assert answers(model, spec, batch_size=16, generation_seed=7) != sampled
    assert sampled != [[text] * 3 for [text, *_] in answers(model, gsm8k(), batch_size=16)]


def test_the_generation_settings_are_in_the_cache_key(model: ModelWrapper) -> None:
    def key(**arguments: Any) -> str:
        return TaskScoresStep(model=model, task=gsm8k(), **arguments).unique_id

    assert key(max_gen_toks=64) != key(max_gen_toks=32)
    assert key(generation_seed=1) != key(generation_seed=2)
    assert key(batch_size=8) == key(batch_size=64)  # a speed setting


def test_batches_hold_at_most_batch_size_rows_and_the_cache_budget() -> None:
    from tango_fairscale.evaluation.decoder import Row
    from tango_fairscale.evaluation.generation import batches_of

    rows = [Row(i, [0] * length) for i, length in enumerate([90, 80, 50, 40, 30, 20, 10, 5])]
    sizes = [[len(r.prompt) for r in b] for b in batches_of(rows, 3, None, 10)]
    assert sizes == [[90, 80, 50], [40, 30, 20], [10, 5]]
    # rows x (the first, longest prompt + 10) <= 250 tokens: 2 x 100, 4 x 60, 2 x 20.
    sizes = [[len(r.prompt) for r in b] for b in batches_of(rows, 8, 250, 10)]
    assert sizes == [[90, 80], [50, 40, 30, 20], [10, 5]]
