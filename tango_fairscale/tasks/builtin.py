"""lm-eval's own tasks by name: the index of every task, group and tag it ships (kept in a cache
file per lm-eval installation), a name looked up in it, and lm-eval's ``TaskManager`` over them."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

from tango.common.exceptions import ConfigurationError

from ..checks import did_you_mean


def builtin(name: str, local: bool) -> tuple[str, str | None]:
    """``(kind, YAML path)`` of an lm-eval task, group or tag; an unknown name is refused with
    the closest ones, and a group or tag with local data (which its tasks take one by one)."""
    kind, yaml_path = builtin_index().get(name, (None, None))
    if kind is None:
        raise ConfigurationError(
            f"unknown lm-eval task {name!r}{did_you_mean(name, builtin_index(), n=3)}"
        )
    if local and (kind != "TASK" or yaml_path is None):
        raise ConfigurationError(
            f"{name!r} is an lm-eval {kind.lower()}: give 'data_dir' or 'dataset' to its tasks "
            "one by one"
        )
    return kind, yaml_path


def included(include_path: str, name: str) -> str | None:
    """The task YAML that ``name`` names in folder ``include_path`` (lm-eval's index of that
    folder alone: it comes before lm-eval's own tasks, as ``lm_eval --include_path`` takes it);
    ``None`` where it has no such name and lm-eval does. A name found in neither is refused with
    the closest of both, and a group, tag or Python task there (only task YAMLs are taken)."""
    folder = Path(include_path).expanduser()
    if not folder.is_dir():
        raise ConfigurationError(f"include_path {include_path!r} is not a directory")
    index = _folder_index(str(folder.resolve()))
    kind, yaml_path = index.get(name, (None, None))
    if kind is None:
        if name in builtin_index():
            return None
        names = [*index, *builtin_index()]
        raise ConfigurationError(
            f"unknown lm-eval task {name!r}, in include_path {include_path} or lm-eval's own"
            f"{did_you_mean(name, names, n=3)}"
        )
    if kind != "TASK" or yaml_path is None:
        raise ConfigurationError(
            f"{name!r} is a {kind.lower().replace('_', ' ')} in include_path {include_path}: "
            "only its task YAMLs are taken; name its tasks"
        )
    return yaml_path


@functools.cache
def _folder_index(folder: str) -> dict[str, tuple[str, str | None]]:
    return _index_of(Path(folder))


def _index_of(folder: Path) -> dict[str, tuple[str, str | None]]:
    """lm-eval's index of the task YAMLs under ``folder``: ``{name: (kind, YAML path)}`` (parsed,
    no ``!function`` imported)."""
    from lm_eval.tasks._index import TaskIndex

    index = TaskIndex().build([folder])
    return {
        name: (entry.kind.name, None if entry.yaml_path is None else str(entry.yaml_path))
        for name, entry in index.items()
    }


@functools.cache
def full_task_manager() -> Any:
    """lm-eval's ``TaskManager`` over its own tasks (indexing them takes ~7 s: once a process)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def lm_eval_version() -> str:
    """The installed lm-eval's version (its package metadata: lm-eval is not imported)."""
    from importlib.metadata import version

    return version("lm_eval")


@functools.cache
def builtin_index() -> dict[str, tuple[str, str | None]]:
    """``{name: (kind, YAML path)}`` of every task, group and tag lm-eval ships, kept in a cache
    file per lm-eval installation (building it parses ~14,000 YAML files): one line a name,
    ``name<TAB>kind<TAB>path`` with the path relative to lm-eval's task folder (read in a few
    milliseconds, where the same index as JSON took 0.1-0.3 s). Reading it imports none of
    lm-eval's task code (``lm_eval.tasks`` imports datasets and pandas: ~0.7 s on 2 cores), so a
    command whose steps all come from the cache does not import it."""
    import importlib.util

    from cached_path import get_cache_dir

    tasks_spec = importlib.util.find_spec("lm_eval.tasks")  # where, without importing it
    assert tasks_spec is not None and tasks_spec.origin is not None
    tasks_dir = Path(tasks_spec.origin).resolve().parent
    installation = hashlib.sha256(str(tasks_dir).encode()).hexdigest()[:12]
    key = f"{lm_eval_version()}-{installation}"
    cache = Path(get_cache_dir()) / "tango_fairscale-lm_eval" / f"index-{key}.tsv"
    try:
        return _read_index(cache, tasks_dir)
    except (OSError, ValueError):
        pass
    entries = _index_of(tasks_dir)
    lines = [f"{INDEX_HEADER}\t{tasks_dir}"] + [
        f"{name}\t{kind}\t{'' if path is None else os.path.relpath(path, tasks_dir)}"
        for name, (kind, path) in entries.items()
    ]
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(partial, cache)
    return entries


#: The first field of an index file's first line (then lm-eval's task folder).
INDEX_HEADER = "tango_fairscale lm-eval task index 1"


def _read_index(cache: Path, tasks_dir: Path) -> dict[str, tuple[str, str | None]]:
    """A stored index (:func:`builtin_index`); ``ValueError`` if it is not one of ``tasks_dir``
    or names a file outside it (the YAML a task name loads is lm-eval's own, nothing else)."""
    header, *lines = cache.read_text(encoding="utf-8").splitlines()
    if header != f"{INDEX_HEADER}\t{tasks_dir}":
        raise ValueError(f"{cache} is not an index of {tasks_dir}")
    entries: dict[str, tuple[str, str | None]] = {}
    for line in lines:
        name, kind, path = line.split("\t")
        full = os.path.normpath(os.path.join(tasks_dir, path)) if path else None
        if full is not None and not full.startswith(os.path.join(tasks_dir, "")):
            raise ValueError(f"{cache} names {path}, outside {tasks_dir}")
        entries[name] = (kind, full)
    return entries
