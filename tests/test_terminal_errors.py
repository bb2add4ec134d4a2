"""What a refusal prints (tango_fairscale/compat/tango_errors.py): an expected error reaches the
terminal as its message alone, its traceback kept in the run's log; any other keeps its traceback.

* in this process, through Tango's own logging: a ``ConfigurationError``, a ``PiqaFormatError``
  and a Jsonnet error print one line on the terminal and their traceback into a run's log file;
  a ``KeyError``, or any error under ``--log-level debug``, prints its traceback; the message
  reaches torchrun's failure report through its error file;
* through real commands (~8 CPU-s each), counting the lines on the terminal: an unknown engine
  (refused by the config's Jsonnet, under ``python -m tango_fairscale run``), a malformed PIQA
  file (a step that fails in a run: the traceback is in ``runs/<name>/out.log``, the step is
  recorded failed), and in the slow tier a model path that does not exist (refused while Tango
  builds the step graph, under ``tango run``) and the failing step under torchrun.

The misspelled ``-D`` name through both commands is in ``test_command_line.py``.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_piqa_dir
from tango.common import Params
from tango.common.exceptions import ConfigurationError
from tango.common.logging import file_handler, initialize_logging, log_exception, teardown_logging

from tango_fairscale.compat.tango_errors import EXPECTED, brief_message
from tango_fairscale.tasks.piqa import PiqaFormatError

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_each_expected_error_class_exists() -> None:
    """The classes are named, not imported, by the patch: a rename must fail here."""
    for name in EXPECTED:
        module, _, attribute = name.rpartition(".")
        cls = getattr(importlib.import_module(module), attribute)
        assert isinstance(cls, type) and issubclass(cls, Exception), name


@pytest.fixture
def tango_logging(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Tango's logging as ``tango run`` sets it up (its console handlers write to stdout and
    stderr, captured here)."""
    initialize_logging(log_level="warning", enable_cli_logs=True)
    try:
        yield
    finally:
        teardown_logging()
        logging.getLogger().setLevel(logging.WARNING)


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def log_in_run(error: BaseException, log: Path) -> None:
    """What Tango does with a step's exception: logged while the run's log file is open."""
    with file_handler(log):
        log_exception(error, logging.getLogger("some.step"))


@pytest.mark.parametrize(
    "error",
    [
        ConfigurationError("cannot load model from path '/x' (no such directory)"),
        PiqaFormatError("/data/valid.jsonl:1: malformed JSON (Expecting value at column 1)"),
    ],
    ids=["ConfigurationError", "PiqaFormatError"],
)
def test_an_expected_error_prints_its_message_alone(
    tango_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], error: Exception
) -> None:
    log_in_run(raised(error), tmp_path / "out.log")
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert " ERROR " in line and str(error) in line
    raise_site = traceback.extract_tb(error.__traceback__)[-1]
    assert line.rstrip().endswith(f"test_terminal_errors.py:{raise_site.lineno}")  # not logging's
    logged = (tmp_path / "out.log").read_text()
    assert "Traceback (most recent call last)" in logged
    assert f"{type(error).__name__}: {error}" in logged


def test_other_errors_and_debug_keep_their_traceback(
    tango_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_in_run(raised(KeyError("unexpected")), tmp_path / "out.log")
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    logging.getLogger().setLevel(logging.DEBUG)  # what --log-level debug sets
    log_in_run(raised(ConfigurationError("refused")), tmp_path / "debug.log")
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_jsonnet_error_is_its_message_and_place(
    tango_logging: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.jsonnet"
    config.write_text("local engine = 'bogus';\n{ a: error 'unknown engine %s' % engine }\n")
    with pytest.raises(RuntimeError) as error:
        Params.from_file(config)
    assert brief_message(error.value) == "unknown engine bogus"
    assert brief_message(RuntimeError("runtime error: elsewhere")) is None  # not from Jsonnet
    log_exception(error.value)
    [line] = capsys.readouterr().err.splitlines()
    assert "unknown engine bogus" in line and line.rstrip().endswith(f"{config}:2")


def test_torchruns_report_names_the_message(
    tango_logging: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    log_in_run(raised(ConfigurationError("device_count 4 disagrees")), tmp_path / "out.log")
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.message == "device_count 4 disagrees"


# Real commands ----------------------------------------------------------------------------------


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode != 0
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr[-3000:]


@pytest.mark.slow  # ~9 CPU-s; test_config.py's default tier runs the same command
def test_a_missing_model_path_under_tango_run(tmp_path: Path, piqa_dir: Path) -> None:
    defines = ["model=/nonexistent/dir", f"data_dir={piqa_dir}", "train_steps=0", "limit=4"]
    command = [sys.executable, "-m", "tango", "run", "configs/gpt2_piqa.jsonnet"]
    done = run(command + ["-w", str(tmp_path / "ws")] + [a for d in defines for a in ("-D", d)])
    assert_one_line(done, "cannot load model from path '/nonexistent/dir' (no such directory)")


def test_an_unknown_engine_under_the_launcher(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The config's Jsonnet refuses it; plain ``tango run`` evaluates the config before it imports
    the package, so only the launcher can shorten what Tango prints there."""
    defines = ["engine=bogus", f"model={tiny_model_dir}"]
    command = [sys.executable, "-m", "tango_fairscale", "run", "configs/gpt2_piqa.jsonnet"]
    done = run(command + ["-w", str(tmp_path / "ws")] + [a for d in defines for a in ("-D", d)])
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
    done = run(command, PYTHONWARNINGS="ignore")  # setuptools' pkg_resources warning
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
    done = run(command, PYTHONWARNINGS="ignore")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines() if message in line]
    assert len(ours) == 2, output  # rank 0's line, and the report's "traceback : <message>"
    assert ours[1].strip() == f"traceback : {message} (Expecting ':' delimiter at column 21)"
    frames = [line for line in output.splitlines() if line.lstrip().startswith('File "')]
    assert not any("tango_fairscale" in frame for frame in frames), output  # torchrun's only
