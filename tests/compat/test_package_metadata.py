"""``compat/package_metadata.py``: transformers' map of installed packages read from a file kept
per set of installed packages — the same map as importlib's, computed again when a ``sys.path``
folder changes, and importlib's function back in place after that one call."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tango_fairscale.compat import package_metadata


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "tango-fairscale"


def test_the_map_is_importlibs_and_read_from_the_file_until_a_folder_changes(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def compute() -> dict[str, list[str]]:
        calls.append(1)
        return importlib.metadata.packages_distributions()

    expected = dict(importlib.metadata.packages_distributions())
    assert package_metadata.packages_distributions(compute) == expected and calls == [1]
    assert package_metadata.packages_distributions(compute) == expected and calls == [1]
    (folder := tmp_path / "site").mkdir()
    (folder / "package-1.0.dist-info").mkdir()
    (workdir := tmp_path / "workdir").mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(folder), str(workdir)])
    package_metadata.packages_distributions(compute)
    os.utime(workdir, ns=(0, 0))  # a folder without package metadata: a file written there
    package_metadata.packages_distributions(compute)
    assert calls == [1, 1]
    os.utime(folder, ns=(0, 0))  # a package installed or removed there
    package_metadata.packages_distributions(compute)
    assert calls == [1, 1, 1] and len(list(cache_home.glob("*.json"))) == 3


def test_the_newest_maps_are_kept(cache_home: Path) -> None:
    cache_home.mkdir(parents=True)
    for age in range(package_metadata.KEPT_MAPS + 2):  # the oldest first
        stale = cache_home / f"packages_distributions-old{age:02d}.json"
        stale.write_text("{}")
        os.utime(stale, ns=(age, age))
    package_metadata.packages_distributions(dict)
    kept = sorted(path.name for path in cache_home.glob("*.json"))
    assert (
        len(kept) == package_metadata.KEPT_MAPS and "packages_distributions-old00.json" not in kept
    )
    assert f"packages_distributions-{package_metadata.installed_key()}.json" in kept


def test_a_damaged_file_is_computed_again(cache_home: Path) -> None:
    package_metadata.packages_distributions(importlib.metadata.packages_distributions)
    (kept,) = cache_home.glob("*.json")
    kept.write_text('{"torch": "not a list"')
    mapping = package_metadata.packages_distributions(importlib.metadata.packages_distributions)
    assert mapping == dict(importlib.metadata.packages_distributions())


def test_only_the_next_call_is_answered_from_the_file(cache_home: Path) -> None:
    original = importlib.metadata.packages_distributions
    package_metadata.remember_packages_distributions_once()
    try:
        assert importlib.metadata.packages_distributions is not original
        assert importlib.metadata.packages_distributions() == dict(original())
        assert importlib.metadata.packages_distributions is original
    finally:
        importlib.metadata.packages_distributions = original
    assert len(list(cache_home.glob("*.json"))) == 1


@pytest.mark.slow  # two fresh interpreters importing transformers: ~8 s on 2 cores
def test_transformers_reads_the_map_from_the_file_in_a_second_process(tmp_path: Path) -> None:
    """The compat fixes applied (as every component's module applies them), transformers
    imported: its map is importlib's; a second process gets it from the file, without reading a
    package's files. (That no component imports transformers before the fixes is
    ``tests/compat/test_transformers.py``'s scikit-learn test.)"""
    code = (
        "import importlib.metadata as metadata, json, sys\n"
        "import tango_fairscale.compat\n"
        "original = metadata.packages_distributions\n"
        "if sys.argv[1] == 'second':\n"
        "    metadata.distributions = None  # reading the packages' files fails\n"
        "import transformers.utils.import_utils as import_utils\n"
        "assert metadata.packages_distributions is original\n"
        "mapping = dict(import_utils.PACKAGE_DISTRIBUTION_MAPPING)\n"
        "assert sys.argv[1] == 'second' or mapping == dict(original())  # importlib's own\n"
        "print(json.dumps(mapping, sort_keys=True))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", code, which], capture_output=True, text=True, env=env)
        for which in ("first", "second")
    ]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and "transformers" in json.loads(runs[0].stdout)
