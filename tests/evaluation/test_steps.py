"""The scoring step's ``pack_sequences``: ``null`` (the configs' and the step's default) packs
where the model takes packed batches and pads elsewhere; ``true`` on a model that does not is
refused in one line. Bloom (its ALiBi is built from a 2-D mask) is scored padded, like its own
forward, instead of failing with ``ValueError: too many values to unpack``. Its ``requests``
(a ``task_requests`` step): two models scored on one task in one workspace build the requests
once, and score as if each had built them."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import numpy as np
import pytest
from helpers.families import package_scores, reference_scores, save_family
from helpers.lifetimes import reference_counting_only
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


def test_a_second_model_on_the_same_task_builds_no_request(
    tmp_path: Path, tiny_model_dir: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models scored on one task in one workspace: the ``task_requests`` step runs once (the
    second scoring finds it in the cache), lm-eval builds no request in either scoring, the
    first scoring takes the tasks the requests step loaded, and each model's results equal
    ``task_scores`` building the requests itself."""
    from conftest import save_tiny_gpt2
    from lm_eval.api.task import ConfigurableTask
    from tango.workspaces import LocalWorkspace

    from tango_fairscale.tasks import requests as requests_module
    from tango_fairscale.tasks.requests import TaskRequestsStep

    workspace = LocalWorkspace(tmp_path / "workspace")
    other_dir = save_tiny_gpt2(tmp_path / "other", tokenizer_dir, seed=2)
    task = TaskSpec(name="piqa", data_dir=str(PIQA_FIXTURE), num_fewshot=1, limit=6)
    requests = TaskRequestsStep(task=task)
    models = [ModelWrapper(str(directory)) for directory in (tiny_model_dir, other_dir)]
    steps = [TaskScoresStep(model=m, task=task, requests=requests) for m in models]
    assert len({step.unique_id for step in steps}) == 2
    expected = [TaskScoresStep().run(model=model, task=task) for model in models]

    contexts: list[int] = []
    fewshot_context = ConfigurableTask.fewshot_context

    def counted(self: object, *args: object, **kwargs: object) -> object:
        contexts.append(1)
        return fewshot_context(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ConfigurableTask, "fewshot_context", counted)
    started: list[str] = []
    run = TaskRequestsStep.run

    def run_counted(self: TaskRequestsStep, **kwargs: object) -> dict:
        started.append(self.unique_id)
        return run(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(TaskRequestsStep, "run", run_counted)
    loads: list[int] = []
    load_tasks = requests_module.load_tasks
    monkeypatch.setattr(
        requests_module, "load_tasks", lambda spec: loads.append(1) or load_tasks(spec)
    )
    runs = []
    loaded = []
    for step in steps:
        before, loads_before = len(contexts), len(loads)
        result = step.result(workspace)
        runs.append(len(contexts) - before)
        loaded.append(len(loads) - loads_before)
        assert result["samples"] == expected[len(runs) - 1]["samples"]
        assert result["results"] == expected[len(runs) - 1]["results"]
    assert runs == [6, 0]  # the requests step built 6 contexts, with the first model only
    # lm-eval loaded the task once a command: the first scoring took the requests step's tasks
    assert loaded == [1, 1]
    assert started == [requests.unique_id]  # the requests step ran once, for the first model
    assert workspace.step_info(requests).state.value == "completed"


@pytest.mark.parametrize("stored_requests", [True, False], ids=["stored requests", "built"])
def test_a_scores_step_leaves_its_task_to_reference_counting(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, stored_requests: bool
) -> None:
    """Once a scores step returns, nothing holds its lm-eval task (documents, requests, answers)
    in a reference cycle — neither the stored requests' nor the metrics' stand-ins set on the
    task — so a suite's tasks go one by one as their steps end, not at Python's next full
    collection (rare in a command)."""
    from tango_fairscale.evaluation import steps as steps_module
    from tango_fairscale.tasks import requests as requests_module
    from tango_fairscale.tasks.requests import TaskRequestsStep

    loaded: list[weakref.ref] = []

    def tracked(spec: TaskSpec) -> dict:
        tasks = load_tasks(spec)
        loaded.extend(weakref.ref(task) for task in tasks["tasks"].values())
        return tasks

    load_tasks = steps_module.load_tasks
    monkeypatch.setattr(steps_module, "load_tasks", tracked)
    monkeypatch.setattr(requests_module, "load_tasks", tracked)
    model = ModelWrapper(str(tiny_model_dir))
    task = TaskSpec(name="arc_easy", data_dir=str(PIQA_FIXTURE.parent / "arc_easy"), limit=4)
    with reference_counting_only():
        requests = TaskRequestsStep().run(task=task) if stored_requests else None
        result = TaskScoresStep().run(model=model, task=task, requests=requests)
        assert result["results"]["arc_easy"]["acc,none"] is not None
        assert loaded and [task() for task in loaded] == [None] * len(loaded)
