"""A step's lock is taken before its state is read, and a lock this process holds is not tried
again when Tango reads that step's state (``compat/tango_locks.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tango.workspaces.local_workspace as local_workspace
from tango import Step
from tango.step_info import StepState
from tango.workspaces import LocalWorkspace

import tango_fairscale.compat  # noqa: F401  (applies the fixes)


class _One(Step):
    CACHEABLE = True
    DETERMINISTIC = True

    def run(self) -> int:  # type: ignore[override]
        return 1


class _Untried:
    """Stands in for Tango's ``FileLock`` in its state check: any attempt to take a lock fails."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def acquire(self, timeout: float) -> None:
        raise AssertionError(f"the state check tried the lock {self.path} for {timeout} s")


def test_a_step_this_process_runs_is_finished_without_trying_its_own_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = LocalWorkspace(tmp_path)
    step = _One(step_name="one")
    workspace.step_starting(step)
    monkeypatch.setattr(local_workspace, "FileLock", _Untried)
    assert workspace.step_info(step).state == StepState.RUNNING  # read while this process holds it
    workspace.step_finished(step, 1)
    assert workspace.step_cache[step] == 1
    # Released, the lock is checked as Tango checks it.
    with pytest.raises(AssertionError, match="tried the lock"):
        workspace.step_info(step)
    monkeypatch.undo()
    assert workspace.step_info(step).state == StepState.COMPLETED
