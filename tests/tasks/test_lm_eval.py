"""Task specs loaded into lm-eval's own tasks (``tango_fairscale.tasks.lm_eval``): few-shot
examples drawn from the scored split never show a document in its own context, and the requests
equal those lm-eval itself builds on the same files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT
from lm_eval.api.model import LM

from tango_fairscale.evaluation.harness import evaluate_task, json_safe
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

sys.path.insert(0, str(REPO_ROOT / "tests" / "fixtures" / "tasks"))
from lm_eval_fixtures import DATA_DIR, FIXTURES, TASKS, task_config, task_manager  # noqa: E402


class LengthLM(LM):
    """Log-likelihoods without a model: minus each continuation's length (requests only)."""

    def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> list:
        return [(-float(len(request.args[1])), False) for request in requests]

    def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> list:
        return [0.0 for _ in requests]

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> list:
        raise NotImplementedError


def scored_split(task: str) -> str:
    return "test" if (FIXTURES / DATA_DIR[task] / "test.jsonl").is_file() else "validation"


def only_the_scored_split(task: str, directory: Path) -> Path:
    """A data directory holding only the split ``task`` scores (as many users have it)."""
    directory.mkdir(parents=True, exist_ok=True)
    split = scored_split(task)
    shutil.copy(FIXTURES / DATA_DIR[task] / f"{split}.jsonl", directory / f"{split}.jsonl")
    return directory


def own_document_draws(task: Any) -> tuple[int, int]:
    """(few-shot draws holding the document being scored, contexts built) while ``task``'s
    requests are built: the sampler's draws, watched document by document."""
    counts = {"leaks": 0, "contexts": 0}
    current: dict[str, Any] = {}
    build_context, sample = task.fewshot_context, task.sampler.sample

    def fewshot_context(doc: Any, *args: Any, **kwargs: Any) -> Any:
        current["doc"] = doc
        counts["contexts"] += 1
        return build_context(doc, *args, **kwargs)

    def watched_sample(*args: Any, **kwargs: Any) -> Any:
        drawn = sample(*args, **kwargs)
        counts["leaks"] += sum(example == current["doc"] for example in drawn)
        return drawn

    task.fewshot_context, task.sampler.sample = fewshot_context, watched_sample
    task.build_all_requests(limit=None, rank=0, world_size=1)
    return counts["leaks"], counts["contexts"]


@pytest.mark.parametrize("task_name", TASKS)
def test_no_document_is_a_few_shot_example_in_its_own_context(
    task_name: str, tmp_path: Path
) -> None:
    data_dir = only_the_scored_split(task_name, tmp_path)
    spec = TaskSpec(name=task_name, data_dir=str(data_dir), num_fewshot=3)
    task = load_tasks(spec)["tasks"][task_name]
    task.set_fewshot_seed(seed=spec.fewshot_seed)
    leaks, contexts = own_document_draws(task)
    assert contexts == len(task.eval_docs) and leaks == 0


def test_a_few_shot_split_named_as_the_validation_split_scored_leaves_the_document_out() -> None:
    # lm-eval leaves the document out only when the few-shot split equals test_split (None here).
    config = {**task_config("piqa"), "fewshot_split": "validation"}
    spec = TaskSpec(config=config, data_dir=str(FIXTURES / "piqa"), num_fewshot=3)
    task = load_tasks(spec)["tasks"]["piqa"]
    task.set_fewshot_seed(seed=spec.fewshot_seed)
    leaks, contexts = own_document_draws(task)
    assert contexts == len(task.eval_docs) == 26 and leaks == 0


def lm_eval_on_the_same_files(task: str, num_fewshot: int) -> dict:
    """lm-eval itself (``simple_evaluate``) on its own task reading only the scored split's file:
    the splits the file does not hold unset, and for a task that scores its test split, that
    split named as the few-shot split (lm-eval's form for drawing examples from it)."""
    import lm_eval

    split = scored_split(task)
    data_file = str(FIXTURES / DATA_DIR[task] / f"{split}.jsonl")
    config = task_config(task, dataset_kwargs={"data_files": {split: data_file}})
    config.update(training_split=None, fewshot_split=None)
    if split == "test":
        config.update(validation_split=None, fewshot_split="test")
    return lm_eval.simple_evaluate(
        model=LengthLM(),
        tasks=[config],
        task_manager=task_manager(),
        num_fewshot=num_fewshot,
        bootstrap_iters=0,
        log_samples=True,
    )


