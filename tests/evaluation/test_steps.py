"""The scoring step's ``pack_sequences``: ``null`` (the configs' and the step's default) packs
where the model takes packed batches and pads elsewhere; ``true`` on a model that does not is
refused in one line. Bloom (its ALiBi is built from a 2-D mask) is scored padded, like its own
forward, instead of failing with ``ValueError: too many values to unpack``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.families import package_scores, reference_scores, save_family
from tango.common.exceptions import ConfigurationError

from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec

PIQA_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "piqa"


def request_scores(result: dict) -> list[float]:
    return [resp[0][0] for sample in result["samples"]["piqa"] for resp in sample["resps"]]


def test_bloom_is_scored_padded_where_packing_is_automatic(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from conftest import choice_queries

    directory = save_family(tmp_path / "bloom", "bloom", tokenizer_dir)
    model = ModelWrapper(str(directory))
    assert not model.supports_packing
    task = TaskSpec(name="piqa", data_dir=str(PIQA_FIXTURE), limit=4)
    step = TaskScoresStep()
    with pytest.raises(ConfigurationError, match="scores packed queries as padded") as error:
        step.run(model=model, task=task, pack_sequences=True)  # asked for explicitly: refused
    assert "set pack_sequences to null" in str(error.value) and "\n" not in str(error.value)

    result = step.run(model=model, task=task, pack_sequences=None)
    padded = step.run(model=model, task=task, pack_sequences=False)
    assert request_scores(result) == request_scores(padded)
    # lm-eval's requests are PIQA's choices: scored as Bloom's own forward scores them.
    documents = [json.loads(line) for line in (PIQA_FIXTURE / "validation.jsonl").open()][:4]
    queries = choice_queries(documents, model.tokenizer, model.max_length)
    expected = reference_scores(directory, queries)
    np.testing.assert_allclose(request_scores(result), expected, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(package_scores(model, queries), expected, rtol=1e-6, atol=1e-4)


def test_packing_is_automatic_where_the_model_takes_it(tiny_model_dir: Path) -> None:
    model = ModelWrapper(str(tiny_model_dir))
    assert model.supports_packing
    task = TaskSpec(name="piqa", data_dir=str(PIQA_FIXTURE), limit=4)
    step = TaskScoresStep()
    automatic = request_scores(step.run(model=model, task=task))
    packed = request_scores(step.run(model=model, task=task, pack_sequences=True))
    assert automatic == packed
