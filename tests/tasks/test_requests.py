"""A task's requests built once, without a model (``tango_fairscale::task_requests``).

* its result is lm-eval's own: every fixture task's instances (two-shot; multiple-choice and
  generation), built by lm-eval as released from lm-eval's own task configs — request type,
  arguments, ``idx``, document, repeats, task name — and what is put back into a task equals
  what the task builds itself;
* its cache key is the task configuration: few-shot count and seed, limit, system instruction,
  the data's files (edited in place) and lm-eval's version each change it, the model is not in
  it;
* requests of another task configuration are refused in one line; documents changed under a
  cached result are built again with a warning; chat-templated tasks are refused.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, lm_eval_as_released
from helpers.requests import stored_requests
from lm_eval.api.model import LM as LM_BASE
from tango.common.det_hash import det_hash
from tango.common.exceptions import ConfigurationError

from tango_fairscale.tasks import lm_eval as lm_eval_module
from tango_fairscale.tasks import requests as requests_module
from tango_fairscale.tasks import restoring as restoring_module
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.tasks.requests import TaskRequestsStep, doc_hash
from tango_fairscale.tasks.restoring import check_requests, use_requests

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(FIXTURES))
from lm_eval_fixtures import (  # noqa: E402
    DATA_DIR,
    TASKS,
    generation_kwargs,
    task_config,
    task_manager,
    write_generation_yaml,
)

SHOTS, LIMIT, MAX_GEN_TOKS = 2, 6, 16
GENERATION = ["gsm8k", "triviaqa", "drop"]


def spec_of(task: str, yaml_dir: Path, **fields: Any) -> TaskSpec:
    data_dir = str(FIXTURES / DATA_DIR[task])
    fields = {"num_fewshot": SHOTS, "limit": LIMIT, **fields}
    if task in GENERATION:
        yaml = str(write_generation_yaml(task, yaml_dir, MAX_GEN_TOKS))
        return TaskSpec(yaml=yaml, data_dir=data_dir, **fields)
    return TaskSpec(name=task, data_dir=data_dir, **fields)


def lm_evals_instances(task_name: str, limit: float = LIMIT) -> list[tuple]:
    """lm-eval as released, from its own task config over the fixture files, as
    ``simple_evaluate(num_fewshot=2, limit=limit)`` builds the instances (a fraction of the
    documents: as many as its ``get_sample_size`` takes)."""
    from lm_eval.evaluator_utils import get_sample_size

    overrides = {}
    if task_name in GENERATION:
        overrides["generation_kwargs"] = generation_kwargs(task_name, MAX_GEN_TOKS)
    with lm_eval_as_released():
        loaded = task_manager().load([task_config(task_name, **overrides)])
        (task,) = loaded["tasks"].values()
        if task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=SHOTS)
        task.set_fewshot_seed(seed=1234)
        task.build_all_requests(limit=get_sample_size(task, limit), rank=0, world_size=1)
    return [
        (i.task_name, i.doc_id, i.idx, i.request_type, i.args, i.repeats, doc_hash(i.doc))
        for i in task.instances
    ]


def stored_instances(stored: dict[str, Any]) -> list[tuple]:
    rows = []
    for block in stored["tasks"].values():
        for document in block["documents"]:
            for request in document["requests"]:
                assert request["tuple"]
                args = tuple(
                    tuple(a) if isinstance(a, list) else a for a in request["arguments"]
                )  # JSON's lists are lm-eval's tuples
                rows.append(
                    (
                        block["task_name"],
                        document["doc_id"],
                        request["idx"],
                        request["request_type"],
                        args,
                        request["repeats"],
                        document["doc_hash"],
                    )
                )
    return rows


def as_hub_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests built from here on hash their documents, as those of a hub dataset (keyed by
    name) are: the fixtures are local files, whose fingerprint stands for their hashes."""
    monkeypatch.setattr(requests_module, "documents_keyed", lambda spec: False)