@pytest.mark.parametrize("task_name", TASKS)
def test_requests_from_the_scored_split_alone_equal_lm_evals(
    task_name: str, tmp_path: Path
) -> None:
    expected = lm_eval_on_the_same_files(task_name, num_fewshot=2)
    data_dir = only_the_scored_split(task_name, tmp_path)
    split = scored_split(task_name)
    data_file = data_dir / f"{split}.jsonl"
    spec = TaskSpec(name=task_name, data_dir=str(data_dir), num_fewshot=2)
    got = evaluate_task(LengthLM(), spec, bootstrap_iters=0)
    want = {s["doc_id"]: [list(a) for a in s["arguments"]] for s in expected["samples"][task_name]}
    have = {s["doc_id"]: s["arguments"] for s in got["samples"][task_name]}
    assert have == want and len(have) >= 24
    metrics = {k: v for k, v in expected["results"][task_name].items() if "," in k}
    assert {k: got["results"][task_name][k] for k in metrics} == metrics
    assert shown(got["configs"][task_name]) == shown(json_safe(expected["configs"][task_name]))
    assert got["configs"][task_name]["custom_dataset"] == {"files": {split: str(data_file)}}


def shown(config: dict) -> dict:
    """A task config as a results file shows it, but where the data is read from and the
    addresses of its functions."""
    import re

    kept = {k: v for k, v in config.items() if "dataset" not in k and "split" not in k}
    return json.loads(re.sub(r" at 0x[0-9a-f]+", "", json.dumps(kept)))


def test_a_steps_dataset_is_taken_as_it_is(piqa_small: Any) -> None:
    """A ``dataset`` that is a step's result (Tango builds the spec when the step runs) is the
    result itself: not deep-copied, not written out in a debug message (PIQA's: 0.5 s)."""
    from tango.common import Params

    spec = TaskSpec.from_params(Params({"name": "piqa", "dataset": piqa_small, "limit": 3}))
    assert spec.dataset is piqa_small and spec.limit == 3
    assert spec == TaskSpec(name="piqa", dataset=piqa_small, limit=3)


def instance_args(task: Any) -> list[tuple]:
    task.build_all_requests(limit=4, rank=0, world_size=1)
    return [(i.doc_id, i.idx, i.args) for i in task.instances]


def test_a_name_in_an_include_path_loads_as_lm_evals_include_path_loads_it(tmp_path) -> None:
    """``include_path`` (lm_eval's ``--include_path``): a task of the folder's own YAMLs, found by
    name before lm-eval's (``copa`` there is that file's), gives the requests lm-eval's
    ``TaskManager(include_path=...)`` builds; its YAML is in the spec's key."""
    from lm_eval_fixtures import write_task_yaml
    from tango.common.det_hash import det_hash

    folder = tmp_path / "custom"
    for name in ("my_copa", "copa"):
        write_task_yaml("copa", folder, name=name)
    for name in ("my_copa", "copa"):
        spec = TaskSpec(name=name, include_path=str(folder), num_fewshot=0)
        assert spec.yaml_file == str((folder / f"{name}.yaml").resolve())
        ours = load_tasks(spec)["tasks"][name]
        theirs = task_manager_with(folder).load([name])["tasks"][name]
        theirs.set_config(key="num_fewshot", value=0)
        assert instance_args(ours) == instance_args(theirs) != []
    before = det_hash(TaskSpec(name="my_copa", include_path=str(folder)))
    with open(folder / "my_copa.yaml", "a") as yaml_file:
        yaml_file.write("metadata: {version: 2.0}\n")
    assert det_hash(TaskSpec(name="my_copa", include_path=str(folder))) != before
    (tmp_path / "empty").mkdir()  # lm-eval's copa, but the folder is in the key
    elsewhere = TaskSpec(name="copa", include_path=str(tmp_path / "empty"))
    assert elsewhere.yaml_file is None and det_hash(elsewhere) != det_hash(TaskSpec(name="copa"))


def task_manager_with(folder: Path) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(folder), include_defaults=False)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        (
            "my_cpoa",
            "unknown lm-eval task 'my_cpoa', in include_path {folder} or lm-eval's own; "
            "did you mean 'my_copa'",
        ),
        ("my_group", "'my_group' is a group in include_path {folder}: only its task YAMLs are"),
        ("arc_easy", None),  # lm-eval's own, where the folder has none of that name
    ],
)
def test_an_include_path_name_is_refused_in_one_line(tmp_path, name, fragment) -> None:
    from lm_eval_fixtures import write_task_yaml
    from tango.common.exceptions import ConfigurationError

    folder = tmp_path / "custom"
    write_task_yaml("copa", folder, name="my_copa")
    (folder / "group.yaml").write_text("group: my_group\ntask: [my_copa]\n")
    if fragment is None:
        assert TaskSpec(name=name, include_path=str(folder)).yaml_file is None
        return
    with pytest.raises(ConfigurationError) as error:
        TaskSpec(name=name, include_path=str(folder))
    assert fragment.format(folder=folder) in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigurationError, match="include_path '/no/such' is not a directory"):
        TaskSpec(name="my_copa", include_path="/no/such")
