"""A local run records when its ``tango run`` process started and a finished one exits without its
teardown, started as ``tango`` or as ``python -m tango`` (``compat/tango_runs.py``); Tango runs in
a git repository without an origin (``compat/__init__.py``)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tango import Step
from tango.workspaces import LocalWorkspace

import tango_fairscale.compat  # noqa: F401  (applies the fixes)
from tango_fairscale.compat.tango_runs import STARTED, process_start


class _Nothing(Step):
    def run(self) -> int:  # type: ignore[override]
        return 1


def test_a_registered_run_holds_its_process_start(tmp_path: Path) -> None:
    workspace = LocalWorkspace(tmp_path)
    run = workspace.register_run([_Nothing(step_name="nothing")], "named")
    recorded = json.loads((workspace.run_dir(run.name) / STARTED).read_text())
    started = dt.datetime.fromisoformat(recorded["process_start"]).timestamp()
    assert abs(started - process_start()) < 1e-3 and started <= time.time()
    assert time.time() - started < 24 * 3600  # this test process's start, not the boot's


def test_tango_runs_in_a_repository_without_origin(tmp_path, monkeypatch) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    from tango.step_info import EnvironmentMetadata, GitMetadata

    with pytest.raises(ValueError):  # Tango's own lookup: no commit, no origin
        GitMetadata.check_for_repo()

    assert EnvironmentMetadata().git is None


def test_exit_now_ends_as_python_would_without_the_teardown(tmp_path: Path) -> None:
    """Another thread is joined, exit handlers run, unflushed output comes out, status 0."""
    script = f"""
import atexit, pathlib, threading, time
from tango_fairscale.compat.tango_runs import exit_now
out = pathlib.Path({str(tmp_path)!r})
atexit.register(lambda: (out / "handler").write_text("ran"))
threading.Thread(target=lambda: (time.sleep(0.2), (out / "thread").write_text("joined"))).start()
print("unflushed", end="")
exit_now()
print("not reached")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "unflushed"), done.stderr
    assert (tmp_path / "handler").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"


@pytest.mark.parametrize("invoked", ["python -m tango", "the tango script"])
def test_a_finished_run_ends_through_exit_now_however_tango_was_started(invoked) -> None:
    """``python -m tango`` runs Tango's ``__main__.py`` as ``__main__``: its command group, not an
    imported copy's, is the one that must end the process (a second's teardown otherwise)."""
    script = f"""
import importlib.util, runpy, sys
from tango_fairscale.compat import tango_runs
if {invoked == "python -m tango"!r}:
    module = importlib.util.module_from_spec(importlib.util.find_spec("tango.__main__"))
    module.__spec__.loader.exec_module(module)  # as runpy runs it, before calling main()
    sys.modules["__main__"] = module
    running = module.main
else:
    from tango.__main__ import main as running
tango_runs.patch_tango_run_exit()
assert getattr(running._result_callback, "exits_now", False), "not patched"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
