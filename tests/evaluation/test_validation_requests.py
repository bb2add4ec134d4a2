"""Validation during training builds its requests once (``harness.requests_built_once``): lm-eval's
instances, the documents they are built from and their encoded queries are made by the first
validation and taken again by every later one, which gives the figures a fresh evaluation gives."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT
from tango.common.dataset_dict import DatasetDict

from tango_fairscale.evaluation import lm as lm_module
from tango_fairscale.evaluation.call import EvalOptions, ModelCall
from tango_fairscale.evaluation.evaluator import Evaluator
from tango_fairscale.evaluation.harness import merge, requests_built_once, summary
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks import documents as task_documents
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.train.validation import validate


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> ModelWrapper:
    return ModelWrapper(str(tiny_model_dir)).eval()


def specs(piqa_small: DatasetDict) -> list[TaskSpec]:
    documents = DatasetDict(splits={"validation": list(piqa_small["validation"])[:24],
                                    "train": list(piqa_small["train"])[:16]})  # fmt: skip
    return [
        TaskSpec(name="piqa", dataset=documents, num_fewshot=2, limit=20),
        TaskSpec(name="arc_easy", data_dir=str(REPO_ROOT / "tests/fixtures/tasks/arc_easy")),
    ]


def evaluator(model: ModelWrapper) -> Evaluator:
    """An evaluator scoring as an engine's ``forward_eval`` does: without gradients."""
    local = ModelCall.local(model, torch.device("cpu"))

    def forward(batch: dict[str, Any]) -> Any:
        with torch.no_grad():
            return local(batch)

    options = EvalOptions(batch_size=8, max_batch_tokens=None, packed=True, progress=False)
    return Evaluator(ModelCall(forward, model, torch.device("cpu")), options)


def test_every_validation_gives_a_fresh_evaluations_figures(
    model: ModelWrapper, piqa_small: DatasetDict
) -> None:
    model.eval()
    fresh = [evaluator(model).evaluate(spec, load_tasks(spec)) for spec in specs(piqa_small)[:1]]
    expected = summary(merge(fresh))  # as every validation was computed before
    tasks = [(spec, requests_built_once(load_tasks(spec))) for spec in specs(piqa_small)[:1]]
    engine = SimpleNamespace(model=model)
    validations = [validate(engine, evaluator(model), tasks)]  # type: ignore[arg-type]
    reused = evaluator(model)
    validations += [validate(engine, reused, tasks) for _ in range(2)]  # type: ignore[arg-type]
    assert expected["num_examples"] == 20 and "acc_norm_stderr" in expected
    assert validations == [expected] * 3  # exactly: the same requests, the same scores
    assert model.training  # validate leaves the model training, as it found it in a run


def test_requests_documents_and_queries_are_built_by_the_first_validation_only(
    model: ModelWrapper, piqa_small: DatasetDict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lm_eval.api.task import ConfigurableTask

    calls: dict[str, int] = {"requests": 0, "pairs": 0, "documents": 0}

    def counted(name: str, function: Any, amount: Any = lambda *a, **k: 1) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += amount(*args, **kwargs)
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(
        ConfigurableTask,
        "construct_requests",
        counted("requests", ConfigurableTask.construct_requests),
    )
    monkeypatch.setattr(  # a split's documents read (load_tasks reads each once, in bulk)
        task_documents, "plain_rows", counted("documents", task_documents.plain_rows)
    )
    monkeypatch.setattr(
        lm_module,
        "encode_pairs",
        counted("pairs", lm_module.encode_pairs, lambda tokenizer, pairs, n: len(pairs)),
    )
    tasks = [(spec, requests_built_once(load_tasks(spec))) for spec in specs(piqa_small)]
    shared = evaluator(model)
    engine = SimpleNamespace(model=model)
    first = validate(engine, shared, tasks)  # type: ignore[arg-type]
    built = dict(calls)
    assert built["requests"] == 20 + 24  # a request set per document of each task
    assert 0 < built["pairs"] <= 2 * 20 + 4 * 24  # a pair per choice, identical ones once
    assert built["documents"] == 2 * 2  # each task's scored and few-shot documents, once
    second = validate(engine, shared, tasks)  # type: ignore[arg-type]
    assert calls == built  # nothing built, read or encoded again
    assert second == first
