"""Cache keys: a model or task data directory changed in place is computed again.

* overwriting a model directory or a task's data directory in place changes the ids of the steps
  that read it, and only theirs; so does editing in place any other local file a step reads: a
  PIQA file, a file a task ``config`` or YAML names in ``dataset_kwargs.data_files`` (a string, a
  list, a split → path or split → list mapping, a glob), a local ``dataset_path`` directory, an
  included YAML, a ``!function`` module (beside the YAML or on ``sys.path``); a task config's
  labels flipped in place and scored again through a workspace give the new metrics;
* lm-eval's version is in the key of every step that reads a task; precision ``auto`` is keyed
  as what it resolves for on this machine (a GPU's or a CPU's); a model config that takes a
  step's result is still keyed by its directory's files;
* a task's requests step (``task_requests``) does not depend on the model: its id stays when
  the model changes and changes with every local file the task reads.

The same command in other processes (another hash seed, ``tango run`` reruns) is
``tests/integration/commands/test_cache_reruns.py``.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tango import Step

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_TASKS = REPO_ROOT / "tests" / "fixtures" / "tasks"


def in_process_ids(model_dir: Path, task_dir: Path, precision: str | None = None) -> dict[str, str]:
    """The ids of a training, a scores and a requests step; ``precision`` given to the engine
    and the scores step (else the engine's default, ``auto``, and the step's, ``32-true``)."""
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainingEngine

    from tango_fairscale.evaluation.steps import TaskScoresStep
    from tango_fairscale.model.causal_lm import ModelWrapper
    from tango_fairscale.tasks.lm_eval import TaskSpec
    from tango_fairscale.tasks.requests import TaskRequestsStep
    from tango_fairscale.train.step import TrainStep

    task = TaskSpec(name="piqa", data_dir=str(task_dir))
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine = {"type": "tango_fairscale::ddp", "optimizer": {"type": "torch::AdamW"}}
    chosen = {} if precision is None else {"precision": precision}
    train = TrainStep(
        model=model,
        engine=Lazy(TrainingEngine, Params({**engine, **chosen})),
        task=task,
        train_steps=2,
    )
    scores = TaskScoresStep(model=ModelWrapper(str(model_dir)), task=task, **chosen)
    requests = TaskRequestsStep(task=task)
    return {"train": train.unique_id, "scores": scores.unique_id, "requests": requests.unique_id}


def test_a_model_directory_changed_in_place_changes_the_step_ids(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from conftest import save_tiny_gpt2

    model_dir = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, seed=1)
    task_dir = shutil.copytree(FIXTURE_TASKS / "piqa", tmp_path / "piqa")
    before = in_process_ids(model_dir, task_dir)
    assert in_process_ids(model_dir, task_dir) == before
    save_tiny_gpt2(model_dir, tokenizer_dir, seed=2)  # other weights, same shapes, same path
    after = in_process_ids(model_dir, task_dir)
    assert after["train"] != before["train"] and after["scores"] != before["scores"]
    assert after["requests"] == before["requests"]  # the requests do not depend on the model


def test_a_task_data_directory_changed_in_place_changes_the_step_ids(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    task_dir = shutil.copytree(FIXTURE_TASKS / "piqa", tmp_path / "piqa")
    before = in_process_ids(tiny_model_dir, task_dir)
    validation = task_dir / "validation.jsonl"
    lines = validation.read_text().splitlines()
    validation.write_text("\n".join(lines[1:]) + "\n")  # one document fewer, same mtime or not
    after = in_process_ids(tiny_model_dir, task_dir)
    assert after["train"] != before["train"] and after["scores"] != before["scores"]
    assert after["requests"] != before["requests"]


def test_lm_evals_version_changes_the_ids_of_the_steps_that_read_a_task(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lm-eval's task definitions and prompt code build every step's requests or pairs."""
    from tango_fairscale.tasks import lm_eval as lm_eval_module

    task_dir = shutil.copytree(FIXTURE_TASKS / "piqa", tmp_path / "piqa")
    before = in_process_ids(tiny_model_dir, task_dir)
    monkeypatch.setattr(lm_eval_module, "lm_eval_version", lambda: "0.4.99")
    after = in_process_ids(tiny_model_dir, task_dir)
    assert all(after[step] != before[step] for step in before), (before, after)


@pytest.mark.parametrize("precision", [None, "auto", "32-true", "bf16-mixed"])
def test_precision_auto_is_keyed_as_the_precision_it_means_on_this_machine(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, precision: str | None
) -> None:
    """``auto`` (the engine's default) is bf16-mixed on a GPU and 32-true on a CPU: a result of
    one kind of machine is not served on the other; a precision named outright is."""
    import torch

    task_dir = shutil.copytree(FIXTURE_TASKS / "piqa", tmp_path / "piqa")
    on_cpu = in_process_ids(tiny_model_dir, task_dir, precision)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_gpu = in_process_ids(tiny_model_dir, task_dir, precision)
    assert on_gpu["requests"] == on_cpu["requests"]
    means_the_machines = precision in (None, "auto")
    assert (on_gpu["train"] != on_cpu["train"]) is means_the_machines
    assert (on_gpu["scores"] != on_cpu["scores"]) is (precision == "auto")


