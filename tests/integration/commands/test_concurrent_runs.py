"""Two runs on one local workspace at once (tango_fairscale/compat/tango_locks.py): a step that one
holds is waited for by the other, which then uses its result; neither fails, the step runs once.

* in this process against another process running the step through Tango's own code: while the
  other holds it, this one waits (instead of ``StepStateError: ... in unexpected state
  'running'``), then takes the stored result; while the other holds the lock before recording
  the step as running, this one waits too (instead of an ``IOError``) and runs the step once the
  lock is free;
* (slow) two real ``tango run`` commands: the second prints one waiting line, both succeed and
  the step ran once.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tango.step_info import StepState
from tango.workspaces import LocalWorkspace

import tango_fairscale.compat  # noqa: F401  (the fix under test)

REPO_ROOT = Path(__file__).resolve().parents[3]

GATED_STEP = '''
import time
from pathlib import Path

from tango import Step


@Step.register("test::gated", exist_ok=True)
class GatedStep(Step):
    """Counts its runs in ``directory/runs``, then returns once ``directory/gate`` exists."""

    def run(self, directory: str) -> str:  # type: ignore[override]
        with (Path(directory) / "runs").open("a") as runs:
            runs.write("run\\n")
        (Path(directory) / "started").touch()
        while not (Path(directory) / "gate").exists():
            time.sleep(0.05)
        return "the result"
'''

HOLD_STEP = """
import sys
import tango_fairscale.compat  # as under tango run (Tango records git metadata without crashing)
sys.path.insert(0, {directory!r})
from gated_step import GatedStep
from tango.workspaces import LocalWorkspace
print(GatedStep(directory={directory!r}).result(LocalWorkspace({workspace!r})))
"""

HOLD_LOCK = """
import sys, time
from pathlib import Path
from filelock import FileLock
lock = FileLock({lock!r})
lock.acquire()
Path({directory!r}, "locked").touch()
while not Path({directory!r}, "release").exists():
    time.sleep(0.05)
lock.release()
"""


def gated_module(directory: Path) -> ModuleType:
    (directory / "gated_step.py").write_text(GATED_STEP)
    spec = importlib.util.spec_from_file_location(
        f"gated_{id(directory)}", directory / "gated_step.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def result_in_thread(step: Any, workspace: LocalWorkspace) -> tuple[threading.Thread, dict]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = step.result(workspace)
        except BaseException as error:  # noqa: BLE001  (the test reports it)
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def python(code: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_a_step_another_process_runs_is_waited_for(tmp_path: Path) -> None:
    step = gated_module(tmp_path).GatedStep(directory=str(tmp_path))
    workspace = tmp_path / "ws"
    other = python(HOLD_STEP.format(directory=str(tmp_path), workspace=str(workspace)))
    try:
        wait_for(tmp_path / "started", other)
        thread, outcome = result_in_thread(step, LocalWorkspace(workspace))
        thread.join(timeout=2)
        assert thread.is_alive(), outcome  # waiting, not failed
        (tmp_path / "gate").touch()
        thread.join(timeout=120)
        out, err = other.communicate(timeout=120)
    finally:
        (tmp_path / "gate").touch()
        other.kill() if other.poll() is None else None
    assert other.returncode == 0 and out.strip() == "the result", err
    assert outcome == {"result": "the result"}
    assert (tmp_path / "runs").read_text() == "run\n"
    assert LocalWorkspace(workspace).step_info(step).state == StepState.COMPLETED


def test_a_lock_taken_before_the_state_is_recorded_is_waited_for(tmp_path: Path) -> None:
    step = gated_module(tmp_path).GatedStep(directory=str(tmp_path))
    workspace = LocalWorkspace(tmp_path / "ws")
    workspace.step_info(step)  # recorded "incomplete", as a run registers it
    lock = workspace.step_dir(step) / "lock"
    other = python(HOLD_LOCK.format(lock=str(lock), directory=str(tmp_path)))
    try:
        wait_for(tmp_path / "locked", other)
        (tmp_path / "gate").touch()
        thread, outcome = result_in_thread(step, workspace)
        thread.join(timeout=2)
        assert thread.is_alive(), outcome
        (tmp_path / "release").touch()
        thread.join(timeout=120)
    finally:
        (tmp_path / "release").touch()
        other.wait(timeout=120)
    assert outcome == {"result": "the result"}
    assert (tmp_path / "runs").read_text() == "run\n"


@pytest.mark.slow
def test_two_tango_runs_at_once(tmp_path: Path) -> None:
    gated_module(tmp_path)
    config = tmp_path / "gated.jsonnet"
    config.write_text(f"{{steps: {{gated: {{type: 'test::gated', directory: '{tmp_path}'}}}}}}")
    command = [
        sys.executable,
        "-m",
        "tango",
        "run",
        str(config),
        "-i",
        str(tmp_path / "gated_step.py"),
    ]
    command += ["-w", str(tmp_path / "ws")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    runs = []
    try:
        for name in ("first", "second"):
            runs.append(subprocess.Popen(
                [*command, "-n", name], cwd=REPO_ROOT, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            if name == "first":
                wait_for(tmp_path / "started", runs[0])
        wait_for(tmp_path / "ws" / "runs" / "second", runs[1])  # registered: at the step next
        time.sleep(2)
        (tmp_path / "gate").touch()
        outputs = [run.communicate(timeout=300)[0] for run in runs]
    finally:
        for run in runs:
            run.kill() if run.poll() is None else None
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert "waiting for step 'gated', which another run holds" in outputs[1]
    assert 'Found output for step "gated" in cache' in outputs[1]
    assert "Traceback" not in outputs[0] + outputs[1]
    assert (tmp_path / "runs").read_text() == "run\n"
