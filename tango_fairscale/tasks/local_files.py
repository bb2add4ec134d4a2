"""The local files an lm-eval task definition reads: its YAML, the YAMLs it includes, their
``!function`` modules, and the data its ``dataset_path`` / ``dataset_kwargs.data_files`` name.

What :class:`~tango_fairscale.tasks.lm_eval.TaskSpec` fingerprints for its cache key. Paths are
resolved as lm-eval and ``datasets`` resolve them: includes next to the YAML that names them;
``!function`` modules next to it, else on ``sys.path`` (:func:`function_module`); ``data_files``
(a path or glob, a list of them, or a split → path/list mapping) relative to a local
``dataset_path`` directory, else to ``dataset_kwargs.data_dir``, else to the working directory.
What is not local (a hub dataset, a URL, lm-eval's own modules) is left out; a local path that
does not exist is kept (its fingerprint says "missing"). Nothing is imported or run: the YAMLs
are read with a safe loader.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml


class _Function(str):
    """A ``!function module.name`` reference (:func:`function_module` finds its file)."""


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, with lm-eval's ``!function`` tag read as a :class:`_Function`."""


def _function(loader: yaml.SafeLoader, node: yaml.Node) -> _Function:
    return _Function(loader.construct_scalar(node))  # type: ignore[arg-type]


_Loader.add_constructor("!function", _function)


def yaml_files(path: Path) -> tuple[list[Path], dict[str, Any]]:
    """The local files of the task YAML at ``path`` — itself, its includes (recursively), their
    local ``!function`` modules — and its config with the includes merged as lm-eval merges them
    (a YAML that does not parse counts as itself with an empty config: loading it says why)."""
    files: list[Path] = []
    return files, _read_yaml(path, files, set())


def _read_yaml(path: Path, files: list[Path], seen: set[Path]) -> dict[str, Any]:
    path = path.expanduser().resolve()
    if path in seen or not path.is_file():
        return {}
    seen.add(path)
    files.append(path)
    try:
        config = yaml.load(path.read_text(errors="replace"), Loader=_Loader)
    except yaml.YAMLError:
        return {}
    if not isinstance(config, dict):
        return {}
    includes = config.pop("include", None)
    merged: dict[str, Any] = {}
    for include in includes if isinstance(includes, list) else [includes]:
        if isinstance(include, str):
            merged.update(_read_yaml(path.parent / include, files, seen))
    for value in _leaves(config):
        if isinstance(value, _Function):
            module = function_module(path.parent, value.rpartition(".")[0])
            if module is not None and module not in files:
                files.append(module)
    merged.update(config)  # its own keys win
    return merged


def function_module(yaml_dir: Path, name: str) -> Path | None:
    """The file of the module ``name`` that a ``!function`` in a YAML of ``yaml_dir`` runs, found
    as lm-eval finds it: ``<name as a path>.py`` next to the YAML, else the module imported under
    ``name`` or the first one on ``sys.path`` (not imported here); ``None`` for lm-eval's own
    (keyed by its version) or one not found (loading the task says so)."""
    relative = Path(*name.split("."))
    beside = yaml_dir / relative.with_suffix(".py")
    if beside.is_file():
        return beside.resolve()
    if name.split(".")[0] == "lm_eval":
        return None
    imported = getattr(sys.modules.get(name), "__file__", None)
    if imported is not None:
        return Path(imported).resolve()
    for entry in sys.path:
        for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
            if (Path(entry or ".") / candidate).is_file():
                return (Path(entry or ".") / candidate).resolve()
    return None


def dataset_files(config: Mapping[str, Any]) -> list[Path]:
    """The local data a task config (or a group config's inline tasks) reads: a local
    ``dataset_path`` (a directory or a file) and the files ``dataset_kwargs.data_files`` names."""
    files: list[Path] = []
    for task in _mappings(config):
        kwargs = task.get("dataset_kwargs")
        kwargs = kwargs if isinstance(kwargs, Mapping) else {}
        dataset_path = task.get("dataset_path")
        base = Path(kwargs["data_dir"]) if isinstance(kwargs.get("data_dir"), str) else Path()
        if isinstance(dataset_path, str) and Path(dataset_path).expanduser().exists():
            local = Path(dataset_path).expanduser()
            files.append(local)
            base = local / base if local.is_dir() else base
        for name in _strings(kwargs.get("data_files")):
            files += _matches(base.expanduser() / Path(name).expanduser())
    return files


def _matches(path: Path) -> list[Path]:
    """``path``, or the files its glob pattern matches (the pattern itself when none does)."""
    if path.exists() or not any(character in str(path) for character in "*?["):
        return [path]
    return sorted(Path(match) for match in glob.glob(str(path), recursive=True)) or [path]


def _strings(data_files: Any) -> Iterator[str]:
    """The local paths (or patterns) in a ``data_files`` value: a string, a list of them or a
    split → string/list mapping; URLs left out."""
    if isinstance(data_files, Mapping):
        data_files = list(data_files.values())
    for item in data_files if isinstance(data_files, list) else [data_files]:
        if isinstance(item, list):
            yield from _strings(item)
        elif isinstance(item, str) and "://" not in item:
            yield item


def _mappings(value: Any) -> Iterator[Mapping[str, Any]]:
    """``value`` and every mapping nested in it (a group's inline task configs)."""
    if isinstance(value, Mapping):
        yield value
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _mappings(item)


def _leaves(value: Any) -> Iterator[Any]:
    """Every value nested in ``value`` that is neither a mapping nor a list."""
    if isinstance(value, Mapping | list):
        for item in value.values() if isinstance(value, Mapping) else value:
            yield from _leaves(item)
    else:
        yield value
