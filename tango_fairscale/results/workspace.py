"""Read a Tango workspace's runs, step infos and JSON results without importing Tango or torch.

A local workspace (a directory or ``local://`` URL) is read directly, never written:
``runs/<name>/stepinfo.json`` maps the run's step names to unique ids, ``stepinfo.sqlite`` (a
sqlitedict table) holds each step's pickled ``StepInfo`` -- unpickled with an allow-list that
builds small stand-ins and refuses every other global, so nothing from the file is executed --
and a JSON result (Tango's ``JsonFormat``, the package's ``JsonDataFormat``) is
``cache/<unique id>/data.json`` (``.gz``, ``.bz2`` or ``.xz`` when compressed), read as data only; a
result in another format is not read (Tango would read it with whatever class its
``cache-metadata.json`` names). Other workspace URLs (beaker, gs, wandb, ...) are read through
Tango (``Workspace.from_url``), imported only then.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .files import read_json
from .step_infos import RefusedGlobal, StepRecord, load_step_info, record

__all__ = ["ResultsError", "RunRecord", "StepRecord", "WorkspaceReader", "open_reader"]

_LOG = "out.log"
_STARTED = "started.json"
_FAILED_LINE = re.compile(r'✗ Step "(?P<name>[^"]+)" failed')
_TIMESTAMP = re.compile(r"^\[\d\d/\d\d/\d\d \d\d:\d\d:\d\d\]")
_JSON_FORMATS = {"tango.format.JsonFormat", "json", "tango_fairscale.tasks.format.JsonDataFormat"}
_SUFFIXES = {None: "", "none": "", "null": "", "gz": ".gz", "gzip": ".gz", "bz": ".bz2"}
_SUFFIXES.update({"bz2": ".bz2", "bzip": ".bz2", "bzip2": ".bz2", "lzma": ".xz"})
# Workspace types that Tango's integrations register when they are imported.
_INTEGRATION_WORKSPACES = {"beaker", "gs", "wandb"}


class ResultsError(Exception):
    """A request that cannot be answered (no workspace, no runs, unknown run, nothing to plot).

    The message is one line, meant for the user as it is.
    """


@dataclass(frozen=True)
class RunRecord:
    """A registered run: its start (Tango's ``Run.start_date``: naive local time) and steps.

    ``log_end`` is when the run's own log (``runs/<name>/out.log``) was last written, when the
    workspace keeps one: a step that started after it was run again by a later run. ``started``
    is when its ``tango run`` process started, when recorded (``runs/<name>/started.json``).
    """

    name: str
    start_date: dt.datetime
    steps: dict[str, StepRecord]
    log_end: dt.datetime | None = None
    log_path: Path | None = field(default=None, compare=False)
    started: dt.datetime | None = None


class WorkspaceReader:
    """What ``results`` needs of a workspace; :func:`open_reader` gives the right kind."""

    url: str

    def run_names(self) -> list[str]:
        raise NotImplementedError

    def run(self, name: str) -> RunRecord:
        """The run; ``KeyError`` when there is none by that name."""
        raise NotImplementedError

    def result(self, run: RunRecord, step_name: str) -> Any:
        """The step's stored result; ``KeyError`` when it has none."""
        raise NotImplementedError

    def step_dirs(self, step: StepRecord) -> list[Path]:
        """Local directories that may hold the step's files: its result, then its work dir."""
        return _local_dirs(step.result_location)

    def lock_held(self, step: StepRecord) -> bool | None:
        """Whether a process holds the step's lock now (``None``: cannot tell)."""
        return None

    def logged_failures(self, run: RunRecord) -> dict[str, str | None]:
        """Steps whose failure the run's log records, each with its exception message if found."""
        if run.log_path is None or not run.log_path.is_file():
            return {}
        return _failures_in_log(run.log_path.read_text(errors="replace").splitlines())


class LocalReader(WorkspaceReader):
    """A local workspace directory, read without Tango."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory.resolve()
        self.url = "local://" + str(self.dir)
        self._runs = self.dir / "runs"
        self._cache = self.dir / "cache"

    def run_names(self) -> list[str]:
        return [entry.name for entry in self._runs.iterdir() if entry.is_dir()]

    def run(self, name: str) -> RunRecord:
        run_dir = self._runs / name
        if not name or not run_dir.is_dir() or run_dir.parent != self._runs:
            raise KeyError(name)
        ids_file = run_dir / "stepinfo.json"
        if ids_file.is_file():
            ids = _step_ids(ids_file)
        else:  # runs registered by old Tango versions: one symlink per step
            ids = {p.name: p.resolve().name for p in run_dir.iterdir() if p.is_symlink()}
        infos = self._step_infos(list(ids.values()))
        steps = {
            step: record(step, infos[uid]) if uid in infos else StepRecord(step, uid)
            for step, uid in ids.items()
        }
        log = run_dir / _LOG
        log_end = _mtime(log) if log.is_file() else None
        start = dt.datetime.fromtimestamp(run_dir.stat().st_ctime)  # as LocalWorkspace does
        log_path = log if log.is_file() else None
        return RunRecord(name, start, steps, log_end, log_path, _started(run_dir))

    def result(self, run: RunRecord, step_name: str) -> Any:
        step = run.steps[step_name]
        directory = self._cache / step.unique_id
        try:
            metadata = json.loads((directory / "cache-metadata.json").read_text())
        except FileNotFoundError:
            raise KeyError(step_name) from None
        format_ = metadata.get("format") or {}
        if format_.get("type") in _JSON_FORMATS and format_.get("compress") in _SUFFIXES:
            return read_json(directory, _SUFFIXES[format_.get("compress")])
        # Another format would be read by Tango with the class the metadata file names (a
        # pickle, for DillFormat): the results the package reports are JSON.
        raise ValueError(f"{directory}: a result stored as {format_.get('type')!r}, not JSON")

    def step_dirs(self, step: StepRecord) -> list[Path]:
        directory = self._cache / step.unique_id
        return list(
            dict.fromkeys([*_local_dirs(step.result_location), directory, directory / "work"])
        )

    def lock_held(self, step: StepRecord) -> bool | None:
        import fcntl

        try:
            descriptor = os.open(self._cache / step.unique_id / "lock", os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        else:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            return False
        finally:
            os.close(descriptor)

    def step_records(self, unique_ids: list[str]) -> dict[str, StepRecord]:
        """The records of the steps ``unique_ids`` that the workspace holds, in a run or not."""
        infos = self._step_infos(unique_ids)
        return {
            uid: record(getattr(info, "step_name", None) or uid, info)
            for uid, info in infos.items()
        }

    def _step_infos(self, unique_ids: list[str]) -> dict[str, Any]:
        database = self.dir / "stepinfo.sqlite"
        if not unique_ids or not database.is_file():
            return {}
        uri = database.as_uri() + "?mode=ro"
        marks = ",".join("?" * len(unique_ids))
        query = f'SELECT key, value FROM "unnamed" WHERE key IN ({marks})'
        try:
            connection = sqlite3.connect(uri, uri=True, timeout=30)
            try:
                rows = connection.execute(query, unique_ids).fetchall()
            finally:
                connection.close()
        except sqlite3.Error as error:
            raise ResultsError(f"cannot read {database}: {error}") from None
        return {key: _step_info(key, bytes(value), database) for key, value in rows}


class TangoReader(WorkspaceReader):
    """Any Tango ``Workspace``, through Tango's own API."""

    def __init__(self, workspace: Any) -> None:
        self.workspace = workspace
        self.url = workspace.url

    def run_names(self) -> list[str]:
        return list(self.workspace.registered_runs())

    def run(self, name: str) -> RunRecord:
        run = self.workspace.registered_run(name)  # KeyError when absent
        steps = {step: record(step, info) for step, info in run.steps.items()}
        run_dir = getattr(self.workspace, "run_dir", None)  # LocalWorkspace keeps the run's log
        log = run_dir(name) / _LOG if callable(run_dir) else None
        if log is None or not log.is_file():
            return RunRecord(run.name, run.start_date, steps)
        return RunRecord(run.name, run.start_date, steps, _mtime(log), log, _started(log.parent))

    def result(self, run: RunRecord, step_name: str) -> Any:
        try:
            return self.workspace.step_result_for_run(run.name, step_name)
        except (OSError, ValueError) as error:
            raise KeyError(step_name) from error

    def step_dirs(self, step: StepRecord) -> list[Path]:
        dirs = _local_dirs(step.result_location)
        step_dir = getattr(self.workspace, "step_dir", None)  # LocalWorkspace
        if callable(step_dir):
            dirs += [step_dir(step.unique_id), step_dir(step.unique_id) / "work"]
        return list(dict.fromkeys(dirs))


def open_reader(workspace: Any) -> WorkspaceReader:
    """A reader for a reader, a Tango ``Workspace``, a URL (``local:///tmp/ws``) or a path.

    Raises :class:`ResultsError` when a local workspace does not exist (nothing is created).
    """
    if isinstance(workspace, WorkspaceReader):
        return workspace
    tango_workspace = sys.modules.get("tango.workspace")  # an instance means Tango is imported
    if tango_workspace is not None and isinstance(workspace, tango_workspace.Workspace):
        return TangoReader(workspace)
    url = os.fspath(workspace)
    parsed = urlparse(url)
    if parsed.scheme not in ("", "local"):
        return TangoReader(_tango_workspace(url))
    directory = Path(parsed.netloc) / parsed.path.lstrip("/") if parsed.netloc else None
    directory = directory or Path(parsed.path or ".")
    if not (directory / "runs").is_dir():
        raise ResultsError(f"no Tango workspace at {url!r} (expected a directory with runs/)")
    if not (directory / "settings.json").is_file() and any(directory.glob("cache/*/stepinfo.dill")):
        raise ResultsError(
            f"{url!r} is a version 1 Tango workspace: open it once with Tango "
            "(tango.Workspace.from_url) to upgrade it"
        )
    return LocalReader(directory)


# --- Tango, imported on demand -----------------------------------------------------------------


def _tango_workspace(url: str) -> Any:
    from tango import Workspace
    from tango.common.registrable import Registrable

    scheme = urlparse(url).scheme
    known = sorted((set(Registrable._registry[Workspace]) - {"from_url"}) | _INTEGRATION_WORKSPACES)
    if scheme not in ("", *known):
        raise ResultsError(
            f"unknown workspace type {scheme!r} in {url!r}; choose one of "
            f"{', '.join(known)} (or give a directory)"
        )
    try:
        return Workspace.from_url(url)
    except Exception as error:  # missing integration, unreachable store
        raise ResultsError(f"cannot open workspace {url!r}: {_one_line(error)}") from error


def _step_ids(path: Path) -> dict[str, str]:
    """A run's ``stepinfo.json`` (step name: unique id); :class:`ResultsError` when unreadable."""
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # truncated, not UTF-8, ...
        raise ResultsError(f"cannot read {path}: {_one_line(error)}") from None
    if not isinstance(ids, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in ids.items()
    ):
        raise ResultsError(f"{path} does not map step names to step ids")
    return ids


def _step_info(unique_id: str, data: bytes, database: Path) -> Any:
    try:
        info = load_step_info(data)
    except RefusedGlobal as error:
        raise ResultsError(
            f"the step info of {unique_id} in {database} refers to {error}, which the results "
            "reader does not unpickle; read it with tango.Workspace.from_url"
        ) from None
    except Exception as error:  # truncated or corrupt data
        raise ResultsError(
            f"cannot read the step info of {unique_id} in {database}: {_one_line(error)}"
        ) from None
    if getattr(info, "unique_id", None) != unique_id:
        raise ResultsError(f"the entry {unique_id} in {database} is not that step's StepInfo")
    return info


# --- files --------------------------------------------------------------------------------------


def _local_dirs(location: str | None) -> list[Path]:
    if not location:
        return []
    parsed = urlparse(location)
    if parsed.scheme in ("file", "local"):
        return [Path(parsed.path)]
    return [Path(location)] if parsed.scheme == "" else []


def _started(run_dir: Path) -> dt.datetime | None:
    """When the run's process started (``started.json``, written by ``compat/tango_runs.py``)."""
    try:
        started = dt.datetime.fromisoformat(
            json.loads((run_dir / _STARTED).read_text())["process_start"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return started if started.tzinfo is not None else None


def _mtime(path: Path) -> dt.datetime:
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)


def _failures_in_log(lines: list[str]) -> dict[str, str | None]:
    """``✗ Step "NAME" failed`` lines, each with the exception lines just above it."""
    failures: dict[str, str | None] = {}
    for index, line in enumerate(lines):
        match = _FAILED_LINE.search(line)
        if match is None:
            continue
        message: list[str] = []
        for previous in reversed(lines[:index]):
            if not previous.strip() or previous[0].isspace() or _TIMESTAMP.match(previous):
                break
            message.insert(0, previous.strip())
        failures[match["name"]] = " ".join(message) or None
    return failures


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
