"""Cache keys across processes: the same command is the same steps in every process.

* the unique ids of a scoring step (a constructed model) and a train step (a ``Lazy`` model) do
  not depend on Python's hash seed (a pickled model held ``GenerationConfig``'s salted hash);
* through ``tango run`` (a rerun that starts no step: ``test_gpt2_piqa_runs.py``,
  ``test_eval_command.py``): ``configs/gpt2_piqa.jsonnet`` (``train_steps=0``) and
  ``configs/mc_suite.jsonnet`` on local task directories: another model on the same tasks in
  the same workspace starts no requests step (nor, with the same tokenizer, a tokens step);
  after a directory is overwritten in place, exactly the steps that read it run again; PIQA
  labels flipped in place give the new metrics.

The ids of steps whose files change in place, computed in this process, are
``tests/test_caching.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT
from test_caching import FIXTURE_TASKS, flip_labels, in_process_ids

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
def test_gpt2_piqa_reruns_start_no_step_until_the_model_changes(
    tmp_path: Path, tokenizer_dir: Path, piqa_dir: Path
) -> None:
    """Evaluation only (``train_steps=0``), then, in the same workspace, PIQA's labels flipped in
    place give the new metrics (:func:`rerun_after_labels_flipped_gives_the_new_metrics`). With
    a training step in the graph: its rerun in another process starts no step
    (``test_gpt2_piqa_runs.py``'s cached rerun), a model changed in place changes its id
    (``tests/test_caching.py``)."""
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
        "train_steps": "0",
        "limit": "8",
    }
    config, workspace = "configs/gpt2_piqa.jsonnet", tmp_path / "workspace"
    steps = {"piqa", "requests", "predictions", "metrics"}
    assert started(tango_run(config, workspace, defines, "1")) == steps
    # (The same command again starts no step: test_gpt2_piqa_runs.py's rerun of the graph with
    # training, in another process, with every step of this one.)
    save_tiny_gpt2(model_dir, tokenizer_dir, seed=2, n_positions=256)  # overwritten in place
    # another model on the same files: lm-eval's requests come from the cache
    output = tango_run(config, workspace, defines, "3", name="before")
    assert started(output) == steps - {"piqa", "requests"}
    rerun_after_labels_flipped_gives_the_new_metrics(config, workspace, defines, steps)


def rerun_after_labels_flipped_gives_the_new_metrics(
    config: str, workspace: Path, defines: dict[str, str], steps: set[str]
) -> None:
    """After run ``before``: the first 8 validation labels flipped in place (the same path, the
    same file names), the same command runs every step again and gives the new metrics. (That a
    rerun in another process starts no step is the first rerun's check.)"""
    from tango import Workspace

    flip_labels(Path(defines["data_dir"]) / "valid-labels.lst", 8)
    assert started(tango_run(config, workspace, defines, "4", name="after")) == steps
    results = Workspace.from_url(str(workspace))
    before, after = (results.step_result_for_run(run, "metrics") for run in ("before", "after"))
    assert after["num_examples"] == before["num_examples"] == 8
    for metric in ("acc", "acc_norm"):  # two choices: every answer is now wrong or right
        assert after[metric] == pytest.approx(1 - before[metric]), (before, after)


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
    steps = scores | {"requests_copa", "requests_arc_easy", "tokens_copa", "tokens_arc_easy"}
    assert started(tango_run(config, workspace, defines, "1")) == steps
    # (The same command again in another process starts no step: test_eval_command.py's rerun.)
    # a second model on the same suite and tokenizer: no request is built or tokenized again
    other = save_tiny_gpt2(tmp_path / "other-model", tokenizer_dir, seed=2, n_positions=256)
    assert started(tango_run(config, workspace, defines | {"model": str(other)}, "3")) == scores
    (tasks / "copa").unlink()  # the same path, other documents
    copa = shutil.copytree(FIXTURE_TASKS / "copa", tasks / "copa")
    lines = (copa / "validation.jsonl").read_text().splitlines()
    (copa / "validation.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    changed = {"requests_copa", "tokens_copa", "scores_copa", "metrics"}
    assert started(tango_run(config, workspace, defines, "4")) == changed
