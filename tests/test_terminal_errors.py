"""What a refusal prints (tango_fairscale/compat/tango_errors.py): an expected error reaches the
terminal as its message alone, its traceback kept in the run's log; any other keeps its traceback.

* in this process, through Tango's own logging: a ``ConfigurationError``, a ``PiqaFormatError``
  and a Jsonnet error print one line on the terminal and their traceback into a run's log file;
  a ``KeyError``, or any error under ``--log-level debug``, prints its traceback; the message
  reaches torchrun's failure report through its error file;
* through real commands: ``tests/integration/commands/test_terminal_commands.py``.

The misspelled ``-D`` name through both commands is in ``test_command_line.py``.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
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
