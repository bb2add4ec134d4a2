"""A local workspace's files run no code when Tango reads them (``compat/tango_workspace.py``).

* a step record in ``stepinfo.sqlite`` naming any global outside the allow-list (every hostile
  global of ``helpers.hostile_pickles``) is refused in one line, and Tango's own records read
  back as Tango's classes;
* version-1 step records (``stepinfo.dill``, which Tango unpickles to upgrade a workspace) are
  refused;
* a cached result is read by its step's own format, whatever ``cache-metadata.json`` names (here:
  Tango's ``DillFormat`` over a planted pickle);
* the evaluation steps store JSON that is read as data (Tango's ``JsonFormat`` calls the class a
  ``_dataclass`` entry names).
"""

from __future__ import annotations

import json
import pickle
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers.hostile_pickles import DANGEROUS, calling_pickle, hostile_globals
from tango import Step
from tango.common.exceptions import ConfigurationError
from tango.step_info import StepInfo, StepState
from tango.workspaces import LocalWorkspace

from tango_fairscale.compat.tango_workspace import _decode_step_info
from tango_fairscale.evaluation.steps import TaskMetricsStep, TaskScoresStep
from tango_fairscale.results.step_infos import ALLOWED_GLOBALS
from tango_fairscale.tasks.format import JsonDataFormat


@Step.register("tests::json_result", exist_ok=True)
class JsonResultStep(Step[Any]):
    """A cacheable step whose result is JSON, stored by the package's format."""

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = JsonDataFormat()

    def run(self, value: int) -> Any:  # type: ignore[override]
        return {"value": value, "nested": [1.5, "text"]}


def run_once(directory: Path) -> JsonResultStep:
    """A :class:`JsonResultStep` run and cached in a local workspace at ``directory``."""
    step = JsonResultStep(value=3)
    assert step.result(LocalWorkspace(directory)) == {"value": 3, "nested": [1.5, "text"]}
    return step


def plant_step_record(directory: Path, unique_id: str, data: bytes) -> None:
    with sqlite3.connect(directory / "stepinfo.sqlite") as database:
        database.execute('UPDATE "unnamed" SET value = ? WHERE key = ?', (data, unique_id))


def test_tangos_own_step_records_read_back(tmp_path: Path) -> None:
    step = run_once(tmp_path)
    info = LocalWorkspace(tmp_path).step_info(step)
    assert isinstance(info, StepInfo) and info.state == StepState.COMPLETED
    assert info.unique_id == step.unique_id and info.end_time is not None


def test_a_planted_step_record_is_refused_in_one_line(tmp_path: Path) -> None:
    step = run_once(tmp_path)
    marker = tmp_path / "ran"
    plant_step_record(tmp_path, step.unique_id, calling_pickle("os", "system", marker))
    with pytest.raises(ConfigurationError) as error:
        LocalWorkspace(tmp_path).step_info(step)
    assert "names os.system" in str(error.value) and "\n" not in str(error.value)
    assert not marker.exists()


def test_a_record_planted_while_a_run_waits_for_the_steps_lock_is_refused(tmp_path: Path) -> None:
    """The state read again once the lock is taken goes through the same allow-list."""
    from tango_fairscale.compat.tango_locks import _record_start

    step = JsonResultStep(value=4)
    workspace = LocalWorkspace(tmp_path)
    workspace.step_info(step)  # recorded, as a run records it before it waits for the lock
    marker = tmp_path / "ran"
    plant_step_record(tmp_path, step.unique_id, calling_pickle("os", "system", marker))
    with pytest.raises(ConfigurationError, match="names os.system"):
        _record_start(workspace, step)
    assert not marker.exists()


def test_every_hostile_global_in_a_step_record_is_refused(tmp_path: Path) -> None:
    checked = 0
    for index, (module, name) in enumerate(hostile_globals(ALLOWED_GLOBALS)):
        marker = tmp_path / f"ran-{index}"
        for protocol in (2, 4):
            with pytest.raises(ConfigurationError, match=f"names {module}.{name}, which"):
                _decode_step_info(calling_pickle(module, name, marker, protocol))
            checked += 1
        assert not marker.exists()
    assert checked > 500
    with pytest.raises(ConfigurationError, match="not a Tango step record"):
        _decode_step_info(pickle.dumps({"x": 1})[:-3])  # truncated


def test_version_1_step_records_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "cache" / "some-step").mkdir(parents=True)
    (tmp_path / "cache" / "some-step" / "stepinfo.dill").write_bytes(
        calling_pickle(*DANGEROUS[6], marker)  # os.system
    )
    (tmp_path / "settings.json").write_text(json.dumps({"version": 1}))
    with pytest.raises(ConfigurationError, match="stepinfo.dill is a step record of Tango's"):
        LocalWorkspace(tmp_path)
    assert not marker.exists()


def test_a_cached_result_is_read_by_its_steps_format(tmp_path: Path) -> None:
    step = run_once(tmp_path)
    marker = tmp_path / "ran"
    directory = tmp_path / "cache" / step.unique_id
    metadata = json.loads((directory / "cache-metadata.json").read_text())
    assert metadata["format"]["type"] == "tango_fairscale.tasks.format.JsonDataFormat"
    metadata["format"] = {"type": "dill"}  # Tango's DillFormat: reads data.dill with dill
    (directory / "cache-metadata.json").write_text(json.dumps(metadata))
    (directory / "data.dill").write_bytes(calling_pickle("os", "system", marker))
    again = JsonResultStep(value=3)
    assert again.result(LocalWorkspace(tmp_path)) == {"value": 3, "nested": [1.5, "text"]}
    assert not marker.exists()


def test_the_evaluation_steps_store_json_read_as_data() -> None:
    assert isinstance(TaskScoresStep.FORMAT, JsonDataFormat)
    assert isinstance(TaskMetricsStep.FORMAT, JsonDataFormat)
