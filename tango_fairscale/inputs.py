"""The inputs a config's steps read, checked before any step: every one that can be neither read
here nor fetched is named in one message, so an offline first run fails once, not once per input.

Checked, in the steps ``tango run`` would run (all, or those ``-s`` names and what they use):

* a model's ``model`` and ``tokenizer`` (``tango_fairscale::causal_lm``): a local directory
  holding a ``config.json`` and tokenizer files (:data:`TOKENIZER_FILES`), or a hub id the hub
  or the local hub cache knows (:func:`~.model.fingerprint.hub_revision`, whose
  answer the steps then reuse);
* PIQA's files (``tango_fairscale::piqa``): the five official files in ``data_dir``; without one,
  the download cache, else the download server answering;
* a task's ``data_dir`` (``task``, ``validate_tasks``): a directory holding ``<split>.jsonl``,
  for a name lm-eval has a task of (else the closest names).

Everything else (file contents, hub datasets of lm-eval tasks) is checked where it is read.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tango.common.exceptions import ConfigurationError

from .checks import one_line

_MODEL = "tango_fairscale::causal_lm"
_PIQA = "tango_fairscale::piqa"
_TASK_FIELDS = ("task", "validate_tasks")


def check_inputs(
    steps: dict[str, Any], selected: list[str] | None = None, model_flag: str = "-D model=DIR"
) -> None:
    """Raise one ``ConfigurationError`` naming every missing input of ``steps`` (a config's
    ``steps``, as plain data) that the ``selected`` steps (default: all) and their
    dependencies read; a missing model's message says to give ``model_flag`` (what the user's
    command takes: ``tango run``'s external variable, ``tango-fairscale eval``'s ``--model``)."""
    wanted = _needed(steps, selected) if selected else list(steps)
    problems: dict[str, str] = {}
    tasks: dict[str, list[str]] = {}
    for config in (steps[name] for name in wanted if name in steps):
        for node in _dicts(config):
            if node.get("type") == _MODEL:
                for field in ("model", "tokenizer"):
                    source = node.get(field)
                    if isinstance(source, str) and source not in problems:
                        problem = _source_problem(field, source, node, model_flag)
                        problems[source] = problem or ""
            elif node.get("type") == _PIQA:
                problems[_PIQA] = _piqa_problem(node.get("data_dir")) or ""
            for spec in _task_specs(node):
                unknown = _name_problem(spec.get("name"), spec.get("include_path"))
                if unknown:  # a typo: not a data directory to fill
                    problems[str(spec.get("name"))] = unknown
                elif not _holds_documents(spec["data_dir"]):
                    parent = str(Path(spec["data_dir"]).parent)
                    names = tasks.setdefault(parent, [])
                    if str(spec.get("name")) not in names:
                        names.append(str(spec.get("name")))
    found = [problem for problem in problems.values() if problem]
    found += [_tasks_problem(parent, names) for parent, names in tasks.items()]
    if len(found) == 1:
        raise ConfigurationError(found[0])
    if found:
        raise ConfigurationError(f"{len(found)} inputs are missing: " + "; ".join(found))


#: A tokenizer's files, one of which a directory holding a tokenizer has.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
)


def _source_problem(field: str, source: str, node: dict[str, Any], model_flag: str) -> str | None:
    from .model.fingerprint import hub_revision, is_hub_id

    flag = model_flag if field == "model" else "a local 'tokenizer' directory"
    directory = Path(source).expanduser()
    if directory.is_dir():
        wanted: list[tuple[str, tuple[str, ...]]] = []
        if field == "model" and node.get("config") is None:
            wanted.append(("config.json", ("config.json",)))
        if field == "tokenizer" or not node.get("tokenizer"):
            wanted.append(("tokenizer files", TOKENIZER_FILES))
        lacking = [
            what for what, names in wanted if not any((directory / n).is_file() for n in names)
        ]
        if lacking:
            return (
                f"cannot load {field} from {source!r}: it has no {' and no '.join(lacking)} (a "
                f"directory save_pretrained wrote holds them); give {flag}"
            )
        return None
    if not is_hub_id(source):
        return f"cannot load {field} from path {source!r} (no such directory); give {flag}"
    try:
        hub_revision(source)
    except ConfigurationError:
        return (
            f"cannot load {field} {source!r}: neither a local directory nor reachable on the hub "
            f"nor in its local cache (give {flag}, or run 'hf download {source}' where "
            "there is network)"
        )
    return None


def _piqa_problem(data_dir: Any) -> str | None:
    from .tasks.piqa import DOWNLOAD_TIMEOUT_S, PIQA_FILES, PIQA_URL, default_cache_dir

    if data_dir:
        directory = Path(str(data_dir)).expanduser()
        missing = [name for name in PIQA_FILES if not (directory / name).is_file()]
        if not missing:
            return None
        return f"PIQA data directory {directory} is missing {', '.join(missing)}"
    if all((default_cache_dir() / name).is_file() for name in PIQA_FILES):
        return None
    request = urllib.request.Request(PIQA_URL + PIQA_FILES[-1], method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S):
            return None
    except Exception as error:  # URLError, timeouts, HTTP errors: the download would fail too
        reason = getattr(error, "reason", error)
        return (
            f"cannot download the PIQA files from {PIQA_URL} ({one_line(reason, 120)}); give "
            f"-D data_dir=DIR holding the official files {', '.join(PIQA_FILES)}"
        )


def _name_problem(name: Any, include_path: Any) -> str | None:
    """Why neither ``include_path`` nor lm-eval has a task ``name`` to read local data with (the
    closest names), if so."""
    from .tasks.builtin import builtin, included

    if not isinstance(name, str):
        return None
    try:
        if not (isinstance(include_path, str) and included(include_path, name)):
            builtin(name, local=True)
    except ConfigurationError as error:
        return str(error)
    return None


def _tasks_problem(parent: str, names: list[str]) -> str:
    return (
        f"no task data: {parent} has no <task>/<split>.jsonl for {', '.join(sorted(names))} "
        "(-D task_data_dir=DIR; README 'The task library' lists each task's files)"
    )


def _holds_documents(data_dir: Any) -> bool:
    directory = Path(str(data_dir)).expanduser()
    return directory.is_dir() and any(directory.glob("*.jsonl"))


def _task_specs(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The task specs (``{name, data_dir, ...}``) in ``node``'s task fields that name a data dir."""
    for field in _TASK_FIELDS:
        value = node.get(field)
        for spec in value if isinstance(value, list) else [value]:
            if isinstance(spec, dict) and spec.get("data_dir"):
                yield spec


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _dicts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _dicts(item)


def _needed(steps: dict[str, Any], selected: list[str]) -> list[str]:
    """``selected`` and the steps they refer to (``{"type": "ref", "ref": NAME}``), transitively."""
    needed: list[str] = []
    pending = list(selected)
    while pending:
        name = pending.pop()
        if name in needed or name not in steps:
            continue
        needed.append(name)
        pending += [
            node["ref"]
            for node in _dicts(steps[name])
            if node.get("type") == "ref" and isinstance(node.get("ref"), str)
        ]
    return needed
