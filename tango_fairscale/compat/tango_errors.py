"""How Tango 1.3.2 prints an expected error: the message alone on the terminal, its traceback in
the run's log file.

Tango logs every exception that ends a step or ``tango run`` with its traceback
(``tango.common.logging.log_exc_info``, called by its ``sys.excepthook``, ``Step.log_failure``
and the executor): 12 to 54 lines before the one that says what to change. For an *expected*
error -- a ``ConfigurationError``, one of the package's one-line error classes (:data:`EXPECTED`),
or a Jsonnet error raised while Tango evaluates the config -- the handlers that write to the
terminal print the message alone; a run's log file (``runs/<name>/out.log`` of a local
workspace) still gets the traceback. A refusal before any run exists (while Tango builds the step
graph) has no log file: its traceback is left out. With ``--log-level debug`` (or
``TANGO_LOG_LEVEL=debug``) Tango prints tracebacks as it always did. Any other exception keeps
its traceback on the terminal.

Under ``torchrun`` the message is also written to the error file torchrun names
(``TORCHELASTIC_ERROR_FILE``), so that its failure report ends with the message instead of "To
enable traceback see ...".
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

#: The errors printed as their message alone (by class, through each class's bases), named so
#: that checking an error imports nothing; ``tests/test_terminal_errors.py`` checks each exists.
EXPECTED = frozenset(
    {
        "tango.common.exceptions.ConfigurationError",
        "tango_fairscale.parallel.consolidate.CheckpointError",
        "tango_fairscale.runtime.launcher.LaunchError",
        "tango_fairscale.runtime.spawn.WorkerFailed",
        "tango_fairscale.tasks.piqa.PiqaDownloadError",
        "tango_fairscale.tasks.piqa.PiqaFormatError",
        "tango_fairscale.train.checkpoints.TrainingStopped",
        "tango_fairscale.train.guards.NonFiniteLossError",
    }
)

#: The record attribute holding the terminal's message (it survives Tango's log socket).
BRIEF = "tango_fairscale_brief"
_JSONNET_PREFIX = re.compile(r"^(?:runtime error|assert failed):\s*")
_JSONNET_PLACE = re.compile(r"^\s*(\S+?):(\d+):[\d:()-]+")


def brief_message(error: BaseException) -> str | None:
    """The terminal's message for an expected error; ``None`` for any other."""
    if _is_jsonnet_error(error):
        return _jsonnet_message(str(error))
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(error).__mro__}
    if names & EXPECTED:
        return str(error).strip() or type(error).__name__
    return None


def _is_jsonnet_error(error: BaseException) -> bool:
    """Raised by the Jsonnet evaluator inside ``Params.from_file`` (its innermost frame)."""
    if not isinstance(error, RuntimeError) or error.__traceback__ is None:
        return False
    from tango.common.params import Params

    innermost = traceback.extract_tb(error.__traceback__)[-1]
    code = vars(Params)["from_file"].__func__.__code__  # a classmethod's function
    return (innermost.filename, innermost.name) == (code.co_filename, code.co_name)


def _jsonnet_message(text: str) -> str:
    """``runtime error: MESSAGE`` (or ``assert failed: MESSAGE``) above the Jsonnet stack."""
    lines = text.strip().splitlines() or [""]
    return _JSONNET_PREFIX.sub("", lines[0])


def _jsonnet_place(text: str) -> tuple[str, int] | None:
    """The config file and line of a Jsonnet error (the top of its stack), relative to here."""
    place = next(filter(None, map(_JSONNET_PLACE.match, text.splitlines()[1:])), None)
    if place is None:
        return None
    path = place.group(1)
    if os.path.isabs(path) and path.startswith(os.getcwd() + os.sep):
        path = os.path.relpath(path)
    return path, int(place.group(2))


def writes_to_terminal(handler: logging.Handler) -> bool:
    """Whether ``handler`` is one of Tango's console handlers (not a run's log file)."""
    console = getattr(handler, "console", None)
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return console is not None and any(console.file is stream for stream in streams)


def _terminal_record(record: logging.LogRecord, brief: str) -> logging.LogRecord:
    """``record`` as its message alone, placed where the error was raised."""
    fields = {**record.__dict__, "msg": brief, "args": (), "exc_info": None, "exc_text": None}
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and error.__traceback__ is not None:
        raised = traceback.extract_tb(error.__traceback__)[-1]
        place = _jsonnet_place(str(error)) if _is_jsonnet_error(error) else None
        fields["pathname"], fields["lineno"] = place or (raised.filename, raised.lineno)
    return logging.makeLogRecord(fields)


def _tell_torchrun(message: str) -> None:
    """Hand the message to torchrun's failure report (its error file; the first one stays)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    try:
        with open(path, "w") as file:
            json.dump({"message": message, "timestamp": int(time.time())}, file)
    except OSError:
        pass  # the report then says what torchrun says without it


def patch_tango_error_logging() -> None:
    import tango.common.logging as tango_logging

    original: Callable[..., None] = tango_logging.log_exc_info
    if getattr(original, "prints_expected_errors_briefly", False):
        return

    def log_exc_info(  # Tango's signature, ``traceback`` included
        exctype: Any, value: Any, traceback: Any, logger: logging.Logger | None = None
    ) -> None:
        brief = brief_message(value) if value is not None else None
        debugging = logging.getLogger().isEnabledFor(logging.DEBUG)
        if brief is None or debugging or value in tango_logging._EXCEPTIONS_LOGGED:
            original(exctype, value, traceback, logger=logger)
            return
        tango_logging._EXCEPTIONS_LOGGED.append(value)
        _tell_torchrun(brief)
        (logger or logging.getLogger()).error(
            "%s", brief, exc_info=(exctype, value, traceback), extra={BRIEF: brief}
        )

    log_exc_info.prints_expected_errors_briefly = True  # type: ignore[attr-defined]
    tango_logging.log_exc_info = log_exc_info
    _patch_console_handlers(tango_logging.RichHandler)


def _patch_console_handlers(handler_class: Any) -> None:
    original = handler_class.emit

    def emit(self: logging.Handler, record: logging.LogRecord) -> None:
        brief = getattr(record, BRIEF, None)
        if brief is not None and writes_to_terminal(self):
            record = _terminal_record(record, brief)
        original(self, record)

    handler_class.emit = emit
