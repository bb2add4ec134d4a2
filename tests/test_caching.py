"""Cache keys: the same command is the same steps in every process, and a model or task data
directory changed in place is computed again.

* the unique ids of a scoring step (a constructed model) and a train step (a ``Lazy`` model) do
  not depend on Python's hash seed (a pickled model held ``GenerationConfig``'s salted hash);
* overwriting a model directory or a task's data directory in place changes the ids of the steps
  that read it, and only theirs; so does editing in place any other local file a step reads: a
  PIQA file, a file a task ``config`` or YAML names in ``dataset_kwargs.data_files`` (a string, a
  list, a split → path or split → list mapping, a glob), a local ``dataset_path`` directory, an
  included YAML, a ``!function`` module; a task config's labels flipped in place and scored
  again through a workspace give the new metrics;
* a task's requests step (``task_requests``) does not depend on the model: its id stays when
  the model changes and changes with every local file the task reads;
* (slow) through ``tango run``: ``configs/gpt2_piqa.jsonnet`` (``train_steps=0`` and ``2``) and
  ``configs/mc_suite.jsonnet`` (local task directories) rerun under another hash seed start no
  step; another model on the same tasks in the same workspace starts no requests step; after a
  directory is overwritten in place, exactly the steps that read it run again;
  PIQA labels flipped in place give the new metrics.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_TASKS = REPO_ROOT / "tests" / "fixtures" / "tasks"

STEP_IDS = """
import json, sys
from tango.common import Lazy, Params
from tango.integrations.torch import Model, TrainingEngine
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.tasks.requests import TaskRequestsStep
from tango_fairscale.train.step import TrainStep
import tango_fairscale.parallel.ddp
model_dir, task_dir = sys.argv[1:]
task = TaskSpec(name="piqa", data_dir=task_dir)
scores = TaskScoresStep(model=ModelWrapper(model_dir), task=task)
engine = {"type": "tango_fairscale::ddp", "optimizer": {"type": "torch::AdamW"}}
train = TrainStep(
    model=Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": model_dir})),
    engine=Lazy(TrainingEngine, Params(engine)), task=task, train_steps=2,
)
requests = TaskRequestsStep(task=task)
print(json.dumps([scores.unique_id, train.unique_id, requests.unique_id, hash("hash seed")]))
"""


def step_ids(model_dir: Path, task_dir: Path, hash_seed: str) -> list[Any]:
    """The unique ids of a scoring, a train and a requests step over ``model_dir``, then the hash
    of a string (which tells the hash seed), computed in a fresh process with
    ``PYTHONHASHSEED=hash_seed``."""
    done = subprocess.run(
        [sys.executable, "-c", STEP_IDS, str(model_dir), str(task_dir)],
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_step_ids_do_not_depend_on_the_hash_seed(tiny_model_dir: Path) -> None:
    """A fresh process with one hash seed and this one with another (one interpreter started,
    not two): the same ids."""
    task_dir = FIXTURE_TASKS / "piqa"
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    *there, there_hash = step_ids(tiny_model_dir, task_dir, seed)
    assert there_hash != hash("hash seed")  # the two processes' hash seeds differ
    here = in_process_ids(tiny_model_dir, task_dir)
    assert there == [here["scores"], here["train"], here["requests"]]


def in_process_ids(model_dir: Path, task_dir: Path) -> dict[str, str]:
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
    train = TrainStep(
        model=model, engine=Lazy(TrainingEngine, Params(engine)), task=task, train_steps=2
    )
    scores = TaskScoresStep(model=ModelWrapper(str(model_dir)), task=task)
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
    }
    edits = {
        "dataset_path: a directory": (data / "train.jsonl", drop_first_line),
        "an included YAML": (root / "base.yaml", replace_text("Answer", "A")),
        "a !function module": (root / "utils.py", replace_text("Question", "Q")),
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
    tmp_path: Path, scoring_model: Any, kind: str
) -> None:
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


# Through tango run (slow) ------------------------------------------------------------------------


def tango_run(
    config: str, workspace: Path, defines: dict[str, str], hash_seed: str, name: str | None = None
) -> str:
    """``tango run config -w workspace [-n name] -D ...`` from the repository root; its output."""
    command = [sys.executable, "-m", "tango", "run", config, "-w", str(workspace)]
    command += ["-n", name] if name is not None else []
    for name, value in defines.items():
        command += ["-D", f"{name}={value}"]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def started(output: str) -> set[str]:
    """The steps a ``tango run`` output says it started."""
    return {line.split('"')[1] for line in output.splitlines() if 'Starting step "' in line}


@pytest.mark.slow
@pytest.mark.parametrize("train_steps", ["0", "2"])
def test_gpt2_piqa_reruns_start_no_step_until_the_model_changes(
    tmp_path: Path, tokenizer_dir: Path, piqa_dir: Path, train_steps: str
) -> None:
    """Evaluation only (``0``) goes on in the same workspace: PIQA's labels flipped in place
    give the new metrics (:func:`rerun_after_labels_flipped_gives_the_new_metrics`)."""
    from conftest import save_tiny_gpt2

    from tango_fairscale.tasks.piqa import PIQA_FILES

    model_dir = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, seed=1, n_positions=256)
    data_dir = tmp_path / "piqa"  # a copy: the labels test below edits it in place
    data_dir.mkdir()
    for name in PIQA_FILES:
        shutil.copy(piqa_dir / name, data_dir / name)
    defines = {
        "model": str(model_dir),
        "data_dir": str(data_dir),
        "train_steps": train_steps,
        "limit": "8",
        "engine": "ddp",
        "batch_size": "4",
        "validate_every": "2",
    }
    config, workspace = "configs/gpt2_piqa.jsonnet", tmp_path / "workspace"
    steps = {"piqa", "requests", "predictions", "metrics"} | (
        {"trained_model"} if train_steps != "0" else set()
    )
    assert started(tango_run(config, workspace, defines, "1")) == steps
    assert started(tango_run(config, workspace, defines, "2")) == set()
    save_tiny_gpt2(model_dir, tokenizer_dir, seed=2, n_positions=256)  # overwritten in place
    # another model on the same files: lm-eval's requests come from the cache
    output = tango_run(config, workspace, defines, "3", name="before")
    assert started(output) == steps - {"piqa", "requests"}
    if train_steps == "0":
        rerun_after_labels_flipped_gives_the_new_metrics(config, workspace, defines, steps)


def rerun_after_labels_flipped_gives_the_new_metrics(
    config: str, workspace: Path, defines: dict[str, str], steps: set[str]
) -> None:
    """After run ``before``: the first 8 validation labels flipped in place (the same path, the
    same file names), the same command runs every step again and gives the new metrics; once
    more, it starts no step."""
    from tango import Workspace

    flip_labels(Path(defines["data_dir"]) / "valid-labels.lst", 8)
    assert started(tango_run(config, workspace, defines, "4", name="after")) == steps
    results = Workspace.from_url(str(workspace))
    before, after = (results.step_result_for_run(run, "metrics") for run in ("before", "after"))
    assert after["num_examples"] == before["num_examples"] == 8
    for metric in ("acc", "acc_norm"):  # two choices: every answer is now wrong or right
        assert after[metric] == pytest.approx(1 - before[metric]), (before, after)
    assert started(tango_run(config, workspace, defines, "5")) == set()


@pytest.mark.slow
def test_mc_suite_reruns_start_no_step_until_a_task_directory_changes(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from conftest import save_tiny_gpt2

    model_dir = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, n_positions=256)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for task in ("copa", "arc_easy"):
        (tasks / task).symlink_to(FIXTURE_TASKS / task, target_is_directory=True)
    defines = {
        "model": str(model_dir),
        "tasks": "copa,arc_easy",
        "task_data_dir": str(tasks),
        "train_steps": "0",
        "limit": "8",
    }
    config, workspace = "configs/mc_suite.jsonnet", tmp_path / "workspace"
    scores = {"scores_copa", "scores_arc_easy", "metrics"}
    steps = scores | {"requests_copa", "requests_arc_easy"}
    assert started(tango_run(config, workspace, defines, "1")) == steps
    assert started(tango_run(config, workspace, defines, "2")) == set()
    # a second model on the same suite: no request is built again
    other = save_tiny_gpt2(tmp_path / "other-model", tokenizer_dir, seed=2, n_positions=256)
    assert started(tango_run(config, workspace, defines | {"model": str(other)}, "3")) == scores
    (tasks / "copa").unlink()  # the same path, other documents
    copa = shutil.copytree(FIXTURE_TASKS / "copa", tasks / "copa")
    lines = (copa / "validation.jsonl").read_text().splitlines()
    (copa / "validation.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    changed = {"requests_copa", "scores_copa", "metrics"}
    assert started(tango_run(config, workspace, defines, "4")) == changed
