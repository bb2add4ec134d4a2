"""What a refusal prints through real commands (~8 CPU-s each), counting the lines on the terminal:
an unknown engine (refused by the config's Jsonnet, under ``python -m tango_fairscale run``), a
malformed PIQA file (a step that fails in a run: the traceback is in ``runs/<name>/out.log``, the
step is recorded failed), and in the slow tier the failing step under torchrun. A model path that
does not exist (refused while Tango builds the step graph, under ``tango run``) is
``test_gpt2_piqa_runs.py``'s ``no_model`` run. The same refusals through Tango's logging in this
process are ``tests/test_terminal_errors.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_piqa_dir
from helpers.commands import run_command


def assert_one_line(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode != 0
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr[-3000:]


def test_an_unknown_engine_under_the_launcher(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The config's Jsonnet refuses it; plain ``tango run`` evaluates the config before it imports
    the package, so only the launcher can shorten what Tango prints there."""
    defines = ["engine=bogus", f"model={tiny_model_dir}"]
    command = [sys.executable, "-m", "tango_fairscale", "run", "configs/gpt2_piqa.jsonnet"]
    done = run_command(
        command + ["-w", str(tmp_path / "ws")] + [a for d in defines for a in ("-D", d)]
    )
    assert_one_line(done, "unknown engine 'bogus'; choose one of ddp, fairscale, fsdp2, pipe")
    assert done.stderr.rstrip().endswith("configs/lib/engines.libsonnet:25")
    assert not (tmp_path / "ws").exists()


def failing_step_command(tmp_path: Path, *launcher: str) -> tuple[list[str], str]:
    """A one-step config whose step fails in a run (a malformed PIQA file); its error message."""
    data = make_piqa_dir(tmp_path / "piqa", {"valid.jsonl": '{"goal": "x", "sol1"\n'})
    config = tmp_path / "piqa.jsonnet"
    config.write_text(f"{{steps: {{piqa: {{type: 'tango_fairscale::piqa', data_dir: '{data}'}}}}}}")
    workspace = ["-w", str(tmp_path / "ws"), "-n", "bad"]
    program = list(launcher) or [sys.executable, "-m", "tango"]
    return [*program, "run", str(config), *workspace], f"{data / 'valid.jsonl'}:1: malformed JSON"


def test_a_failing_step_under_tango_run(tmp_path: Path) -> None:
    from tango import Workspace
    from tango.step_info import StepState

    command, message = failing_step_command(tmp_path)
    done = run_command(command, PYTHONWARNINGS="ignore")  # setuptools' pkg_resources warning
    assert done.returncode == 1
    errors = done.stderr.splitlines()
    assert len(errors) == 3, done.stderr
    assert message in errors[0] and re.search(r"tango_fairscale/tasks/piqa\.py:\d+$", errors[0])
    assert 'Step "piqa" failed' in errors[1] and "Run bad finished with errors" in errors[2]
    assert "Traceback" not in done.stdout + done.stderr
    logged = (tmp_path / "ws" / "runs" / "bad" / "out.log").read_text()
    assert "Traceback (most recent call last)" in logged and f"PiqaFormatError: {message}" in logged
    workspace = Workspace.from_url(str(tmp_path / "ws"))
    [info] = workspace.registered_run("bad").steps.values()
    assert info.state == StepState.FAILED and message in str(info.error)


@pytest.mark.slow
def test_a_failing_step_under_torchrun(tmp_path: Path) -> None:
    """Our process prints the message alone; torchrun's own failure report (its traceback and
    summary, printed by torchrun's process) ends with the message as the root cause."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    command, message = failing_step_command(tmp_path, *torchrun, "-m", "tango_fairscale")
    done = run_command(command, PYTHONWARNINGS="ignore")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines() if message in line]
    assert len(ours) == 2, output  # rank 0's line, and the report's "traceback : <message>"
    assert ours[1].strip() == f"traceback : {message} (Expecting ':' delimiter at column 21)"
    frames = [line for line in output.splitlines() if line.lstrip().startswith('File "')]
    assert not any("tango_fairscale" in frame for frame in frames), output  # torchrun's only