@pytest.mark.parametrize("task_name", TASKS + GENERATION)
def test_the_stored_requests_are_lm_evals_own_instances(
    task_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_hub_documents(monkeypatch)
    stored = stored_requests(spec_of(task_name, tmp_path))
    expected = lm_evals_instances(task_name)
    assert stored_instances(stored) == expected and len({row[1] for row in expected}) == LIMIT


def test_a_fraction_as_limit_takes_the_documents_lm_eval_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_hub_documents(monkeypatch)
    stored = stored_requests(spec_of("arc_easy", tmp_path, limit=0.3))
    expected = lm_evals_instances("arc_easy", limit=0.3)
    documents = len((FIXTURES / DATA_DIR["arc_easy"] / "test.jsonl").read_text().splitlines())
    assert len({row[1] for row in expected}) == math.ceil(0.3 * documents) != LIMIT
    assert stored_instances(stored) == expected


def instance_fields(task: Any) -> list[tuple]:
    return [
        (i.request_type, i.arguments, i.idx, i.metadata, i.doc, type(i.arguments))
        for i in task.instances
    ]


@pytest.mark.parametrize("task_name", ["arc_easy", "winogrande", "gsm8k"])
def test_requests_put_back_are_the_ones_the_task_builds(task_name: str, tmp_path: Path) -> None:
    spec = spec_of(task_name, tmp_path)
    stored = stored_requests(spec)
    built, restored = load_tasks(spec), load_tasks(spec)
    check_requests(spec, stored, restored)
    use_requests(restored, stored, documents_keyed=True)  # the fixtures are local files
    for task in restored["tasks"].values():  # nothing is built again
        task.construct_requests = task.fewshot_context = _not_called
    for loaded in (built, restored):
        for task in loaded["tasks"].values():
            task.set_fewshot_seed(seed=spec.fewshot_seed)
            task.build_all_requests(limit=LIMIT, rank=0, world_size=1)
    (name,) = built["tasks"]
    expected = instance_fields(built["tasks"][name])
    assert instance_fields(restored["tasks"][name]) == expected and expected


def _not_called(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a request was built again")


def test_local_documents_whose_fingerprint_matched_are_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of("copa", tmp_path, num_fewshot=SHOTS)
    stored = stored_requests(spec)
    (block,) = stored["tasks"].values()
    assert block["fewshot_hash"] is None and block["documents"]
    assert all(document["doc_hash"] is None for document in block["documents"])
    built, restored = load_tasks(spec), load_tasks(spec)
    check_requests(spec, stored, restored)  # the data directory's fingerprint among the fields
    use_requests(restored, stored, documents_keyed=True)
    monkeypatch.setattr(restoring_module, "doc_hash", _not_called)
    for task in restored["tasks"].values():
        task.construct_requests = task.fewshot_context = _not_called
    for loaded in (built, restored):
        loaded["tasks"]["copa"].set_fewshot_seed(seed=spec.fewshot_seed)
        loaded["tasks"]["copa"].build_all_requests(limit=LIMIT, rank=0, world_size=1)
    expected = instance_fields(built["tasks"]["copa"])
    assert instance_fields(restored["tasks"]["copa"]) == expected and expected


def test_its_key_is_the_task_configuration_not_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = shutil.copytree(FIXTURES / "copa", tmp_path / "copa")
    base = TaskSpec(name="copa", data_dir=str(data), num_fewshot=0, limit=4)

    def key(spec: TaskSpec = base) -> str:
        return TaskRequestsStep(task=spec).unique_id

    first = key()
    assert key(dataclasses.replace(base)) == first  # the same configuration
    variants = [
        dataclasses.replace(base, num_fewshot=2),
        dataclasses.replace(base, fewshot_seed=7),
        dataclasses.replace(base, limit=5),
        dataclasses.replace(base, limit=None),
        dataclasses.replace(base, system_instruction="Answer."),
        TaskSpec(name="copa", data_dir=str(FIXTURES / "copa"), num_fewshot=0, limit=4),
    ]
    keys = [first] + [key(spec) for spec in variants]
    assert len(set(keys)) == len(keys), keys
    validation = data / "validation.jsonl"
    lines = validation.read_text().splitlines()
    validation.write_text("\n".join(reversed(lines)) + "\n")  # the same path, other documents
    edited = key()
    assert edited not in keys
    monkeypatch.setattr(lm_eval_module, "lm_eval_version", lambda: "0.4.99")
    assert key() not in keys + [edited]


def test_requests_of_another_configuration_are_refused_in_one_line(tmp_path: Path) -> None:
    spec = spec_of("copa", tmp_path, num_fewshot=0)
    stored = stored_requests(spec)
    others = {
        "limit": dataclasses.replace(spec, limit=LIMIT + 1),
        "fewshot_seed": dataclasses.replace(spec, fewshot_seed=7),
        "data_dir": dataclasses.replace(
            spec, data_dir=str(shutil.copytree(spec.data_dir, tmp_path / "copa"))
        ),
        "label": spec_of("arc_easy", tmp_path),
    }
    for field, other in others.items():
        with pytest.raises(ConfigurationError) as error:
            check_requests(other, stored, load_tasks(other))
        message = str(error.value)
        assert "built for another task configuration" in message and f"{field} " in message
        assert "\n" not in message
    older = {**stored, "spec": dict(stored["spec"])}  # built before a field existed: its default
    del older["spec"]["fewshot_as_multiturn"]
    check_requests(spec, older, load_tasks(spec))
    with pytest.raises(ConfigurationError, match="fewshot_as_multiturn None"):
        check_requests(
            dataclasses.replace(spec, fewshot_as_multiturn=False), older, load_tasks(spec)
        )
    with pytest.raises(ConfigurationError, match="task_requests result"):
        check_requests(spec, {"tasks": {}}, load_tasks(spec))


@pytest.mark.parametrize(
    ("split", "warning"),
    [
        ("validation", "not the one its stored requests were built from"),
        ("train", "few-shot documents are not those its stored requests were built from"),
    ],
)
def test_documents_changed_under_cached_requests_are_built_again(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    split: str,
    warning: str,
) -> None:
    """As a hub dataset (keyed by name) may change under a cached requests result: the scored
    documents, or only those the few-shot examples are drawn from."""
    data = shutil.copytree(FIXTURES / "copa", tmp_path / "copa")
    spec = TaskSpec(name="copa", data_dir=str(data), limit=LIMIT, num_fewshot=SHOTS)
    as_hub_documents(monkeypatch)
    stored = stored_requests(spec)
    changed = data / f"{split}.jsonl"
    lines = changed.read_text().splitlines()
    changed.write_text("\n".join(reversed(lines)) + "\n")
    built, restored = load_tasks(spec), load_tasks(spec)
    use_requests(restored, stored)
    for loaded in (built, restored):
        loaded["tasks"]["copa"].build_all_requests(limit=LIMIT, rank=0, world_size=1)
    assert instance_fields(restored["tasks"]["copa"]) == instance_fields(built["tasks"]["copa"])
    assert warning in caplog.text


def test_chat_templated_tasks_are_refused(tmp_path: Path) -> None:
    spec = spec_of("copa", tmp_path, apply_chat_template=True)
    with pytest.raises(ConfigurationError, match="chat-templated prompts depend on the model"):
        TaskRequestsStep().run(task=spec)


def test_more_shots_than_the_few_shot_split_holds_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = spec_of("copa", tmp_path, num_fewshot=50)
    with pytest.raises(ConfigurationError, match="num_fewshot 50 needs more documents") as error:
        TaskRequestsStep().run(task=spec)
    assert "\n" not in str(error.value)


class RecordingLM(LM_BASE):
    """Answers every generation request with "" and keeps its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.arguments: list[tuple] = []

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> list[str]:
        self.arguments += [tuple(request.args) for request in requests]
        return ["" for _ in requests]

    def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> list:
        raise NotImplementedError

    def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> list:
        raise NotImplementedError


def test_gen_kwargs_are_laid_over_each_generation_task_as_lm_evals_gen_kwargs(
    tmp_path: Path,
) -> None:
    """``gen_kwargs`` (``tango-fairscale eval --gen_kwargs``): the requests stored are those
    ``lm_eval.simple_evaluate(gen_kwargs=...)`` asks its model for, and they are in the key."""
    import lm_eval

    gen_kwargs = {"max_gen_toks": 5, "until": ["Question:", "\n\n"], "do_sample": False}
    spec = spec_of("gsm8k", tmp_path, gen_kwargs=gen_kwargs)
    ours = sorted(row[4] for row in stored_instances(stored_requests(spec)))
    recording = RecordingLM()
    config = task_config("gsm8k", generation_kwargs=generation_kwargs("gsm8k", MAX_GEN_TOKS))
    with lm_eval_as_released():
        lm_eval.simple_evaluate(
            model=recording,
            tasks=[config],
            task_manager=task_manager(),
            num_fewshot=SHOTS,
            limit=LIMIT,
            gen_kwargs=dict(gen_kwargs),
            bootstrap_iters=0,
        )
    assert ours == sorted(recording.arguments) and len(ours) == LIMIT
    assert ours[0][1]["max_gen_toks"] == 5 and ours[0][1]["until"] == ["Question:", "\n\n"]
    plain = spec_of("gsm8k", tmp_path)
    assert det_hash(spec) != det_hash(plain)
    assert sorted(row[4] for row in stored_instances(stored_requests(plain))) != ours
