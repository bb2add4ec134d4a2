"""lm-eval's prompt templates compiled once and few-shot documents read in bulk
(``compat/lm_eval.py``): every fixture task's requests, two-shot, and its fine-tuning pairs are
the ones lm-eval builds as released; each template string is compiled once; lm-eval's strict
undefined names and its ``regex_replace`` filter still apply; a metric lm-eval would take from
Hugging Face ``evaluate`` (which runs the metric's script) is refused before it runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
from conftest import REPO_ROOT, lm_eval_as_released

from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.tasks.training_pairs import training_pairs

sys.path.insert(0, str(REPO_ROOT / "tests" / "fixtures" / "tasks"))
from lm_eval_fixtures import DATA_DIR, FIXTURES, TASKS, task_config  # noqa: E402


def requests_and_pairs(task_name: str) -> tuple[list, list]:
    spec = TaskSpec(name=task_name, data_dir=str(FIXTURES / DATA_DIR[task_name]), num_fewshot=2)
    task = load_tasks(spec, training=True)["tasks"][task_name]
    task.build_all_requests(limit=8, rank=0, world_size=1)
    requests = [(r.doc_id, r.idx, r.arguments) for r in task.instances]
    pairs = training_pairs(task, task_name) if task.has_training_docs() else []
    return requests, pairs


@pytest.mark.parametrize("task_name", TASKS)
def test_requests_and_pairs_equal_lm_evals_own(task_name: str) -> None:
    from lm_eval import utils
    from lm_eval.api.task import ConfigurableTask

    got = requests_and_pairs(task_name)
    assert getattr(utils.apply_template, "compiles_once", False)
    assert getattr(ConfigurableTask.fewshot_docs, "in_bulk", False)
    with lm_eval_as_released():
        assert not getattr(utils.apply_template, "compiles_once", False)
        assert not getattr(ConfigurableTask.fewshot_docs, "in_bulk", False)
        expected = requests_and_pairs(task_name)
        assert not getattr(utils.apply_template, "compiles_once", False)
        assert not getattr(ConfigurableTask.fewshot_docs, "in_bulk", False)
    assert got == expected and got[0]


def test_each_template_is_compiled_once_and_keeps_lm_evals_rules() -> None:
    from lm_eval import utils

    from tango_fairscale.compat.lm_eval import compile_templates_once

    compile_templates_once()
    compiled = utils.apply_template.compiled
    compiled.cache_clear()
    template = "{{ goal | regex_replace('a+', 'A') }}?"
    rendered = [utils.apply_template(template, {"goal": f"ba{'a' * i}b"}) for i in range(50)]
    assert rendered == ["bAb?"] * 50
    assert (compiled.cache_info().misses, compiled.cache_info().hits) == (1, 49)
    with pytest.raises(jinja2.UndefinedError):
        utils.apply_template("{{ missing }}", {"goal": "x"})


def test_request_building_bars_name_their_task(capsys: pytest.CaptureFixture[str]) -> None:
    spec = TaskSpec(name="piqa", data_dir=str(FIXTURES / DATA_DIR["piqa"]))
    task = load_tasks(spec)["tasks"]["piqa"]
    capsys.readouterr()
    task.build_all_requests(limit=4, rank=0, world_size=1)
    err = capsys.readouterr().err
    assert "piqa: building requests: 100%" in err and "\r  0%" not in err


@pytest.mark.parametrize(
    "metric",
    [{"metric": "f1", "hf_evaluate": True}, {"metric": "f1_from_a_script"}],
    ids=["marked hf_evaluate", "not lm-eval's"],
)
def test_a_metric_evaluate_would_load_as_a_script_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metric: dict[str, Any]
) -> None:
    """Hugging Face ``evaluate.load(name)`` runs ``./<name>/<name>.py`` of the working directory
    (else the hub's script): the task is refused in one line and nothing runs."""
    from tango.common.exceptions import ConfigurationError

    marker = tmp_path / "ran"
    for name in ("f1", "f1_from_a_script"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    config = task_config("piqa", metric_list=[metric])  # lm-eval's piqa over the fixture
    with pytest.raises(ConfigurationError) as error:
        load_tasks(TaskSpec(config=config))
    message = str(error.value)
    assert f"metric {metric['metric']!r}" in message and "\n" not in message, message
    assert not marker.exists()