@Step.register("tests::model_seed", exist_ok=True)
class ModelSeed(Step):
    """A step whose result a model config takes (its ``seed``)."""

    def run(self, seed: int) -> int:  # type: ignore[override]
        return seed


def test_a_model_config_holding_a_steps_result_is_keyed_by_its_files(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """A model config that takes a step's result is built when the step runs; its directory's
    weights, changed in place, still change the scores step's id."""
    from conftest import save_tiny_gpt2
    from tango import StepGraph

    model_dir = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, seed=1)
    task = {"name": "piqa", "data_dir": str(FIXTURE_TASKS / "piqa")}
    model = {"type": "tango_fairscale::causal_lm", "model": str(model_dir)}

    def scores_ids() -> tuple[str, str]:
        graph = StepGraph.from_params(
            {
                "seed": {"type": "tests::model_seed", "seed": 0},
                "given": {"type": "tango_fairscale::task_scores", "model": model, "task": task},
                "from_a_step": {
                    "type": "tango_fairscale::task_scores",
                    "model": {**model, "seed": {"type": "ref", "ref": "seed"}},
                    "task": task,
                },
            }
        )
        return graph["given"].unique_id, graph["from_a_step"].unique_id

    before = scores_ids()
    assert scores_ids() == before
    save_tiny_gpt2(model_dir, tokenizer_dir, seed=2)  # other weights, same shapes, same path
    after = scores_ids()
    assert after[0] != before[0] and after[1] != before[1]


# Every kind of local file a step reads, edited in place ----------------------------------------

#: lm-eval's ``piqa`` task as a config of one's own, over local files (``dataset_kwargs`` added).
PIQA_CONFIG = {
    "task": "my_piqa",
    "dataset_path": "json",
    "output_type": "multiple_choice",
    "doc_to_text": "Question: {{goal}}\nAnswer:",
    "doc_to_choice": "{{[sol1, sol2]}}",
    "doc_to_target": "label",
    "test_split": "test",
    "metric_list": [{"metric": "acc"}],
}

PIQA_YAML = """task: my_piqa
dataset_path: json
output_type: multiple_choice
doc_to_choice: "{{[sol1, sol2]}}"
doc_to_target: label
test_split: test
metric_list: [{metric: acc}]
"""


def drop_first_line(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[1:]))


def replace_text(old: str, new: str):
    def edit(path: Path) -> None:
        path.write_text(path.read_text().replace(old, new))

    return edit


def config_task(dataset: dict[str, Any]) -> dict[str, Any]:
    return {"config": {**PIQA_CONFIG, **dataset}}


def yaml_task(path: Path, text: str) -> dict[str, Any]:
    path.write_text(PIQA_YAML + text)
    return {"yaml": str(path)}


def local_file_kinds(root: Path) -> dict[str, tuple[dict[str, Any], Path, Callable[[Path], None]]]:
    """Kind → (the task's params, a file it reads, an in-place edit of that file); under
    ``root``, which holds ``data/test.jsonl`` and ``data/train.jsonl`` (PIQA documents)."""
    data = root / "data"
    test = data / "test.jsonl"
    train = {"test_split": "train"}
    (root / "base.yaml").write_text('doc_to_text: "Question: {{goal}}\\nAnswer:"\n')
    (root / "utils.py").write_text("def text(doc):\n    return f\"Question: {doc['goal']}\"\n")
    (root / "lib").mkdir()  # on sys.path: lm-eval imports a module not beside the YAML from it
    shutil.copy(root / "utils.py", root / "lib" / "piqa_prompts.py")
    by_split = {"data_files": {"test": str(test)}}
    yaml_data = f"dataset_kwargs: {{data_files: {{test: {test}}}}}\n"
    tasks = {
        # datasets names the split of a path or list "train"
        "data_files: a path": config_task({"dataset_kwargs": {"data_files": str(test)}, **train}),
        "data_files: a list": config_task({"dataset_kwargs": {"data_files": [str(test)]}, **train}),
        "data_files: split -> path": config_task({"dataset_kwargs": by_split}),
        "data_files: split -> list": config_task(
            {"dataset_kwargs": {"data_files": {"test": [str(test)]}}}
        ),
        "data_files: a glob": config_task(
            {"dataset_kwargs": {"data_files": {"test": str(data / "te*.jsonl")}}}
        ),
        "dataset_path: a directory": config_task({"dataset_path": str(data)}),
        "a YAML's data_files": yaml_task(root / "a.yaml", yaml_data + "include: base.yaml\n"),
        "an included YAML": yaml_task(root / "b.yaml", yaml_data + "include: base.yaml\n"),
        "a !function module": yaml_task(
            root / "c.yaml", yaml_data + "doc_to_text: !function utils.text\n"
        ),
        "a !function module on sys.path": yaml_task(
            root / "d.yaml", yaml_data + "doc_to_text: !function piqa_prompts.text\n"
        ),
    }
    edits = {
        "dataset_path: a directory": (data / "train.jsonl", drop_first_line),
        "an included YAML": (root / "base.yaml", replace_text("Answer", "A")),
        "a !function module": (root / "utils.py", replace_text("Question", "Q")),
        "a !function module on sys.path": (
            root / "lib" / "piqa_prompts.py",
            replace_text("Question", "Q"),
        ),
    }
    return {kind: (task, *edits.get(kind, (test, drop_first_line))) for kind, task in tasks.items()}


KINDS = [
    "data_files: a path",
    "data_files: a list",
    "data_files: split -> path",
    "data_files: split -> list",
    "data_files: a glob",
    "dataset_path: a directory",
    "a YAML's data_files",
    "an included YAML",
    "a !function module",
    "a !function module on sys.path",
]


@pytest.fixture(scope="module")
def scoring_model(tiny_model_dir: Path):
    from tango_fairscale.model.causal_lm import ModelWrapper

    return ModelWrapper(str(tiny_model_dir))


def scores_id(model: Any, task: dict[str, Any]) -> str:
    from tango.common import Params

    from tango_fairscale.evaluation.steps import TaskScoresStep
    from tango_fairscale.tasks.lm_eval import TaskSpec

    spec = TaskSpec.from_params(Params(copy.deepcopy(task)))  # as a config gives it
    return TaskScoresStep(model=model, task=spec).unique_id


def requests_id(task: dict[str, Any]) -> str:
    from tango.common import Params

    from tango_fairscale.tasks.lm_eval import TaskSpec
    from tango_fairscale.tasks.requests import TaskRequestsStep

    return TaskRequestsStep(task=TaskSpec.from_params(Params(copy.deepcopy(task)))).unique_id


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_a_task_names_changed_in_place_changes_the_step_id(
    tmp_path: Path, scoring_model: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(FIXTURE_TASKS / "piqa" / "validation.jsonl", data / "test.jsonl")
    shutil.copy(FIXTURE_TASKS / "piqa" / "train.jsonl", data / "train.jsonl")
    task, path, edit = local_file_kinds(tmp_path)[kind]
    before = scores_id(scoring_model, task), requests_id(task)
    assert (scores_id(scoring_model, task), requests_id(task)) == before
    edit(path)
    after = scores_id(scoring_model, task), requests_id(task)
    assert after[0] != before[0] and after[1] != before[1]


def test_piqa_files_changed_in_place_change_the_step_ids(
    tmp_path: Path, piqa_dir: Path, scoring_model: Any
) -> None:
    from tango_fairscale.tasks.piqa import PIQA_FILES, PiqaDataStep

    data_dir = tmp_path / "piqa"
    data_dir.mkdir()
    for name in PIQA_FILES:
        shutil.copy(piqa_dir / name, data_dir / name)

    def ids() -> tuple[str, str]:
        piqa = PiqaDataStep(data_dir=str(data_dir), limit=8)
        task = {"name": "piqa", "dataset": piqa}
        return piqa.unique_id, scores_id(scoring_model, task)

    before = ids()
    assert ids() == before
    flip_labels(data_dir / "valid-labels.lst", 8)
    after = ids()
    assert after[0] != before[0] and after[1] != before[1]


def flip_labels(path: Path, count: int) -> None:
    """Flip the first ``count`` labels of a PIQA ``.lst`` file in place."""
    labels = path.read_text().splitlines()
    flipped = [str(1 - int(label)) for label in labels[:count]] + labels[count:]
    path.write_text("\n".join(flipped) + "\n")


def test_a_task_config_rescored_after_its_data_files_changed_in_place(
    tmp_path: Path, scoring_model: Any
) -> None:
    """The README's ``{config: {..., dataset_kwargs: {data_files: {test: ...}}}}``: the labels
    flipped in place, scoring again through the workspace gives the new metrics."""
    from tango.common import Params
    from tango.workspaces import LocalWorkspace

    from tango_fairscale.evaluation.steps import TaskScoresStep
    from tango_fairscale.tasks.lm_eval import TaskSpec

    test = tmp_path / "test.jsonl"
    shutil.copy(FIXTURE_TASKS / "piqa" / "validation.jsonl", test)
    task = config_task({"dataset_kwargs": {"data_files": {"test": str(test)}}})
    workspace = LocalWorkspace(tmp_path / "workspace")

    def accuracy() -> float:
        spec = TaskSpec.from_params(Params(copy.deepcopy(task)))
        scores = TaskScoresStep(model=scoring_model, task=spec).result(workspace)
        return scores["results"]["my_piqa"]["acc,none"]

    before = accuracy()
    assert before != 0.5  # else 1 - before would not tell a stale result
    documents = [json.loads(line) for line in test.read_text().splitlines()]
    test.write_text("".join(json.dumps({**d, "label": 1 - d["label"]}) + "\n" for d in documents))
    assert accuracy() == pytest.approx(1 - before)
